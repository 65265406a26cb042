package ctrlkit

// NameOf returns a short name for a: the combinator's name ("Join",
// "Timeout", …) for a combinator, the description otherwise. Traces use it
// for span names, which should not grow with the workflow.
func NameOf(a Action) string {
	if n, ok := a.(interface{ Name() string }); ok {
		return n.Name()
	}
	return a.Description()
}

// Flatten rewrites a workflow without changing what it does: a join nested
// directly in a join of the same kind is spliced into its parent
// (Join(Join(a, b), c) becomes Join(a, b, c); likewise JoinOrdered,
// ParallelJoin and Sequential), and a join of one action becomes that
// action. Joins of different kinds are left alone, because they schedule
// differently. Generated or programmatically assembled workflows nest
// deeply; flattening saves a level of bookkeeping (and, for ParallelJoin, a
// goroutine) per nesting, and makes traces shorter.
//
// Every reference to one Shared action in the original refers to one
// rewritten Shared action in the result, so rewrite a workflow as a whole
// rather than piece by piece. Optimize does this and more.
func Flatten(a Action) Action {
	r := rewriter{fn: flattenOne}
	return r.rewrite(a)
}

func flattenOne(a Action) Action {
	j, ok := a.(*joinAction)
	if !ok {
		return a
	}
	var out []Action
	spliced := false
	for _, c := range j.children {
		if cj, ok := c.(*joinAction); ok && cj.kind == j.kind {
			out = append(out, cj.children...)
			spliced = true
			continue
		}
		out = append(out, c)
	}
	if len(out) == 1 && j.kind != kindParallelJoin {
		// ParallelJoin of one already runs inline; for the others a
		// single child's outcome is the join's outcome.
		return out[0]
	}
	if !spliced {
		return a
	}
	return &joinAction{kind: j.kind, children: out}
}

// rewriter applies fn to every action of a workflow, children first.
// Shared actions are rewritten once and fn is not applied to them, so that
// sharing survives the rewrite.
type rewriter struct {
	fn     func(Action) Action
	shared map[*sharedAction]Action
	// dropNopShared turns a Shared whose rewritten action is Nop into Nop.
	dropNopShared bool
}

func (r *rewriter) rewrite(a Action) Action {
	// Composites are always rebuilt: comparing the old and new children
	// to skip a rebuild is not possible in general, because an
	// ActionFunc is a func and comparing funcs panics.
	if s, ok := a.(*sharedAction); ok {
		if done, ok := r.shared[s]; ok {
			return done
		}
		if r.shared == nil {
			r.shared = map[*sharedAction]Action{}
		}
		var out Action = &sharedAction{child: r.rewrite(s.child)}
		if r.dropNopShared && isNop(out.(*sharedAction).child) {
			out = Nop()
		}
		r.shared[s] = out
		return out
	}
	if c, ok := a.(Composite); ok {
		kids := c.Children()
		rewritten := make([]Action, len(kids))
		for i, k := range kids {
			rewritten[i] = r.rewrite(k)
		}
		a = c.WithChildren(rewritten)
	}
	return r.fn(a)
}
