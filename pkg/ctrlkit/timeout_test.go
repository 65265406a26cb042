package ctrlkit

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestTimeout(t *testing.T) {
	rows := []struct {
		name     string
		d        time.Duration
		kinds    []kind // joined if more than one
		parallel bool
		want     string
		wantRuns []int
	}{
		{"a fast success passes through", defaultTestTimeout, []kind{kNone}, false, "noRequeue", []int{1}},
		{"a fast requeue-after passes through", defaultTestTimeout, []kind{kAfter2}, false, "after 2s", []int{1}},
		{"a fast error passes through", defaultTestTimeout, []kind{kErr1}, false, "error: error1", []int{1}},
		{"a fast exit passes through", defaultTestTimeout, []kind{kExit}, false, "exit", []int{1}},
		{"a panic is re-raised in the caller", defaultTestTimeout, []kind{kPanic}, false, "panic: boom", []int{1}},
		{"an action that ignores its context is still timed out", shortTimeout, []kind{kSlow}, false,
			"error: slow: timed out after 20ms", []int{1}},
		{"an action that honours its context is timed out with its error", shortTimeout, []kind{kSlowCtx}, false,
			"error: slowCtx: timed out after 20ms", []int{1}},
		{"a join held up by a slow child is timed out", shortTimeout, []kind{kAfter1, kSlow}, false,
			"error: Join(requeueAfter 1s, slow): timed out after 20ms", []int{1, 1}},
		{"a parallel join held up by a slow child is timed out", shortTimeout, []kind{kErr1, kSlow}, true,
			"error: ParallelJoin(error1, slow): timed out after 20ms", []int{1, 1}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			cs, as := children(t, row.kinds...)
			inner := as[0]
			if len(as) > 1 {
				inner = Join(as...)
				if row.parallel {
					inner = ParallelJoin(as...)
				}
			}
			a := Timeout(row.d, inner)
			got, err := outcomeAsync(t, a, false, nil)
			if got != row.want {
				t.Errorf("%s = %q, want %q", a.Description(), got, row.want)
			}
			if row.d < defaultTestTimeout && !(errors.Is(err, ErrTimeout) && errors.Is(err, context.DeadlineExceeded)) {
				t.Errorf("%s = %v, want it to match ErrTimeout and context.DeadlineExceeded", a.Description(), err)
			}
			for _, c := range cs {
				if c.kind == kSlow {
					// The slow child may not have been
					// scheduled yet when the timer fired.
					select {
					case <-c.started:
					case <-time.After(defaultTestTimeout):
					}
				}
			}
			for i, n := range runs(cs) {
				if n != row.wantRuns[i] {
					t.Errorf("%s ran child %d %d times, want %d", a.Description(), i, n, row.wantRuns[i])
				}
			}
		})
	}
}

func TestTimeoutReportsTheParentsCancellation(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	c := newChild(t, kSlow)
	_, err := Timeout(defaultTestTimeout, c).Run(ctx)
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrTimeout) {
		t.Errorf("Timeout(10s, slow) under a cancelled context = %v, want context.Canceled and not a timeout", err)
	}
}
