package ctrlkit_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/drover-fleet/drover/pkg/ctrlkit"
)

func step(name string, res reconcile.Result, err error) ctrlkit.Action {
	return ctrlkit.NewAction(name, func(context.Context) (reconcile.Result, error) {
		fmt.Println("run", name)
		return res, err
	})
}

func ExampleJoin() {
	wf := ctrlkit.Join(
		step("sync-config", reconcile.Result{RequeueAfter: 30 * time.Second}, nil),
		step("sync-pods", reconcile.Result{RequeueAfter: 5 * time.Second}, nil),
		step("report", reconcile.Result{}, nil),
	)
	res, err := wf.Run(context.Background())
	fmt.Println(res.RequeueAfter, err)
	// Output:
	// run sync-config
	// run sync-pods
	// run report
	// 5s <nil>
}

func ExampleJoin_errors() {
	wf := ctrlkit.Join(
		step("deleting", reconcile.Result{}, ctrlkit.ErrExit),
		step("sync", reconcile.Result{}, errors.New("conflict")),
	)
	_, err := wf.Run(context.Background())
	fmt.Println(err, ctrlkit.IsExit(err))
	// Output:
	// run deleting
	// run sync
	// conflict false
}

func ExampleSequential() {
	wf := ctrlkit.Sequential(
		step("ensure-secret", reconcile.Result{}, nil),
		step("wait-for-pod", reconcile.Result{RequeueAfter: 10 * time.Second}, nil),
		step("mark-ready", reconcile.Result{}, nil),
	)
	res, err := wf.Run(context.Background())
	fmt.Println(res.RequeueAfter, err)
	// Output:
	// run ensure-secret
	// run wait-for-pod
	// 10s <nil>
}

func ExampleParallelJoin() {
	wf := ctrlkit.ParallelJoin(
		ctrlkit.NewAction("a", func(context.Context) (reconcile.Result, error) { return ctrlkit.RequeueAfter(time.Minute) }),
		ctrlkit.NewAction("b", func(context.Context) (reconcile.Result, error) { return ctrlkit.RequeueImmediately() }),
	)
	res, _ := wf.Run(context.Background())
	fmt.Println(res.Requeue, res.RequeueAfter) //nolint:staticcheck // showing the join rule
	// Output: true 1m0s
}

func ExampleIgnoreExit() {
	wf := ctrlkit.Sequential(
		step("check-paused", reconcile.Result{}, fmt.Errorf("paused: %w", ctrlkit.ErrExit)),
		step("sync", reconcile.Result{}, nil),
	)
	res, err := ctrlkit.IgnoreExit(wf.Run(context.Background()))
	fmt.Println(res.IsZero(), err)
	// Output:
	// run check-paused
	// true <nil>
}

func ExampleTimeout() {
	stuck := ctrlkit.NewAction("stuck", func(ctx context.Context) (reconcile.Result, error) {
		<-ctx.Done()
		return ctrlkit.RequeueIfError(ctx.Err())
	})
	_, err := ctrlkit.Timeout(10*time.Millisecond, stuck).Run(context.Background())
	fmt.Println(err, errors.Is(err, ctrlkit.ErrTimeout))
	// Output: stuck: timed out after 10ms true
}

func ExampleIf() {
	suspended := true
	wf := ctrlkit.Join(
		step("status", reconcile.Result{}, nil),
		ctrlkit.If(!suspended, step("run-next", reconcile.Result{}, nil)),
	)
	_, _ = wf.Run(context.Background())
	// Output: run status
}

func ExampleRetry() {
	attempts := 0
	flaky := ctrlkit.NewAction("update", func(context.Context) (reconcile.Result, error) {
		attempts++
		if attempts < 3 {
			return ctrlkit.RequeueIfError(errors.New("conflict"))
		}
		return ctrlkit.NoRequeue()
	})
	var waits []time.Duration
	opts := ctrlkit.RetryOptions{
		Attempts: 5,
		Sleep: func(_ context.Context, d time.Duration) error {
			waits = append(waits, d)
			return nil
		},
	}
	_, err := ctrlkit.Retry(opts, flaky).Run(context.Background())
	fmt.Println(attempts, waits, err)
	// Output: 3 [100ms 200ms] <nil>
}

func ExampleShared() {
	load := ctrlkit.Shared(step("load-pods", reconcile.Result{}, nil))
	wf := ctrlkit.Join(
		ctrlkit.Sequential(load, step("scale", reconcile.Result{}, nil)),
		ctrlkit.Sequential(load, step("report", reconcile.Result{}, nil)),
	)
	_, _ = wf.Run(ctrlkit.WithSharedScope(context.Background()))
	// Output:
	// run load-pods
	// run scale
	// run report
}

func ExampleFlatten() {
	a := step("a", reconcile.Result{}, nil)
	b := step("b", reconcile.Result{}, nil)
	c := step("c", reconcile.Result{}, nil)
	fmt.Println(ctrlkit.Flatten(ctrlkit.Join(ctrlkit.Join(a, b), ctrlkit.Join(c))).Description())
	// Output: Join(a, b, c)
}

func ExampleInstrument() {
	obs := ctrlkit.ObserverFunc(func(ctx context.Context, a ctrlkit.Action) (context.Context, func(ctrlkit.Report)) {
		return ctx, func(r ctrlkit.Report) { fmt.Println("observed", r.Name, r.Outcome) }
	})
	wf := ctrlkit.Instrument(ctrlkit.Sequential(
		step("a", reconcile.Result{}, nil),
		step("b", reconcile.Result{RequeueAfter: time.Second}, nil),
	), ctrlkit.InstrumentOptions{Observer: obs})
	_, _ = wf.Run(context.Background())
	// Output:
	// run a
	// observed a noRequeue
	// run b
	// observed b requeueAfter
	// observed Sequential requeueAfter
}

func ExampleReconcile() {
	paused := true
	wf := ctrlkit.Join(
		step("sync", reconcile.Result{RequeueAfter: time.Minute}, nil),
		ctrlkit.Sequential(ctrlkit.ExitIf(paused), step("scale", reconcile.Result{}, nil)),
		step("status", reconcile.Result{}, errors.New("conflict")),
	)
	// The error wins: controller-runtime retries it with backoff and
	// would ignore the requeue beside it.
	res, err := ctrlkit.Reconcile(context.Background(), wf)
	fmt.Println(res.IsZero(), err)
	// Output:
	// run sync
	// run status
	// true conflict
}

func ExampleParallel() {
	done := make(chan struct{})
	wf := ctrlkit.Sequential(
		ctrlkit.Parallel(ctrlkit.NewAction("announce", func(ctx context.Context) (reconcile.Result, error) {
			<-done // runs while the workflow goes on
			fmt.Println("run announce")
			return ctrlkit.NoRequeue()
		})),
		ctrlkit.NewAction("sync", func(context.Context) (reconcile.Result, error) {
			fmt.Println("run sync")
			close(done)
			return ctrlkit.NoRequeue()
		}),
	)
	// Reconcile returns once announce has finished too.
	_, err := ctrlkit.Reconcile(context.Background(), wf)
	fmt.Println("reconciled", err)
	// Output:
	// run sync
	// run announce
	// reconciled <nil>
}

func ExampleOptimize() {
	suspended := false
	a, b := step("a", reconcile.Result{}, nil), step("b", reconcile.Result{}, nil)
	wf := ctrlkit.Sequential(
		ctrlkit.Sequential(a, ctrlkit.ExitIf(suspended)),
		ctrlkit.Timeout(time.Minute, ctrlkit.Join(
			ctrlkit.If(suspended, b),
			ctrlkit.Timeout(10*time.Second, ctrlkit.IfElse(suspended, b, a)),
		)),
	)
	fmt.Println(wf.Description())
	fmt.Println(ctrlkit.Optimize(wf).Description())
	// Output:
	// Sequential(Sequential(a, ExitIf(false)), Timeout(1m0s, Join(If(false, b), Timeout(10s, IfElse(false, b, a)))))
	// Sequential(a, Timeout(10s, a))
}
