package ctrlkit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// TestReconcileNeverReturnsAResultWithAnError checks what Reconcile (and
// IgnoreExit, which it uses) hands controller-runtime for every kind of
// workflow outcome: an error wins over a requeue, an exit is success.
func TestReconcileNeverReturnsAResultWithAnError(t *testing.T) {
	rows := []struct {
		name  string
		kinds []kind // joined
		want  string
	}{
		{"success", []kind{kNone}, "noRequeue"},
		{"a requeue", []kind{kNow}, "requeue"},
		{"a requeue-after", []kind{kAfter1}, "after 1s"},
		{"an error", []kind{kErr1}, "error: error1"},
		{"an error beside a requeue-after", []kind{kAfter1, kErr1}, "error: error1"},
		{"an error beside a requeue", []kind{kNow, kErr1}, "error: error1"},
		{"an exit", []kind{kExit}, "noRequeue"},
		{"an exit beside a requeue-after keeps the requeue", []kind{kExit, kAfter2}, "after 2s"},
		{"an error beside an exit and a requeue", []kind{kExit, kNow, kErr2}, "error: error2"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			_, as := children(t, row.kinds...)
			wf := Join(as...)
			res, err := Reconcile(t.Context(), wf)
			if got := show(res, err); got != row.want {
				t.Errorf("Reconcile(%s) = %q, want %q", wf.Description(), got, row.want)
			}
			if err != nil && !res.IsZero() {
				t.Errorf("Reconcile(%s) = %+v with %v, want a zero result beside an error", wf.Description(), res, err)
			}
			res, err = IgnoreExit(wf.Run(t.Context()))
			if got := show(res, err); got != row.want {
				t.Errorf("IgnoreExit(%s) = %q, want %q", wf.Description(), got, row.want)
			}
		})
	}
}

func TestReconcileOpensASharedScope(t *testing.T) {
	c := newChild(t, kAfter1)
	s := Shared(c)
	wf := Join(s, s)
	for range 2 {
		if _, err := Reconcile(t.Context(), wf); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.runs.Load(); n != 2 {
		t.Errorf("a Shared action referenced twice ran %d times in two reconciles, want 2", n)
	}
}

// gate is an action that starts, then waits until it is released or its
// context ends, and remembers which.
type gate struct {
	name     string
	started  chan struct{}
	release  chan struct{}
	finished chan struct{}
	result   atomic.Value // string: "released" or the context's error
	once     sync.Once
}

func newGate(t *testing.T, name string) *gate {
	g := &gate{name: name, started: make(chan struct{}), release: make(chan struct{}), finished: make(chan struct{})}
	t.Cleanup(g.open)
	return g
}

func (g *gate) open() { g.once.Do(func() { close(g.release) }) }

func (g *gate) Description() string { return g.name }

func (g *gate) Run(ctx context.Context) (reconcile.Result, error) {
	defer close(g.finished)
	close(g.started)
	select {
	case <-g.release:
		g.result.Store("released")
		return RequeueIfError(errOne) // ignored by Parallel
	case <-ctx.Done():
		g.result.Store(fmt.Sprint(context.Cause(ctx)))
		return RequeueIfError(ctx.Err())
	}
}

// opener is an action that releases g.
func opener(g *gate) Action {
	return NewAction("open "+g.name, func(context.Context) (reconcile.Result, error) {
		g.open()
		return NoRequeue()
	})
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestParallel(t *testing.T) {
	rows := []struct {
		name string
		// wf builds the workflow around g; cancel ends the
		// reconcile's context.
		wf   func(g *gate, cancel context.CancelFunc) Action
		want string // the gate's result
	}{
		{"the workflow goes on without waiting", func(g *gate, _ context.CancelFunc) Action {
			// Were Parallel to wait, g would wait for its opener
			// until the reconcile's context ended.
			return Sequential(Parallel(g), opener(g))
		}, "released"},
		{"it outlives the combinator that started it", func(g *gate, _ context.CancelFunc) Action {
			// Timeout's context ends when it returns; g's must not.
			return Sequential(Timeout(defaultTestTimeout, Parallel(g)), opener(g))
		}, "released"},
		{"it stops with the reconcile's context", func(g *gate, cancel context.CancelFunc) Action {
			return Sequential(Parallel(g), NewAction("cancel", func(context.Context) (reconcile.Result, error) {
				cancel()
				return NoRequeue()
			}))
		}, "context canceled"},
		{"its outcome does not interrupt a sequence", func(g *gate, _ context.CancelFunc) Action {
			return Sequential(Parallel(Sequential(g, newChild(t, kErr1))), newChild(t, kNone), opener(g))
		}, "released"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			g := newGate(t, "gate")
			ctx, cancel := context.WithTimeout(t.Context(), defaultTestTimeout)
			defer cancel()
			wf := row.wf(g, cancel)
			res, err := Reconcile(ctx, wf)
			if row.want == "released" && (err != nil || !res.IsZero()) {
				t.Errorf("Reconcile(%s) = %q, want noRequeue: Parallel's outcome is ignored", wf.Description(), show(res, err))
			}
			// Reconcile waits for what Parallel started: it has
			// finished, no goroutine is left behind.
			if !isClosed(g.finished) {
				t.Fatalf("Reconcile(%s) returned before its Parallel action finished", wf.Description())
			}
			if got := g.result.Load(); got != row.want {
				t.Errorf("Reconcile(%s): the Parallel action ended %v, want %q", wf.Description(), got, row.want)
			}
		})
	}
}

func TestParallelLogsAnErrorItIgnores(t *testing.T) {
	var mu sync.Mutex
	var lines []string
	logger := funcr.New(func(_, args string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, args)
	}, funcr.Options{})
	ctx := logr.NewContext(t.Context(), logger)
	wf := Join(Parallel(newChild(t, kErr1)), Parallel(newChild(t, kExit)), Parallel(newChild(t, kAfter1)))
	if res, err := Reconcile(ctx, wf); err != nil || !res.IsZero() {
		t.Errorf("Reconcile(%s) = %q, want noRequeue", wf.Description(), show(res, err))
	}
	want := []string{`"msg"="parallel action failed; its outcome is ignored" "error"="error1" "action"="error1"`}
	if !slices.Equal(lines, want) {
		t.Errorf("logged %q, want %q (an exit is not a failure)", lines, want)
	}
}

func TestParallelOutsideReconcileRunsInPlace(t *testing.T) {
	c := newChild(t, kErr1)
	a := Parallel(c)
	if got, _ := outcome(t.Context(), a); got != "noRequeue" {
		t.Errorf("%s = %q, want noRequeue", a.Description(), got)
	}
	if n := c.runs.Load(); n != 1 {
		t.Errorf("%s had run its action %d times when it returned, want 1", a.Description(), n)
	}
}

// TestReconcileReraisesParallelPanics checks that a panic in a Parallel
// action reaches the caller of Reconcile, after the workflow and every other
// Parallel action have finished, together with a panic of the workflow.
func TestReconcileReraisesParallelPanics(t *testing.T) {
	rows := []struct {
		name string
		wf   func(g *gate) Action
		want []string
	}{
		{"a Parallel panic", func(g *gate) Action {
			return Join(Parallel(newChild(t, kPanic)), Parallel(g), opener(g))
		}, []string{"panic: boom"}},
		{"the workflow's and Parallel's panics", func(g *gate) Action {
			return Join(Parallel(newChild(t, kBang)), Parallel(g), opener(g), newChild(t, kPanic))
		}, []string{"panic: boom", "bang: bang"}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			g := newGate(t, "gate")
			wf := row.wf(g)
			var p *PanicError
			func() {
				defer func() { p, _ = recover().(*PanicError) }()
				_, _ = Reconcile(t.Context(), wf)
			}()
			if p == nil {
				t.Fatalf("Reconcile(%s) did not panic with a *PanicError", wf.Description())
			}
			var got []string
			for _, q := range append([]*PanicError{p}, p.Also...) {
				got = append(got, fmt.Sprintf("%s: %v", q.Action, q.Value))
			}
			if !slices.Equal(got, row.want) {
				t.Errorf("Reconcile(%s) panicked with %q, want %q", wf.Description(), got, row.want)
			}
			if !isClosed(g.finished) {
				t.Errorf("Reconcile(%s) panicked before its Parallel action finished", wf.Description())
			}
		})
	}
}

func TestReconcileOfAPlainPanicKeepsTheValue(t *testing.T) {
	defer func() {
		if v := recover(); v != "boom" {
			t.Errorf("Reconcile(panic) panicked with %v, want the original value", v)
		}
	}()
	_, _ = Reconcile(t.Context(), newChild(t, kPanic))
}

func TestReconcileErrorsAreTheWorkflows(t *testing.T) {
	_, err := Reconcile(t.Context(), Join(newChild(t, kErr1), newChild(t, kErr2)))
	if !errors.Is(err, errOne) || !errors.Is(err, errTwo) || strings.Count(err.Error(), "error") != 2 {
		t.Errorf("Reconcile(Join(error1, error2)) = %v, want both errors", err)
	}
}
