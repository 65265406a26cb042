package ctrlkit

import "context"

// Hooks are the CtrlKit RFC's action lifecycle hooks as two plain
// functions: BeforeAction is called before each action runs and
// AfterAction when it has finished. They are an Observer, so they go where
// observers go:
//
//   - to the generated manager (NewXManager(state, impl, hooks), or the
//     generated reconciler's Hooks field), to see each action the DSL
//     declares, state loading included, and no combinator: one line per
//     action, the shape per-action metrics want;
//   - to Instrument, to see every action of a workflow, combinators too.
//
// For tracing, use ctrlkitotel's observer, which also puts its span in the
// action's context; Observers combines it with Hooks. Both functions may be
// nil, and must be safe for concurrent use (ParallelJoin and Parallel run
// actions concurrently).
type Hooks struct {
	// BeforeAction is called with the action's context and its short
	// name (NameOf: the action's name for a generated action, the
	// combinator's for a combinator).
	BeforeAction func(ctx context.Context, action string)
	// AfterAction is called with the same context and the report: name,
	// description, start, duration, outcome, result, error, panic. It is
	// called for a panicking action too, before the panic goes on.
	AfterAction func(ctx context.Context, r Report)
}

var _ Observer = Hooks{}

// ObserveAction implements Observer.
func (h Hooks) ObserveAction(ctx context.Context, a Action) (context.Context, func(Report)) {
	if h.BeforeAction != nil {
		h.BeforeAction(ctx, NameOf(a))
	}
	return ctx, func(r Report) {
		if h.AfterAction != nil {
			h.AfterAction(ctx, r)
		}
	}
}
