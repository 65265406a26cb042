package inplacectl

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
)

// Metrics of the in-place update controllers. A nil *Metrics counts
// nothing, so tests and tools need not make one.
type Metrics struct {
	nodeEnds     *prometheus.CounterVec
	nodeDuration *prometheus.HistogramVec
	planEnds     *prometheus.CounterVec
	remediations *prometheus.CounterVec
}

// NewMetrics makes the metrics and registers them with reg (nil: not
// registered). Every result label value is made at once, so a dashboard
// or alert sees zero rather than no series before the first update ends.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		nodeEnds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_inplace_node_updates_total",
			Help: "Nodes whose in-place update ended, by result (updated, aborted, failed).",
		}, []string{"result"}),
		nodeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "drover_inplace_node_update_duration_seconds",
			Help:    "Time from a node's update start to its end, by result.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 14), // 1 s to ~4.5 h
		}, []string{"result"}),
		planEnds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_inplace_plans_total",
			Help: "InPlaceUpdatePlans that ended, by result (updated, aborted, failed).",
		}, []string{"result"}),
		remediations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_nodehealthcheck_remediations_total",
			Help: "Remediations NodeHealthChecks requested, by action (RestartAgent, Reboot, MarkForReplacement, External).",
		}, []string{"action"}),
	}
	for _, r := range []updatev1.UpdateStatus{updatev1.StatusUpdated, updatev1.StatusAborted, updatev1.StatusFailed} {
		m.nodeEnds.WithLabelValues(string(r))
		m.planEnds.WithLabelValues(string(r))
	}
	if reg != nil {
		// A second manager in one process (tests start several) shares
		// the first one's collectors rather than failing.
		m.nodeEnds = register(reg, m.nodeEnds)
		m.nodeDuration = register(reg, m.nodeDuration)
		m.planEnds = register(reg, m.planEnds)
		m.remediations = register(reg, m.remediations)
	}
	return m
}

func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		panic(fmt.Sprintf("register in-place update metrics: %v", err)) // a name clash is a programming error
	}
	return c
}

func (m *Metrics) nodeEnded(result updatev1.UpdateStatus, took time.Duration) {
	if m == nil {
		return
	}
	m.nodeEnds.WithLabelValues(string(result)).Inc()
	if took > 0 {
		m.nodeDuration.WithLabelValues(string(result)).Observe(took.Seconds())
	}
}

func (m *Metrics) planEnded(result updatev1.UpdateStatus) {
	if m == nil {
		return
	}
	m.planEnds.WithLabelValues(string(result)).Inc()
}

func (m *Metrics) remediated(action string) {
	if m == nil {
		return
	}
	m.remediations.WithLabelValues(action).Inc()
}
