package ctrlkit

import (
	"context"
	"runtime/debug"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Join runs every action, one after the other, and joins their outcomes by
// the join rules (see the package documentation): any requeue wins, the
// shortest requeue-after wins, errors are aggregated, and a real error
// outranks exit. An interruption from one action does not stop the others;
// use Sequential for that.
//
// A panicking action does not stop the others either: Join recovers it,
// runs the rest, then re-panics with a *PanicError for the first panic that
// carries every other one in Also.
//
// Join runs the actions in order today but does not promise to; use
// JoinOrdered when an action relies on the effects of an earlier one.
func Join(actions ...Action) Action {
	mustActions("Join", actions)
	return &joinAction{kind: kindJoin, children: actions}
}

// JoinOrdered is Join with the order of execution guaranteed: each action
// starts after the previous one has finished.
func JoinOrdered(actions ...Action) Action {
	mustActions("JoinOrdered", actions)
	return &joinAction{kind: kindJoinOrdered, children: actions}
}

type joinKind int

const (
	kindJoin joinKind = iota
	kindJoinOrdered
	kindParallelJoin
	kindSequential
)

func (k joinKind) String() string {
	switch k {
	case kindJoin:
		return "Join"
	case kindJoinOrdered:
		return "JoinOrdered"
	case kindParallelJoin:
		return "ParallelJoin"
	default:
		return "Sequential"
	}
}

// joinAction is shared by Join, JoinOrdered, ParallelJoin and Sequential:
// they differ only in how Run schedules the children, and sharing the type
// lets Flatten merge like with like.
type joinAction struct {
	kind     joinKind
	children []Action
}

var _ Composite = (*joinAction)(nil)

func (j *joinAction) Description() string {
	return describe(j.kind.String(), j.children)
}

func (j *joinAction) Children() []Action { return j.children }

func (j *joinAction) WithChildren(children []Action) Action {
	mustActions(j.kind.String(), children)
	return &joinAction{kind: j.kind, children: children}
}

func (j *joinAction) Run(ctx context.Context) (reconcile.Result, error) {
	switch j.kind {
	case kindParallelJoin:
		return runParallel(ctx, j.children)
	case kindSequential:
		return runSequential(ctx, j.children)
	default:
		return runJoin(ctx, j.children)
	}
}

func runJoin(ctx context.Context, children []Action) (reconcile.Result, error) {
	var (
		j      joiner
		panics []*PanicError
	)
	for _, c := range children {
		res, err, p := runRecover(ctx, c)
		if p != nil {
			panics = append(panics, p)
			continue
		}
		j.add(res, err)
	}
	if p := joinPanics(panics); p != nil {
		panic(p)
	}
	return j.outcome()
}

// runRecover runs a, turning a panic into a *PanicError so that a join can
// finish its other children before re-raising it.
//
//lint:ignore ST1008 the panic comes after the error: it is the rarer outcome.
func runRecover(ctx context.Context, a Action) (res reconcile.Result, err error, p *PanicError) {
	defer func() {
		if v := recover(); v != nil {
			p = asPanicError(a, v)
		}
	}()
	res, err = a.Run(ctx)
	return res, err, nil
}

// asPanicError keeps an inner *PanicError as is, so that nested joins report
// the action that really panicked and its stack.
func asPanicError(a Action, v any) *PanicError {
	if p, ok := v.(*PanicError); ok {
		return p
	}
	return &PanicError{Action: a.Description(), Value: v, Stack: debug.Stack()}
}

func describe(name string, children []Action) string {
	var b strings.Builder
	b.WriteString(name)
	b.WriteByte('(')
	for i, c := range children {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(c.Description())
	}
	b.WriteByte(')')
	return b.String()
}

// Name implements the short name used by NameOf.
func (j *joinAction) Name() string { return j.kind.String() }
