package ctrlkit

import (
	"context"
	"sync"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// ParallelJoin is Join with every action running in its own goroutine. It
// returns when all of them have returned, with their outcomes joined in
// argument order (so the aggregated error reads the same on every run).
//
// A panic in one action is recovered in its goroutine, the others run to
// completion, then ParallelJoin re-panics in the caller's goroutine with a
// *PanicError for the first panicking action in argument order, carrying
// the others in Also so that none is lost; without this, a panic would crash
// the process instead of reaching controller-runtime's panic recovery.
//
// The actions share ctx and must be safe to run concurrently.
func ParallelJoin(actions ...Action) Action {
	mustActions("ParallelJoin", actions)
	return &joinAction{kind: kindParallelJoin, children: actions}
}

type childOutcome struct {
	res   reconcile.Result
	err   error
	panic *PanicError
}

func runParallel(ctx context.Context, children []Action) (reconcile.Result, error) {
	switch len(children) {
	case 0:
		return NoRequeue()
	case 1:
		// Nothing to overlap with: skip the goroutine but keep the
		// panic semantics.
		return runJoin(ctx, children)
	}
	outcomes := make([]childOutcome, len(children))
	var wg sync.WaitGroup
	for i, c := range children {
		wg.Go(func() {
			o := &outcomes[i]
			o.res, o.err, o.panic = runRecover(ctx, c)
		})
	}
	wg.Wait()

	panics := make([]*PanicError, len(outcomes))
	for i := range outcomes {
		panics[i] = outcomes[i].panic
	}
	if p := joinPanics(panics); p != nil {
		panic(p)
	}
	var j joiner
	for i := range outcomes {
		j.add(outcomes[i].res, outcomes[i].err)
	}
	return j.outcome()
}
