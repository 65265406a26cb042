package ctrlkit

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Outcome classifies how an action ended, for logs, traces and tests.
type Outcome int

const (
	// OutcomeNoRequeue: success, nothing more to do.
	OutcomeNoRequeue Outcome = iota
	// OutcomeRequeue: success, requeue now.
	OutcomeRequeue
	// OutcomeRequeueAfter: success, requeue after a delay.
	OutcomeRequeueAfter
	// OutcomeExit: the workflow was ended early on purpose (ErrExit).
	OutcomeExit
	// OutcomeTimeout: the action ran out of time (ErrTimeout).
	OutcomeTimeout
	// OutcomeError: any other error.
	OutcomeError
	// OutcomePanic: the action panicked.
	OutcomePanic
)

func (o Outcome) String() string {
	switch o {
	case OutcomeNoRequeue:
		return "noRequeue"
	case OutcomeRequeue:
		return "requeue"
	case OutcomeRequeueAfter:
		return "requeueAfter"
	case OutcomeExit:
		return "exit"
	case OutcomeTimeout:
		return "timeout"
	case OutcomeError:
		return "error"
	case OutcomePanic:
		return "panic"
	default:
		return "Outcome(" + strconv.Itoa(int(o)) + ")"
	}
}

// OutcomeOf classifies an action's return values. Errors take precedence
// over the result, as they do for controller-runtime.
func OutcomeOf(res reconcile.Result, err error) Outcome {
	switch {
	case err == nil:
	case IsExit(err):
		return OutcomeExit
	case errors.Is(err, ErrTimeout):
		return OutcomeTimeout
	default:
		return OutcomeError
	}
	switch {
	case res.Requeue: //nolint:staticcheck // Requeue is still honoured
		return OutcomeRequeue
	case res.RequeueAfter > 0:
		return OutcomeRequeueAfter
	default:
		return OutcomeNoRequeue
	}
}

// Report describes one finished run of an action.
type Report struct {
	// Name is NameOf(action): short, for span names and log keys.
	Name string
	// Description is the action's description.
	Description string
	// Start is when the action started and Duration how long it ran,
	// by InstrumentOptions.Now.
	Start    time.Time
	Duration time.Duration
	// Outcome classifies the result; Result and Err are what the action
	// returned (both zero if it panicked).
	Outcome Outcome
	Result  reconcile.Result
	Err     error
	// Panic is set when the action panicked; the panic continues after
	// the observer has seen it.
	Panic *PanicError
}

// Observer watches actions run. ObserveAction is called before the action
// runs; it returns the context to run the action with (a tracer puts its
// span there, so that spans nest like the workflow) and a function that is
// called once with the report when the action has finished. Observers must
// be safe for concurrent use: ParallelJoin runs children concurrently.
type Observer interface {
	ObserveAction(ctx context.Context, a Action) (context.Context, func(Report))
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(ctx context.Context, a Action) (context.Context, func(Report))

var _ Observer = ObserverFunc(nil)

// ObserveAction implements Observer by calling f.
func (f ObserverFunc) ObserveAction(ctx context.Context, a Action) (context.Context, func(Report)) {
	return f(ctx, a)
}

// Observers combines observers: each sees every action, in order at the
// start and in reverse order at the end, like nested defers. Nil observers
// are left out; with none left the result is nil, which Instrument and
// Observe take as "observe nothing".
func Observers(obs ...Observer) Observer {
	obs = slices.DeleteFunc(slices.Clone(obs), func(o Observer) bool { return o == nil })
	switch len(obs) {
	case 0:
		return nil
	case 1:
		return obs[0]
	}
	return ObserverFunc(func(ctx context.Context, a Action) (context.Context, func(Report)) {
		ends := make([]func(Report), len(obs))
		for i, o := range obs {
			ctx, ends[i] = o.ObserveAction(ctx, a)
		}
		return ctx, func(r Report) {
			for i := len(ends) - 1; i >= 0; i-- {
				ends[i](r)
			}
		}
	})
}

// InstrumentOptions configures Instrument and Observe.
type InstrumentOptions struct {
	// Observer sees every action. Nil leaves the workflow unchanged.
	Observer Observer
	// Now reads the clock for Report.Start and Duration. Nil means
	// time.Now; tests pass a fake.
	Now func() time.Time
}

// Instrument returns the workflow with every action in it, combinators
// included, reporting to opts.Observer: the action code does not change,
// only the tree around it. Shared actions are observed once per run (not
// once per reference), as the action inside them. Apply Instrument to the
// whole workflow, after building it.
func Instrument(a Action, opts InstrumentOptions) Action {
	if opts.Observer == nil {
		return a
	}
	r := rewriter{fn: func(a Action) Action {
		if _, ok := a.(*observedAction); ok {
			// Already observed (a generated manager's hooks): its
			// child has just been wrapped, wrapping it again would
			// report the action twice.
			return a
		}
		return Observe(a, opts)
	}}
	return r.rewrite(a)
}

// Observe wraps only a (not its children) so that it reports to
// opts.Observer.
func Observe(a Action, opts InstrumentOptions) Action {
	if opts.Observer == nil {
		return a
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &observedAction{child: a, opts: opts}
}

type observedAction struct {
	child Action
	opts  InstrumentOptions
}

var _ Composite = (*observedAction)(nil)

// Name and Description are the observed action's: observing is invisible.
func (a *observedAction) Name() string        { return NameOf(a.child) }
func (a *observedAction) Description() string { return a.child.Description() }

func (a *observedAction) Children() []Action { return []Action{a.child} }

func (a *observedAction) WithChildren(children []Action) Action {
	mustActions("Observe", children)
	return &observedAction{child: children[0], opts: a.opts}
}

func (a *observedAction) Run(ctx context.Context) (res reconcile.Result, err error) {
	ctx, end := a.opts.Observer.ObserveAction(ctx, a.child)
	start := a.opts.Now()
	report := Report{Name: NameOf(a.child), Description: a.child.Description(), Start: start}
	finished := false
	defer func() {
		report.Duration = a.opts.Now().Sub(start)
		if finished {
			report.Result, report.Err, report.Outcome = res, err, OutcomeOf(res, err)
			end(report)
			return
		}
		v := recover()
		if v == nil {
			// runtime.Goexit: nothing to re-raise, and the
			// action did not return.
			report.Outcome, report.Err = OutcomeError, errGoexit
			end(report)
			return
		}
		report.Outcome = OutcomePanic
		report.Panic = asPanicError(a.child, v)
		end(report)
		// Re-raise the original value: observing must not change
		// what the action does. The stack of the original panic is
		// still below us, so outer recoverers still see it.
		panic(v)
	}()
	res, err = a.child.Run(ctx)
	finished = true
	return res, err
}

var errGoexit = errors.New("ctrlkit: action called runtime.Goexit")

// LogObserver logs every action's start and end with logr: the end line has
// the outcome, the duration, the requeue delay and the error if any.
type LogObserver struct {
	// Logger receives the lines. The zero Logger means the logger in the
	// action's context (logr.FromContextOrDiscard), which is where
	// controller-runtime puts the per-reconcile logger.
	Logger logr.Logger
	// Level is the logr verbosity (Logger.V(Level)). Per-action lines are
	// debugging detail; 1 or more keeps them out of default output.
	Level int
}

var _ Observer = LogObserver{}

// ObserveAction implements Observer.
func (o LogObserver) ObserveAction(ctx context.Context, a Action) (context.Context, func(Report)) {
	logger := o.Logger
	if logger.GetSink() == nil {
		logger = logr.FromContextOrDiscard(ctx)
	}
	logger = logger.V(o.Level)
	if !logger.Enabled() {
		return ctx, func(Report) {}
	}
	name := NameOf(a)
	logger.Info("action started", "action", name)
	return ctx, func(r Report) {
		kv := []any{"action", name, "outcome", r.Outcome.String(), "duration", r.Duration}
		if r.Result.RequeueAfter > 0 {
			kv = append(kv, "requeueAfter", r.Result.RequeueAfter)
		}
		switch {
		case r.Panic != nil:
			kv = append(kv, "panic", r.Panic.Value)
		case r.Err != nil:
			// Info rather than Error: the reconcile's error is
			// logged once by controller-runtime, and per-action
			// detail belongs at the observer's verbosity.
			kv = append(kv, "error", r.Err.Error())
		}
		logger.Info("action finished", kv...)
	}
}
