package ctrlkit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// ErrTimeout is matched (with errors.Is) by the error Timeout returns when
// the action ran out of time. That error also matches
// context.DeadlineExceeded.
var ErrTimeout = errors.New("ctrlkit: action timed out")

// Timeout runs action with a context that ends after d, and returns a
// timeout error (see ErrTimeout) once d has passed, whether or not the
// action has noticed. An action that honours its context returns soon after
// anyway; one that ignores it is left running in its own goroutine, its
// eventual outcome (or panic) discarded, because Go cannot stop it.
//
// A non-positive d panics here: such a timeout could only ever fail, which
// is a bug in the workflow, not something to retry with backoff.
//
// A timeout is a real error, not an exit: the request is retried.
//
// If the action returns in time, its outcome is returned as is, except
// that an error returned after the deadline passed is reported as a timeout
// wrapping that error. A panic in time is re-raised in the caller's
// goroutine as a *PanicError.
func Timeout(d time.Duration, action Action) Action {
	mustActions("Timeout", []Action{action})
	if d <= 0 {
		panic("ctrlkit.Timeout: timeout " + d.String() + " of " + action.Description() + " is not positive")
	}
	return &timeoutAction{d: d, child: action}
}

type timeoutAction struct {
	d     time.Duration
	child Action
}

var _ Composite = (*timeoutAction)(nil)

func (a *timeoutAction) Description() string {
	return "Timeout(" + a.d.String() + ", " + a.child.Description() + ")"
}

func (a *timeoutAction) Children() []Action { return []Action{a.child} }

func (a *timeoutAction) WithChildren(children []Action) Action {
	mustActions("Timeout", children)
	return &timeoutAction{d: a.d, child: children[0]}
}

func (a *timeoutAction) Run(ctx context.Context) (reconcile.Result, error) {
	tctx, cancel := context.WithTimeout(ctx, a.d)
	defer cancel()

	// Buffered so that an action finishing after we gave up does not
	// block its goroutine forever.
	done := make(chan childOutcome, 1)
	go func() {
		var o childOutcome
		o.res, o.err, o.panic = runRecover(tctx, a.child)
		done <- o
	}()

	select {
	case o := <-done:
		return a.finished(ctx, tctx, o)
	case <-tctx.Done():
		// Prefer an outcome that arrived at the same moment.
		select {
		case o := <-done:
			return a.finished(ctx, tctx, o)
		default:
		}
		if err := ctx.Err(); err != nil {
			return reconcile.Result{}, fmt.Errorf("%s: %w", a.child.Description(), context.Cause(ctx))
		}
		return reconcile.Result{}, &TimeoutError{Action: a.child.Description(), After: a.d}
	}
}

func (a *timeoutAction) finished(parent, tctx context.Context, o childOutcome) (reconcile.Result, error) {
	if o.panic != nil {
		panic(o.panic)
	}
	if o.err != nil && parent.Err() == nil && errors.Is(tctx.Err(), context.DeadlineExceeded) {
		te := &TimeoutError{Action: a.child.Description(), After: a.d}
		if !errors.Is(o.err, context.DeadlineExceeded) {
			// Keep what the action said, unless it only repeats
			// our deadline: then the error reads the same whether
			// the action or the timer won the race.
			te.Err = o.err
		}
		return reconcile.Result{}, te
	}
	return o.res, o.err
}

// TimeoutError is returned by Timeout when its action ran out of time. It
// matches ErrTimeout and context.DeadlineExceeded.
type TimeoutError struct {
	// Action is the description of the action that timed out.
	Action string
	// After is the timeout.
	After time.Duration
	// Err is the error the action returned after its deadline, if it
	// returned at all before Timeout gave up on it.
	Err error
}

func (e *TimeoutError) Error() string {
	msg := fmt.Sprintf("%s: timed out after %s", e.Action, e.After)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is makes errors.Is(err, ErrTimeout) and errors.Is(err,
// context.DeadlineExceeded) true.
func (e *TimeoutError) Is(target error) bool {
	return target == ErrTimeout || target == context.DeadlineExceeded //nolint:errorlint // sentinel identity
}

// Unwrap returns the action's own error, if any.
func (e *TimeoutError) Unwrap() error { return e.Err }

// Name implements the short name used by NameOf.
func (a *timeoutAction) Name() string { return "Timeout" }
