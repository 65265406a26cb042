package ctrlkit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// RetryOptions configures Retry. The zero value is ready to use: a zero
// field means "unset" and takes its default. A negative field cannot work
// and Retry panics on it.
type RetryOptions struct {
	// Attempts is the total number of runs, the first included. Zero
	// means 3.
	Attempts int
	// InitialBackoff is the wait before the second attempt. Zero means
	// 100ms (or MaxBackoff if that is shorter).
	InitialBackoff time.Duration
	// MaxBackoff caps every wait. Zero means 10s (or InitialBackoff if
	// that is longer); it must not be below InitialBackoff.
	MaxBackoff time.Duration
	// Multiplier grows the wait after each failed attempt. Zero means 2;
	// otherwise it must be at least 1 (1 is a constant wait).
	Multiplier float64
	// Retryable reports whether an error is worth another attempt. Nil
	// means every error except an exit and a reconcile.TerminalError.
	// Exits are never retried, whatever Retryable says.
	Retryable func(err error) bool
	// Sleep waits for d, or until ctx ends and then returns ctx's error.
	// Nil means a real timer; tests pass a fake so that they do not sleep.
	Sleep func(ctx context.Context, d time.Duration) error
}

// withDefaults is the one place where RetryOptions' zero values are
// replaced.
func (o RetryOptions) withDefaults() RetryOptions {
	if o.Attempts == 0 {
		o.Attempts = 3
	}
	if o.InitialBackoff == 0 {
		o.InitialBackoff = 100 * time.Millisecond
		if o.MaxBackoff > 0 {
			o.InitialBackoff = min(o.InitialBackoff, o.MaxBackoff)
		}
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = max(10*time.Second, o.InitialBackoff)
	}
	if o.Multiplier == 0 {
		o.Multiplier = 2
	}
	if o.Retryable == nil {
		o.Retryable = defaultRetryable
	}
	if o.Sleep == nil {
		o.Sleep = sleepContext
	}
	return o
}

// check returns why o cannot work, or "" if it can. o has its defaults.
func (o RetryOptions) check() string {
	switch {
	case o.Attempts < 0:
		return fmt.Sprintf("attempts %d is negative", o.Attempts)
	case o.InitialBackoff < 0:
		return fmt.Sprintf("initial backoff %s is negative", o.InitialBackoff)
	case o.MaxBackoff < o.InitialBackoff:
		return fmt.Sprintf("max backoff %s is below the initial backoff %s", o.MaxBackoff, o.InitialBackoff)
	case !(o.Multiplier >= 1): // NaN too
		return fmt.Sprintf("multiplier %v is below 1", o.Multiplier)
	}
	return ""
}

// Backoff returns the wait before attempt n+1 after n failed attempts
// (n >= 1), with opts' defaults applied.
func (o RetryOptions) Backoff(n int) time.Duration {
	o = o.withDefaults()
	d := float64(o.InitialBackoff)
	for i := 1; i < n; i++ {
		d *= o.Multiplier
		if d >= float64(o.MaxBackoff) {
			return o.MaxBackoff
		}
	}
	return min(time.Duration(d), o.MaxBackoff)
}

func defaultRetryable(err error) bool {
	return !errors.Is(err, reconcile.TerminalError(nil))
}

func sleepContext(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Retry runs action again, with exponential backoff, while it fails with a
// retryable error, up to opts.Attempts runs in all. It is for short blips
// (a conflict on update, a flaky webhook) that are cheaper to retry in
// place than through the workqueue. Only errors are retried: a requeue, an
// exit or a success is returned at once. When the attempts run out, the last
// outcome is returned with its error wrapped as "after N attempts: …"
// (unless N is 1). If
// ctx ends during a wait, the last error is returned joined with ctx's.
// A panic is not recovered.
//
// Options that cannot work (a negative count or wait, a multiplier below
// 1, a cap below the first wait) panic here, naming the field.
func Retry(opts RetryOptions, action Action) Action {
	mustActions("Retry", []Action{action})
	opts = opts.withDefaults()
	if why := opts.check(); why != "" {
		panic("ctrlkit.Retry of " + action.Description() + ": " + why)
	}
	return &retryAction{opts: opts, child: action}
}

type retryAction struct {
	opts  RetryOptions
	child Action
}

var _ Composite = (*retryAction)(nil)

func (a *retryAction) Name() string { return "Retry" }

func (a *retryAction) Description() string {
	return "Retry(" + a.child.Description() + ")"
}

func (a *retryAction) Children() []Action { return []Action{a.child} }

func (a *retryAction) WithChildren(children []Action) Action {
	mustActions("Retry", children)
	return &retryAction{opts: a.opts, child: children[0]}
}

func (a *retryAction) Run(ctx context.Context) (reconcile.Result, error) {
	for n := 1; ; n++ {
		res, err := a.child.Run(ctx)
		if err == nil || IsExit(err) || !a.opts.Retryable(err) {
			return res, err
		}
		if n >= a.opts.Attempts {
			if n == 1 {
				return res, err // nothing was retried
			}
			return res, fmt.Errorf("after %d attempts: %w", n, err)
		}
		if serr := a.opts.Sleep(ctx, a.opts.Backoff(n)); serr != nil {
			return res, errors.Join(err, serr)
		}
	}
}
