package ctrlkit

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// ErrExit ends a workflow early without it being a failure. Sequential stops
// at it, Join carries it up, and IgnoreExit turns it back into success at
// the top of Reconcile. Wrap it to say why: fmt.Errorf("being deleted: %w",
// ErrExit).
var ErrExit = errors.New("ctrlkit: exit")

// RequeueImmediately interrupts the workflow and asks for the request to be
// requeued now (through the workqueue's rate limiter).
func RequeueImmediately() (reconcile.Result, error) {
	// Requeue is deprecated in controller-runtime in favour of
	// RequeueAfter, but it is the only way to say "as soon as the rate
	// limiter allows", which is what the RFC's RequeueImmediately means.
	return reconcile.Result{Requeue: true}, nil //nolint:staticcheck // see above
}

// RequeueAfter interrupts the workflow and asks for the request to be
// requeued after d. A non-positive d is the same as NoRequeue, as it is for
// controller-runtime.
func RequeueAfter(d time.Duration) (reconcile.Result, error) {
	if d <= 0 {
		return reconcile.Result{}, nil
	}
	return reconcile.Result{RequeueAfter: d}, nil
}

// RequeueIfError returns err unchanged, with an empty result: a nil err
// means "carry on", any other interrupts the workflow and is retried by the
// workqueue with backoff.
func RequeueIfError(err error) (reconcile.Result, error) {
	return reconcile.Result{}, err
}

// RequeueIfErrorAndWrap is RequeueIfError with err wrapped as
// "explain: err"; a nil err stays nil.
func RequeueIfErrorAndWrap(explain string, err error) (reconcile.Result, error) {
	if err == nil {
		return reconcile.Result{}, nil
	}
	return reconcile.Result{}, fmt.Errorf("%s: %w", explain, err)
}

// NoRequeue has no effect on the workflow: it is an action's plain success.
func NoRequeue() (reconcile.Result, error) {
	return reconcile.Result{}, nil
}

// Exit interrupts the workflow without a failure; see ErrExit.
func Exit() (reconcile.Result, error) {
	return reconcile.Result{}, ErrExit
}

// IgnoreExit turns an exit into success, keeping the result: use it around
// the workflow at the top of Reconcile (Reconcile does). An error that holds
// a real failure next to an exit is returned unchanged.
//
// It also never returns a requeue next to an error: controller-runtime
// ignores the result then (the error is retried with backoff) and logs a
// warning on every such reconcile, so a real error wins and the result is
// zeroed. After an exit the result is kept, because the exit is gone.
func IgnoreExit(result reconcile.Result, err error) (reconcile.Result, error) {
	switch {
	case err == nil:
		return result, nil
	case IsExit(err):
		return result, nil
	default:
		return reconcile.Result{}, err
	}
}

// IsExit reports whether err is an exit and nothing else: ErrExit, possibly
// wrapped, or an aggregate (errors.Join) made only of exits. An aggregate
// holding any other error is not an exit, so IgnoreExit can never swallow a
// real failure.
func IsExit(err error) bool {
	if err == nil {
		return false
	}
	if err == ErrExit { //nolint:errorlint // identity is the base case of the walk
		return true
	}
	switch x := err.(type) {
	case interface{ Unwrap() []error }:
		errs := x.Unwrap()
		if len(errs) == 0 {
			return false
		}
		for _, e := range errs {
			if !IsExit(e) {
				return false
			}
		}
		return true
	case interface{ Unwrap() error }:
		if inner := x.Unwrap(); inner != nil {
			return IsExit(inner)
		}
	}
	// A leaf with its own Is method may still claim to be ErrExit.
	return errors.Is(err, ErrExit)
}

// Interrupts reports whether an outcome stops a Sequential: any error
// (exit included), an immediate requeue or a requeue after a delay.
func Interrupts(result reconcile.Result, err error) bool {
	return err != nil || result.Requeue || result.RequeueAfter > 0 //nolint:staticcheck // Requeue is still honoured
}

// MergeResults combines two results by the join rules: Requeue is OR-ed and
// the shortest non-zero RequeueAfter wins, so a joined workflow comes back no
// later than any of its parts asked for.
func MergeResults(a, b reconcile.Result) reconcile.Result {
	out := reconcile.Result{Requeue: a.Requeue || b.Requeue} //nolint:staticcheck // Requeue is still honoured
	switch {
	case a.RequeueAfter <= 0:
		out.RequeueAfter = b.RequeueAfter
	case b.RequeueAfter <= 0:
		out.RequeueAfter = a.RequeueAfter
	default:
		out.RequeueAfter = min(a.RequeueAfter, b.RequeueAfter)
	}
	if out.RequeueAfter < 0 {
		out.RequeueAfter = 0
	}
	return out
}

// joiner accumulates outcomes by the join rules. The zero value is ready.
// Errors are kept in two lists so that a real error outranks exit: if any
// real error was seen the exits are dropped, otherwise the exits are
// returned (and IsExit still recognises them).
type joiner struct {
	result reconcile.Result
	errs   []error
	exits  []error
}

func (j *joiner) add(result reconcile.Result, err error) {
	j.result = MergeResults(j.result, result)
	switch {
	case err == nil:
	case IsExit(err):
		j.exits = appendNew(j.exits, err)
	default:
		j.errs = appendNew(j.errs, err)
	}
}

// appendNew appends err unless the very same error is already there: a
// Shared action referenced three times returns one error three times, and
// it should be reported once.
func appendNew(errs []error, err error) []error {
	if reflect.TypeOf(err).Comparable() {
		for _, e := range errs {
			if reflect.TypeOf(e).Comparable() && e == err { //nolint:errorlint // identity wanted
				return errs
			}
		}
	}
	return append(errs, err)
}

func (j *joiner) outcome() (reconcile.Result, error) {
	if len(j.errs) > 0 {
		return j.result, joinErrors(j.errs)
	}
	return j.result, joinErrors(j.exits)
}

// joinErrors is errors.Join except that a single error is returned as is,
// so that one failing child does not change the error's shape.
func joinErrors(errs []error) error {
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	default:
		return errors.Join(errs...)
	}
}

// PanicError is what the combinators that recover panics (Join,
// ParallelJoin, Timeout, Shared, Parallel through Reconcile) re-raise: the
// original value, the action that panicked and the stack where it did,
// which would otherwise be lost when the panic crosses a goroutine.
//
// When several actions of one join panicked, the first (in argument order)
// is the PanicError itself and the others are in Also, so that no panic is
// lost; Error lists them all.
type PanicError struct {
	// Action is the description of the action that panicked.
	Action string
	// Value is the value passed to panic.
	Value any
	// Stack is the stack of the panicking goroutine.
	Stack []byte
	// Also holds the other panics of the same join, in argument order.
	Also []*PanicError

	// first is the panic this one copies, when Also was added to it:
	// joins compare panics by identity.
	first *PanicError
}

func (p *PanicError) Error() string {
	msg := fmt.Sprintf("ctrlkit: action %q panicked: %v\n%s", p.Action, p.Value, p.Stack)
	for i, o := range p.Also {
		msg += fmt.Sprintf("\n(and %d of %d) ctrlkit: action %q panicked: %v\n%s", i+2, len(p.Also)+1, o.Action, o.Value, o.Stack)
	}
	return msg
}

// Unwrap returns the panic values that are errors, this one's first, so
// that errors.Is and errors.As see every panic of the join.
func (p *PanicError) Unwrap() []error {
	var errs []error
	for _, q := range append([]*PanicError{p}, p.Also...) {
		if err, ok := q.Value.(error); ok {
			errs = append(errs, err)
		}
	}
	return errs
}

// joinPanics returns nil for no panic, the panic itself for one, and the
// first with the others in Also for several. Panics that already carry
// others (a nested join's) are flattened, so Also is one level deep. One
// panic is kept once: a Shared action re-raises the same *PanicError for
// every reference.
func joinPanics(ps []*PanicError) *PanicError {
	var flat []*PanicError // the panics as raised, without Also
	var visit func(p *PanicError)
	visit = func(p *PanicError) {
		if p == nil {
			return
		}
		id := p
		if p.first != nil {
			id = p.first
		}
		if !slices.Contains(flat, id) {
			flat = append(flat, id)
		}
		for _, o := range p.Also {
			visit(o)
		}
	}
	for _, p := range ps {
		visit(p)
	}
	switch len(flat) {
	case 0:
		return nil
	case 1:
		return flat[0]
	}
	head := *flat[0]
	head.Also = flat[1:]
	head.first = flat[0]
	return &head
}
