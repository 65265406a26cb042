// Command ctrlkit measures what Join and ParallelJoin cost over running the
// same 1,000 trivial actions directly, and prints the figures with their
// ratio to the direct run (the baseline, measured in the same process).
//
//	go run ./bench/ctrlkit [-n 1000] [-benchtime 1s]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/drover-fleet/drover/pkg/ctrlkit"
)

func main() {
	n := flag.Int("n", 1000, "actions per workflow")
	benchtime := flag.Duration("benchtime", time.Second, "time per measurement")
	flag.Parse()
	testing.Init()
	if err := flag.Set("test.benchtime", benchtime.String()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}

	actions := make([]ctrlkit.Action, *n)
	for i := range actions {
		// Trivial but not free: the compiler cannot drop it, and the
		// results vary so that the join has something to merge.
		d := time.Duration(i%7+1) * time.Second
		actions[i] = ctrlkit.NewAction("trivial", func(context.Context) (reconcile.Result, error) {
			return ctrlkit.RequeueAfter(d)
		})
	}
	ctx := context.Background()
	var sink reconcile.Result

	direct := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for _, a := range actions {
				res, _ := a.Run(ctx)
				sink = res
			}
		}
	})
	run := func(wf ctrlkit.Action) testing.BenchmarkResult {
		return testing.Benchmark(func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				res, _ := wf.Run(ctx)
				sink = res
			}
		})
	}
	rows := []struct {
		name string
		r    testing.BenchmarkResult
	}{
		{"direct", direct},
		{"Join", run(ctrlkit.Join(actions...))},
		{"JoinOrdered", run(ctrlkit.JoinOrdered(actions...))},
		{"Sequential", run(ctrlkit.Sequential(noRequeue(*n)...))},
		{"ParallelJoin", run(ctrlkit.ParallelJoin(actions...))},
	}
	_ = sink

	fmt.Printf("ctrlkit overhead, %d trivial actions per run, GOMAXPROCS=%d, %s %s/%s\n\n",
		*n, runtime.GOMAXPROCS(0), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	fmt.Printf("%-14s %14s %14s %12s %10s %14s\n", "workflow", "ns/run", "ns/action", "allocs/run", "B/run", "ratio to direct")
	base := float64(direct.NsPerOp())
	for _, row := range rows {
		ns := float64(row.r.NsPerOp())
		fmt.Printf("%-14s %14.0f %14.1f %12d %10d %13.2fx\n",
			row.name, ns, ns/float64(*n), row.r.AllocsPerOp(), row.r.AllocedBytesPerOp(), ns/base)
	}
}

// noRequeue returns n actions that do not interrupt, so that Sequential
// runs them all (with RequeueAfter it would stop at the first).
func noRequeue(n int) []ctrlkit.Action {
	out := make([]ctrlkit.Action, n)
	for i := range out {
		out[i] = ctrlkit.NewAction("trivial", func(context.Context) (reconcile.Result, error) {
			return ctrlkit.NoRequeue()
		})
	}
	return out
}
