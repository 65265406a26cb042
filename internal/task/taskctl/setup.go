package taskctl

import (
	"context"
	"fmt"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	"github.com/drover-fleet/drover/internal/clock"
)

// Options configure the task controllers.
type Options struct {
	// Clock of backoffs and timeouts; nil = the real one.
	Clock clock.Clock
	// DispatchTimeout bounds how long an attempt may stay Scheduled or
	// Dispatching on an Online node. Default 5m.
	DispatchTimeout time.Duration
	// RecorderName names the Events' source. Default drover-manager.
	RecorderName string
	// CreateRetry is how soon a TaskGroup or FleetJob whose Tasks or
	// TaskGroups the API refused asks again. Default 1m.
	CreateRetry time.Duration
}

// Setup registers the FleetJob, TaskGroup and Task controllers, the
// scheduling loop and the Task index they share.
func Setup(mgr ctrl.Manager, opts Options) error {
	if opts.RecorderName == "" {
		opts.RecorderName = "drover-manager"
	}
	registerMetrics()
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &batchv1.Task{}, IndexTaskNode, func(o client.Object) []string {
		if n := o.(*batchv1.Task).Status.NodeName; n != "" {
			return []string{n}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("index Tasks by node: %w", err)
	}
	rec := mgr.GetEventRecorder(opts.RecorderName)
	if err := (&FleetJobReconciler{Client: mgr.GetClient(), Recorder: rec, APIReader: mgr.GetAPIReader(), Clock: opts.Clock,
		CreateRetry: opts.CreateRetry}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up FleetJob controller: %w", err)
	}
	if err := (&TaskGroupReconciler{Client: mgr.GetClient(), Recorder: rec, APIReader: mgr.GetAPIReader(), Clock: opts.Clock,
		CreateRetry: opts.CreateRetry}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up TaskGroup controller: %w", err)
	}
	if err := (&TaskReconciler{Client: mgr.GetClient(), Recorder: rec, Clock: opts.Clock, DispatchTimeout: opts.DispatchTimeout}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up Task controller: %w", err)
	}
	if err := (&Scheduler{Client: mgr.GetClient(), Recorder: rec, Clock: opts.Clock}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up task scheduler: %w", err)
	}
	return nil
}
