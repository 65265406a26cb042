package ctrlkit

import (
	"context"
	"testing"
	"time"
)

// TestOptimize checks each rewrite of the optimizer by the workflow's
// description before and after, and that the rewritten workflow has the
// same outcome and runs the same actions.
func TestOptimize(t *testing.T) {
	type leaves struct{ a, b, c, e Action }
	rows := []struct {
		name string
		in   func(l leaves) Action
		want string
	}{
		// Same-kind nesting is spliced.
		{"nested joins are spliced", func(l leaves) Action { return Join(Join(l.a, l.b), l.c) },
			"Join(noRequeue, requeue, requeueAfter 1s)"},
		{"nested sequences are spliced", func(l leaves) Action { return Sequential(l.a, Sequential(l.b, Sequential(l.c))) },
			"Sequential(noRequeue, requeue, requeueAfter 1s)"},
		{"nested ordered joins are spliced", func(l leaves) Action { return JoinOrdered(JoinOrdered(l.a, l.b), l.c) },
			"JoinOrdered(noRequeue, requeue, requeueAfter 1s)"},
		{"nested parallel joins are spliced", func(l leaves) Action { return ParallelJoin(l.a, ParallelJoin(l.b, l.c)) },
			"ParallelJoin(noRequeue, requeue, requeueAfter 1s)"},
		// Different kinds are not.
		{"a join inside a sequence is kept", func(l leaves) Action { return Sequential(l.b, Join(l.a, l.c)) },
			"Sequential(requeue, Join(noRequeue, requeueAfter 1s))"},
		{"a sequence inside a join is kept", func(l leaves) Action { return Join(Sequential(l.b, l.c), l.e) },
			"Join(Sequential(requeue, requeueAfter 1s), error1)"},
		{"a parallel join inside a join is kept", func(l leaves) Action { return Join(ParallelJoin(l.a, l.b), l.c) },
			"Join(ParallelJoin(noRequeue, requeue), requeueAfter 1s)"},
		// Single-action joins are unwrapped.
		{"a join of one is its action", func(l leaves) Action { return Join(l.b) }, "requeue"},
		{"a parallel join of one is its action", func(l leaves) Action { return ParallelJoin(l.e) }, "error1"},
		{"a sequence of one is its action", func(l leaves) Action { return Sequential(l.c) }, "requeueAfter 1s"},
		{"a join of none is Nop", func(leaves) Action { return Join() }, "Nop"},
		{"unwrapping exposes a same-kind join", func(l leaves) Action { return Join(l.a, Sequential(Join(l.b, l.c))) },
			"Join(noRequeue, requeue, requeueAfter 1s)"},
		// No-ops are removed.
		{"Nop is removed from a join", func(l leaves) Action { return Join(l.a, Nop(), l.b) }, "Join(noRequeue, requeue)"},
		{"Nop is removed from a sequence", func(l leaves) Action { return Sequential(Nop(), l.b, Nop(), l.e) },
			"Sequential(requeue, error1)"},
		{"If(false) is a no-op", func(l leaves) Action { return Join(l.a, If(false, l.e), l.b) }, "Join(noRequeue, requeue)"},
		{"ExitIf(false) is a no-op", func(l leaves) Action { return Sequential(ExitIf(false), l.b, l.c) },
			"Sequential(requeue, requeueAfter 1s)"},
		{"ExitIf(true) is kept", func(l leaves) Action { return Sequential(ExitIf(true), l.b) }, "Sequential(ExitIf(true), requeue)"},
		{"a join of no-ops is Nop", func(l leaves) Action { return Sequential(If(false, l.a), Join(Nop(), ExitIf(false))) }, "Nop"},
		{"what wraps a no-op is a no-op", func(l leaves) Action {
			return Join(Timeout(time.Second, Nop()), Retry(RetryOptions{}, Nop()), Shared(Nop()), Parallel(Nop()),
				IfFunc(func(context.Context) bool { return true }, Nop()), l.a)
		}, "noRequeue"},
		// Conditions fixed at build time are resolved.
		{"If(true, a) is a", func(l leaves) Action { return If(true, l.b) }, "requeue"},
		{"IfElse is its branch", func(l leaves) Action { return Join(IfElse(true, l.b, l.e), IfElse(false, l.e, l.c)) },
			"Join(requeue, requeueAfter 1s)"},
		{"IfFunc is kept", func(l leaves) Action { return IfFunc(func(context.Context) bool { return true }, Join(l.b)) },
			"IfFunc(requeue)"},
		// Nested timeouts keep the tightest.
		{"the inner timeout is tighter", func(l leaves) Action { return Timeout(5*time.Second, Timeout(time.Second, l.b)) },
			"Timeout(1s, requeue)"},
		{"the outer timeout is tighter", func(l leaves) Action { return Timeout(time.Second, Timeout(5*time.Second, l.b)) },
			"Timeout(1s, requeue)"},
		{"three timeouts", func(l leaves) Action {
			return Timeout(3*time.Second, Timeout(time.Second, Timeout(2*time.Second, l.b)))
		}, "Timeout(1s, requeue)"},
		{"timeouts around a no-op join", func(l leaves) Action { return Timeout(time.Second, Join(Timeout(2*time.Second, l.b))) },
			"Timeout(1s, requeue)"},
		{"a timeout with something between is kept", func(l leaves) Action {
			return Timeout(time.Second, Retry(RetryOptions{Attempts: 1}, Timeout(2*time.Second, l.b)))
		}, "Timeout(1s, Retry(Timeout(2s, requeue)))"},
		// Parallel.
		{"Parallel(Parallel(a)) is Parallel(a)", func(l leaves) Action { return Parallel(Parallel(l.b)) }, "Parallel(requeue)"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			build := func() (Action, []*child) {
				cs, as := children(t, kNone, kNow, kAfter1, kErr1)
				return row.in(leaves{as[0], as[1], as[2], as[3]}), cs
			}
			in, inKids := build()
			out := Optimize(in)
			if got := out.Description(); got != row.want {
				t.Errorf("Optimize(%s) = %s, want %s", in.Description(), got, row.want)
			}
			want, _ := outcome(WithSharedScope(t.Context()), in)
			same, outKids := build()
			opt := Optimize(same)
			got, _ := outcome(WithSharedScope(t.Context()), opt)
			if got != want {
				t.Errorf("Optimize(%s) = %s ran to %q, want %q as before", in.Description(), opt.Description(), got, want)
			}
			// The same actions ran.
			for i := range inKids {
				if n, m := inKids[i].runs.Load(), outKids[i].runs.Load(); n != m {
					t.Errorf("Optimize(%s) ran action %d %d times, want %d as before", in.Description(), i, m, n)
				}
			}
		})
	}
}

func TestOptimizeKeepsSharing(t *testing.T) {
	c := newChild(t, kAfter1)
	s := Shared(If(true, c))
	in := Join(s, Sequential(Join(s)), Nop())
	out := Optimize(in)
	if got, want := out.Description(), "Join(Shared(requeueAfter 1s), Shared(requeueAfter 1s))"; got != want {
		t.Errorf("Optimize(%s) = %s, want %s", in.Description(), got, want)
	}
	if got, _ := outcome(WithSharedScope(t.Context()), out); got != "after 1s" {
		t.Errorf("%s = %q, want after 1s", out.Description(), got)
	}
	if n := c.runs.Load(); n != 1 {
		t.Errorf("the shared action ran %d times, want once: both references share it after Optimize", n)
	}
}

func TestOptimizeKeepsObservedNops(t *testing.T) {
	var rec recorder
	wf := Optimize(Join(Instrument(Nop(), InstrumentOptions{Observer: &rec}), Nop()))
	if _, err := wf.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	if len(rec.lines) != 1 {
		t.Errorf("the observer saw %q, want the observed Nop to have run", rec.lines)
	}
}
