package ctrlkit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// fakeSleep records the waits instead of sleeping.
type fakeSleep struct{ waits []time.Duration }

func (f *fakeSleep) sleep(ctx context.Context, d time.Duration) error {
	f.waits = append(f.waits, d)
	return ctx.Err()
}

// script returns an action that returns outcomes[i] on its i-th run and the
// last one after that.
func script(outcomes ...func() (reconcile.Result, error)) (Action, *int) {
	n := 0
	return NewAction("script", func(context.Context) (reconcile.Result, error) {
		i := min(n, len(outcomes)-1)
		n++
		return outcomes[i]()
	}), &n
}

func fail() (reconcile.Result, error) { return RequeueIfError(errOne) }

func TestRetry(t *testing.T) {
	terminal := func() (reconcile.Result, error) { return RequeueIfError(reconcile.TerminalError(errOne)) }
	after := func() (reconcile.Result, error) { return RequeueAfter(d1) }
	rows := []struct {
		name      string
		opts      RetryOptions
		outcomes  []func() (reconcile.Result, error)
		want      string
		wantRuns  int
		wantWaits []time.Duration
	}{
		{"a success is not retried", RetryOptions{}, []func() (reconcile.Result, error){NoRequeue}, "noRequeue", 1, nil},
		{"a requeue is not retried", RetryOptions{}, []func() (reconcile.Result, error){RequeueImmediately}, "requeue", 1, nil},
		{"a requeue-after is not retried", RetryOptions{}, []func() (reconcile.Result, error){after}, "after 1s", 1, nil},
		{"an exit is not retried", RetryOptions{}, []func() (reconcile.Result, error){Exit}, "exit", 1, nil},
		{"a terminal error is not retried", RetryOptions{}, []func() (reconcile.Result, error){terminal},
			"error: terminal error: error1", 1, nil},
		{"an error is retried with exponential backoff", RetryOptions{},
			[]func() (reconcile.Result, error){fail}, "error: after 3 attempts: error1", 3,
			[]time.Duration{100 * time.Millisecond, 200 * time.Millisecond}},
		{"a blip is retried until it clears", RetryOptions{Attempts: 5},
			[]func() (reconcile.Result, error){fail, fail, after}, "after 1s", 3,
			[]time.Duration{100 * time.Millisecond, 200 * time.Millisecond}},
		{"the backoff is capped", RetryOptions{Attempts: 5, InitialBackoff: time.Second, MaxBackoff: 3 * time.Second, Multiplier: 2},
			[]func() (reconcile.Result, error){fail}, "error: after 5 attempts: error1", 5,
			[]time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second}},
		{"Retryable chooses which errors to retry", RetryOptions{Retryable: func(err error) bool { return !errors.Is(err, errOne) }},
			[]func() (reconcile.Result, error){fail}, "error: error1", 1, nil},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			var fs fakeSleep
			row.opts.Sleep = fs.sleep
			inner, n := script(row.outcomes...)
			a := Retry(row.opts, inner)
			if got, _ := outcome(t.Context(), a); got != row.want {
				t.Errorf("%s = %q, want %q", a.Description(), got, row.want)
			}
			if *n != row.wantRuns {
				t.Errorf("%s ran %d times, want %d", a.Description(), *n, row.wantRuns)
			}
			if !slices.Equal(fs.waits, row.wantWaits) {
				t.Errorf("%s waited %v, want %v", a.Description(), fs.waits, row.wantWaits)
			}
		})
	}
}

func TestRetryStopsWhenTheContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	var fs fakeSleep
	inner, n := script(func() (reconcile.Result, error) {
		cancel()
		return fail()
	})
	_, err := Retry(RetryOptions{Attempts: 10, Sleep: fs.sleep}, inner).Run(ctx)
	if !errors.Is(err, errOne) || !errors.Is(err, context.Canceled) || *n != 1 {
		t.Errorf("Retry(script) with ctx cancelled during the wait = %v after %d runs, want error1 and context.Canceled after 1", err, *n)
	}
}

func TestRetryBackoff(t *testing.T) {
	opts := RetryOptions{InitialBackoff: 10 * time.Millisecond, Multiplier: 3, MaxBackoff: time.Second}
	var got []time.Duration
	for n := 1; n <= 6; n++ {
		got = append(got, opts.Backoff(n))
	}
	want := []time.Duration{10 * time.Millisecond, 30 * time.Millisecond, 90 * time.Millisecond, 270 * time.Millisecond, 810 * time.Millisecond, time.Second}
	if !slices.Equal(got, want) {
		t.Errorf("Backoff(1..6) = %v, want %v", got, want)
	}
	if got := fmt.Sprint(RetryOptions{}.Backoff(1)); got != "100ms" {
		t.Errorf("RetryOptions{}.Backoff(1) = %s, want 100ms", got)
	}
}
