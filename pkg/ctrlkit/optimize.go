package ctrlkit

// Optimize is the workflow optimizer of the CtrlKit RFC: it rewrites a
// workflow into a smaller one with the same outcome, so that a workflow
// assembled from conditions and helpers runs (and traces) as what it
// really does. Bottom-up, it
//
//   - splices a join nested directly in a join of the same kind, as
//     Flatten does: Join(Join(a, b), c) is Join(a, b, c), likewise
//     JoinOrdered, ParallelJoin and Sequential. Different kinds are never
//     merged: a Join inside a Sequential would stop at the first
//     interruption, a Sequential inside a Join runs all;
//   - removes no-op actions from joins and sequences (Nop's outcome joins
//     to nothing and never interrupts), and unwraps a join of one action
//     into that action (its outcome is the join's) and a join of none into
//     Nop;
//   - reduces nested timeouts to the tightest:
//     Timeout(5s, Timeout(1s, a)) is Timeout(1s, a);
//   - resolves conditions fixed at build time: If(true, a) is a,
//     If(false, a) and ExitIf(false) are Nop, IfElse(c, a, b) is its branch;
//   - drops what wraps a Nop (Timeout, Retry, Shared, Parallel, IfFunc) and
//     collapses Parallel(Parallel(a)) into Parallel(a).
//
// What changes is the shape (descriptions, spans) and a panic's wrapping:
// a panic in an unwrapped join's only action is no longer wrapped in a
// *PanicError by that join. IfFunc's condition is taken to be a predicate:
// it is not called when its action is a Nop.
//
// Like Flatten, Optimize keeps sharing: every reference to one Shared
// action refers to one rewritten action. Apply it to the whole workflow,
// before Instrument (an observed Nop reports, so it is kept).
func Optimize(a Action) Action {
	r := rewriter{fn: optimizeOne, dropNopShared: true}
	return r.rewrite(a)
}

func isNop(a Action) bool {
	_, ok := a.(nopAction)
	return ok
}

// optimizeOne rewrites one action whose children are already optimized.
func optimizeOne(a Action) Action {
	switch x := a.(type) {
	case *joinAction:
		return optimizeJoin(x)
	case *ifAction:
		switch {
		case x.fixed != nil && *x.fixed:
			return x.child
		case x.fixed != nil, isNop(x.child):
			return Nop()
		}
	case *ifElseAction:
		return x.branch()
	case exitIfAction:
		if !x {
			return Nop()
		}
	case *timeoutAction:
		if isNop(x.child) {
			return Nop()
		}
		if inner, ok := x.child.(*timeoutAction); ok {
			// The inner child is optimized: not a timeout.
			return &timeoutAction{d: min(x.d, inner.d), child: inner.child}
		}
	case *retryAction:
		if isNop(x.child) {
			return Nop()
		}
	case *parallelAction:
		if isNop(x.child) {
			return Nop()
		}
		if _, ok := x.child.(*parallelAction); ok {
			return x.child
		}
	}
	return a
}

func optimizeJoin(j *joinAction) Action {
	out := make([]Action, 0, len(j.children))
	for _, c := range j.children {
		if isNop(c) {
			continue
		}
		if cj, ok := c.(*joinAction); ok && cj.kind == j.kind {
			// cj is optimized: none of its children is a Nop or a
			// join of this kind.
			out = append(out, cj.children...)
			continue
		}
		out = append(out, c)
	}
	switch len(out) {
	case 0:
		return Nop()
	case 1:
		return out[0]
	}
	return &joinAction{kind: j.kind, children: out}
}
