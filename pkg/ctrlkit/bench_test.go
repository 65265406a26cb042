package ctrlkit

import (
	"context"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// The figures that matter are in bench/ctrlkit, which also prints the ratio
// to calling the actions directly; these keep the hot paths under
// `go test -bench` for profiling.

func trivialActions(n int) []Action {
	out := make([]Action, n)
	for i := range out {
		d := time.Duration(i%7+1) * time.Second
		out[i] = NewAction("trivial", func(context.Context) (reconcile.Result, error) { return RequeueAfter(d) })
	}
	return out
}

func BenchmarkJoin1000(b *testing.B) {
	wf := Join(trivialActions(1000)...)
	for b.Loop() {
		_, _ = wf.Run(b.Context())
	}
}

func BenchmarkParallelJoin1000(b *testing.B) {
	wf := ParallelJoin(trivialActions(1000)...)
	for b.Loop() {
		_, _ = wf.Run(b.Context())
	}
}

func BenchmarkInstrumentedJoin1000(b *testing.B) {
	obs := ObserverFunc(func(ctx context.Context, _ Action) (context.Context, func(Report)) {
		return ctx, func(Report) {}
	})
	wf := Instrument(Join(trivialActions(1000)...), InstrumentOptions{Observer: obs})
	for b.Loop() {
		_, _ = wf.Run(b.Context())
	}
}
