package ctrlkit

import (
	"context"
	"errors"
	"slices"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

func TestIf(t *testing.T) {
	for _, k := range allKinds {
		for _, cond := range []bool{true, false} {
			cs, as := children(t, k)
			for _, a := range []Action{
				If(cond, as[0]),
				IfFunc(func(context.Context) bool { return cond }, as[0]),
			} {
				cs[0].runs.Store(0)
				got, _ := outcome(t.Context(), a)
				want, wantRuns := single[k], int32(1)
				if !cond {
					want, wantRuns = "noRequeue", 0
				}
				if got != want {
					t.Errorf("%s = %q, want %q", a.Description(), got, want)
				}
				if n := cs[0].runs.Load(); n != wantRuns {
					t.Errorf("%s ran its action %d times, want %d", a.Description(), n, wantRuns)
				}
			}
		}
	}
}

func TestIfFuncDecidesWhenReached(t *testing.T) {
	ready := false
	c := newChild(t, kNow)
	a := Sequential(
		NewAction("make ready", func(context.Context) (reconcile.Result, error) {
			ready = true
			return NoRequeue()
		}),
		IfFunc(func(context.Context) bool { return ready }, c),
	)
	if got, _ := outcome(t.Context(), a); got != "requeue" {
		t.Errorf("%s = %q, want %q", a.Description(), got, "requeue")
	}
}

func TestIfElse(t *testing.T) {
	for _, k := range allKinds {
		for _, cond := range []bool{true, false} {
			cs, as := children(t, k, kAfter2)
			a := IfElse(cond, as[0], as[1])
			got, _ := outcome(t.Context(), a)
			want, wantRuns := single[k], []int{1, 0}
			if !cond {
				want, wantRuns = "after 2s", []int{0, 1}
			}
			if got != want {
				t.Errorf("%s = %q, want %q", a.Description(), got, want)
			}
			if got := runs(cs); !slices.Equal(got, wantRuns) {
				t.Errorf("%s ran its branches %v times, want %v", a.Description(), got, wantRuns)
			}
		}
	}
}

func TestExitIf(t *testing.T) {
	rows := []struct {
		name     string
		a        func(after Action) Action
		want     string
		wantRuns int32
	}{
		{"ExitIf(true) exits", func(Action) Action { return ExitIf(true) }, "exit", 0},
		{"ExitIf(false) asks for nothing", func(Action) Action { return ExitIf(false) }, "noRequeue", 0},
		{"ExitIf(true) ends a sequence", func(after Action) Action { return Sequential(ExitIf(true), after) }, "exit", 0},
		{"ExitIf(false) lets a sequence go on", func(after Action) Action { return Sequential(ExitIf(false), after) }, "after 1s", 1},
		{"a real error in a join outranks ExitIf", func(after Action) Action { return Join(ExitIf(true), after, newChild(t, kErr1)) },
			"after 1s; error: error1", 1},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			after := newChild(t, kAfter1)
			a := row.a(after)
			got, err := outcome(t.Context(), a)
			if got != row.want {
				t.Errorf("%s = %q, want %q", a.Description(), got, row.want)
			}
			if row.want == "exit" && !errors.Is(err, ErrExit) {
				t.Errorf("%s = %v, want ErrExit", a.Description(), err)
			}
			if n := after.runs.Load(); n != row.wantRuns {
				t.Errorf("%s ran the next action %d times, want %d", a.Description(), n, row.wantRuns)
			}
		})
	}
}
