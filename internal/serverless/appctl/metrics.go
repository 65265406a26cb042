package appctl

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	serverlessv1 "github.com/drover-fleet/drover/api/serverless/v1alpha1"
)

// Metrics of the Application controller, in controller-runtime's registry
// (served on the manager's metrics endpoint).
var (
	sessionsBound = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "drover_app_sessions_bound_total", Help: "ApplicationSessions the manager bound to an instance (by reconcile or by Open).",
	})
	sessionsEnded = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "drover_app_sessions_ended_total", Help: "ApplicationSessions the manager itself ended, by reason (NoCapacity, ApplicationNotFound, NodeLost, OpenTimeout, …).",
	}, []string{"reason"})
	instancesAdded = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "drover_app_instances_created_total", Help: "Instances the manager added to InstanceSlices.",
	})
	instancesRemoved = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "drover_app_instances_removed_total", Help: "Instances the manager took out of InstanceSlices, by reason.",
	}, []string{"reason"})
)

// registerMetrics adds the metrics when the controller is set up; twice is
// harmless.
func registerMetrics() {
	for _, c := range []prometheus.Collector{sessionsBound, sessionsEnded, instancesAdded, instancesRemoved} {
		if err := metrics.Registry.Register(c); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			panic(err) // a name clash is a programming error
		}
	}
	for _, r := range []string{serverlessv1.ReasonNoCapacity, serverlessv1.ReasonApplicationNotFound, serverlessv1.ReasonApplicationIsDaemon,
		serverlessv1.ReasonNodeLost, serverlessv1.ReasonOpenTimeout, serverlessv1.ReasonInstanceGone} {
		sessionsEnded.WithLabelValues(r)
	}
	for _, r := range []string{RemoveTerminated, RemoveNodeLost, RemoveIdle, RemoveExcess} {
		instancesRemoved.WithLabelValues(r)
	}
}
