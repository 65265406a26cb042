package ctrlkit

import (
	"context"
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
