package ctrlkit

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Sequential runs the actions one by one and stops at the first that
// interrupts the workflow: one that returns an error (exit included), asks
// for an immediate requeue or for a requeue after a delay. That action's
// outcome is returned and the rest do not run. If none interrupts,
// Sequential returns NoRequeue.
//
// A panic is not recovered: it stops the sequence like any interruption and
// propagates unchanged.
func Sequential(actions ...Action) Action {
	mustActions("Sequential", actions)
	return &joinAction{kind: kindSequential, children: actions}
}

func runSequential(ctx context.Context, children []Action) (reconcile.Result, error) {
	for _, c := range children {
		res, err := c.Run(ctx)
		if Interrupts(res, err) {
			return res, err
		}
	}
	return NoRequeue()
}
