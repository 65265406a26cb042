package taskctl

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
)

// Metrics of the task controllers, in controller-runtime's registry (served
// on the manager's metrics endpoint).
var (
	tasksScheduled = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "drover_tasks_scheduled_total", Help: "Task attempts placed on a node (Pending → Scheduled).",
	})
	tasksUnschedulable = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "drover_tasks_unschedulable_total", Help: "Times a task was found to fit on no node (counted when its reason or message changes, not on every loop).",
	})
	taskRestarts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "drover_task_restarts_total", Help: "Failed attempts followed by another (restartPolicy OnFailure).",
	})
	taskReschedules = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "drover_task_reschedules_total", Help: "Attempts lost with their node (NodeLost) or never started (DispatchTimeout) and made again elsewhere, by reason.",
	}, []string{"reason"})
	tasksFailed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "drover_tasks_failed_total", Help: "Tasks the manager failed for good, by reason (AttemptsExhausted, NodeLost, DispatchTimeout).",
	}, []string{"reason"})
	schedulerPending = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "drover_scheduler_pending_tasks", Help: "Pending tasks due for placement at the last scheduling loop.",
	})
	schedulerNotGranted = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "drover_scheduler_not_granted_tasks", Help: "Pending tasks placed nowhere at the last scheduling loop that the tenancy policy (NodeGrants of their namespace) kept off some or all nodes.",
	})
	schedulerLoop = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "drover_scheduler_loop_duration_seconds", Help: "Duration of one scheduling loop, writes included.",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 8),
	})
)

// registerMetrics adds the metrics to controller-runtime's registry when
// the controllers are set up, so that a process without them (a standalone
// hub) does not serve them at zero. Setting up twice is harmless.
func registerMetrics() {
	for _, c := range []prometheus.Collector{tasksScheduled, tasksUnschedulable, taskRestarts, taskReschedules, tasksFailed, schedulerPending, schedulerNotGranted, schedulerLoop} {
		if err := metrics.Registry.Register(c); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			panic(err) // a name clash is a programming error
		}
	}
	// The reasons exist at zero from the start, so that dashboards and
	// alerts (config/monitoring) find the series before the first failure.
	for _, r := range []string{batchv1.ReasonAttemptsSpent, batchv1.ReasonNodeLost, ReasonDispatchTimeout} {
		tasksFailed.WithLabelValues(r)
	}
	for _, r := range []string{batchv1.ReasonNodeLost, ReasonDispatchTimeout} {
		taskReschedules.WithLabelValues(r)
	}
}
