package ctrlkit

import (
	"context"
	"math"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// TestConstructorsRefuseWhatCannotWork checks that every constructor
// panics at construction, with a message naming the problem, on an argument
// that could only fail later inside a reconcile.
func TestConstructorsRefuseWhatCannotWork(t *testing.T) {
	ok := Nop()
	var nilAction Action
	var nilPtr *child
	var nilFunc ActionFunc
	rows := []struct {
		name  string
		build func() Action
		want  string
	}{
		{"Join with a nil action", func() Action { return Join(ok, nilAction) }, "ctrlkit.Join: action 1 is nil"},
		{"JoinOrdered with a nil action", func() Action { return JoinOrdered(nilAction) }, "ctrlkit.JoinOrdered: action 0 is nil"},
		{"ParallelJoin with a nil action", func() Action { return ParallelJoin(ok, ok, nilAction) }, "ctrlkit.ParallelJoin: action 2 is nil"},
		{"Sequential with a nil action", func() Action { return Sequential(nilAction, ok) }, "ctrlkit.Sequential: action 0 is nil"},
		{"Sequential with a typed nil pointer", func() Action { return Sequential(ok, nilPtr) }, "ctrlkit.Sequential: action 1 is nil"},
		{"Join with a nil ActionFunc", func() Action { return Join(nilFunc) }, "ctrlkit.Join: action 0 is nil"},
		{"If with a nil action", func() Action { return If(true, nilAction) }, "ctrlkit.If: action 0 is nil"},
		{"IfFunc with a nil action", func() Action { return IfFunc(func(context.Context) bool { return true }, nilAction) }, "ctrlkit.IfFunc: action 0 is nil"},
		{"IfFunc with a nil condition", func() Action { return IfFunc(nil, ok) }, "ctrlkit.IfFunc: cond is nil"},
		{"IfElse with a nil then", func() Action { return IfElse(true, nilAction, ok) }, "ctrlkit.IfElse: action 0 is nil"},
		{"IfElse with a nil else", func() Action { return IfElse(true, ok, nilAction) }, "ctrlkit.IfElse: action 1 is nil"},
		{"Parallel with a nil action", func() Action { return Parallel(nilAction) }, "ctrlkit.Parallel: action 0 is nil"},
		{"Shared with a nil action", func() Action { return Shared(nilAction) }, "ctrlkit.Shared: action 0 is nil"},
		{"Timeout with a nil action", func() Action { return Timeout(time.Second, nilAction) }, "ctrlkit.Timeout: action 0 is nil"},
		{"Timeout of zero", func() Action { return Timeout(0, ok) }, "ctrlkit.Timeout: timeout 0s of Nop is not positive"},
		{"Timeout below zero", func() Action { return Timeout(-time.Second, ok) }, "ctrlkit.Timeout: timeout -1s of Nop is not positive"},
		{"Retry with a nil action", func() Action { return Retry(RetryOptions{}, nilAction) }, "ctrlkit.Retry: action 0 is nil"},
		{"Retry with negative attempts", func() Action { return Retry(RetryOptions{Attempts: -1}, ok) },
			"ctrlkit.Retry of Nop: attempts -1 is negative"},
		{"Retry with a negative interval", func() Action { return Retry(RetryOptions{InitialBackoff: -time.Second}, ok) },
			"ctrlkit.Retry of Nop: initial backoff -1s is negative"},
		{"Retry with a cap below the first wait", func() Action {
			return Retry(RetryOptions{InitialBackoff: time.Second, MaxBackoff: time.Millisecond}, ok)
		}, "ctrlkit.Retry of Nop: max backoff 1ms is below the initial backoff 1s"},
		{"Retry with a shrinking multiplier", func() Action { return Retry(RetryOptions{Multiplier: 0.5}, ok) },
			"ctrlkit.Retry of Nop: multiplier 0.5 is below 1"},
		{"Retry with a NaN multiplier", func() Action { return Retry(RetryOptions{Multiplier: math.NaN()}, ok) },
			"ctrlkit.Retry of Nop: multiplier NaN is below 1"},
		{"NewAction with a nil function", func() Action { return NewAction("sync", nil) }, `ctrlkit.NewAction: fn of "sync" is nil`},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			defer func() {
				if v := recover(); v != row.want {
					t.Errorf("panicked with %v, want %q", v, row.want)
				}
			}()
			a := row.build()
			t.Errorf("built %s, want a panic", a.Description())
		})
	}
}

// TestConstructorsAcceptTheirDefaults checks the other side: a zero
// RetryOptions (every default) and a large cap without an initial wait are
// fine.
func TestConstructorsAcceptTheirDefaults(t *testing.T) {
	for _, opts := range []RetryOptions{{}, {Attempts: 1}, {MaxBackoff: time.Millisecond}, {Multiplier: 1}} {
		a := Retry(opts, NewAction("ok", func(context.Context) (reconcile.Result, error) { return NoRequeue() }))
		if _, err := a.Run(t.Context()); err != nil {
			t.Errorf("Retry(%+v, ok) = %v, want success", opts, err)
		}
	}
}
