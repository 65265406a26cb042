package ctrlkit

import (
	"context"
	"reflect"
	"strconv"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Action is one step of a reconcile: a unit with a single responsibility
// whose outcome (a reconcile.Result and an error) tells the workqueue what to
// do next. Combinators such as Join and Sequential are Actions too, so a
// whole workflow is an Action and runs with one call to Run.
type Action interface {
	// Description names the action in logs, traces and panic reports. It
	// should be short and stable; combinators derive theirs from their
	// children.
	Description() string
	// Run performs the action. It must honour ctx: when ctx ends, Run
	// should return promptly (Timeout reports a timeout either way, but an
	// action that ignores ctx keeps its goroutine busy).
	Run(ctx context.Context) (reconcile.Result, error)
}

// ActionFunc adapts a plain function to Action. Its description is
// "ActionFunc"; use NewAction to give it a name.
type ActionFunc func(ctx context.Context) (reconcile.Result, error)

var _ Action = ActionFunc(nil)

// Description implements Action.
func (f ActionFunc) Description() string { return "ActionFunc" }

// Run implements Action by calling f.
func (f ActionFunc) Run(ctx context.Context) (reconcile.Result, error) { return f(ctx) }

// NewAction returns an Action with the given description that runs fn. A
// nil fn panics here rather than in the middle of a reconcile.
func NewAction(description string, fn func(ctx context.Context) (reconcile.Result, error)) Action {
	if fn == nil {
		panic("ctrlkit.NewAction: fn of " + strconv.Quote(description) + " is nil")
	}
	return &namedAction{desc: description, fn: fn}
}

// WrapAction is NewAction under the name the CtrlKit RFC uses; generated
// code and ports from the RFC's examples read naturally with it.
func WrapAction(description string, fn func(ctx context.Context) (reconcile.Result, error)) Action {
	return NewAction(description, fn)
}

// Nop returns an action that does nothing and asks for no requeue. If uses
// it for a false condition.
func Nop() Action { return nopAction{} }

type namedAction struct {
	desc string
	fn   func(ctx context.Context) (reconcile.Result, error)
}

var _ Action = (*namedAction)(nil)

func (a *namedAction) Description() string { return a.desc }

func (a *namedAction) Run(ctx context.Context) (reconcile.Result, error) { return a.fn(ctx) }

type nopAction struct{}

var _ Action = nopAction{}

func (nopAction) Description() string { return "Nop" }

func (nopAction) Run(context.Context) (reconcile.Result, error) { return reconcile.Result{}, nil }

// Composite is implemented by actions built from other actions (every
// combinator in this package). Instrument and Flatten use it to walk and
// rebuild a workflow; it is exported so that user-defined combinators can
// take part too.
type Composite interface {
	Action
	// Children returns the direct sub-actions, in order. The caller must
	// not modify the returned slice.
	Children() []Action
	// WithChildren returns a copy of the action with its children replaced
	// by children, which has the same length as Children().
	WithChildren(children []Action) Action
}

// mustActions panics, naming the combinator and the position, when a nil
// action is passed: a nil child is a programming error that would otherwise
// surface as a nil-pointer panic deep inside a reconcile, possibly in
// another goroutine. A typed nil (a nil *T or a nil ActionFunc in the
// interface) is refused too: calling it fails the same way.
func mustActions(combinator string, actions []Action) {
	for i, a := range actions {
		if isNil(a) {
			panic("ctrlkit." + combinator + ": action " + strconv.Itoa(i) + " is nil")
		}
	}
}

func isNil(a Action) bool {
	if a == nil {
		return true
	}
	switch v := reflect.ValueOf(a); v.Kind() {
	case reflect.Pointer, reflect.Func, reflect.Map, reflect.Chan, reflect.Slice, reflect.Interface:
		return v.IsNil()
	default:
		return false
	}
}
