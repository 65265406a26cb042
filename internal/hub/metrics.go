package hub

import "github.com/prometheus/client_golang/prometheus"

// metrics are the hub's Prometheus series. They are registered on the
// registerer from Options, never on a global registry.
type metrics struct {
	sessions      prometheus.Gauge
	received      *prometheus.CounterVec
	duplicates    prometheus.Counter
	rejected      *prometheus.CounterVec
	apiWrites     *prometheus.CounterVec
	registrations *prometheus.CounterVec
	renewals      *prometheus.CounterVec
	dispatched    prometheus.Counter
	acked         prometheus.Counter
	batchItems    prometheus.Histogram
	resyncs       prometheus.Counter
	unrouted      prometheus.Counter
	foreign       *prometheus.CounterVec
	tokensRefused prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "drover_hub_sessions", Help: "Agent streams this hub holds.",
		}),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_hub_messages_received_total", Help: "Agent envelopes accepted, by kind.",
		}, []string{"kind"}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "drover_hub_duplicate_messages_total", Help: "Agent envelopes recognised as re-sent (same id or revision) and not applied again.",
		}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_hub_rejected_messages_total", Help: "Agent envelopes rejected, by reason.",
		}, []string{"reason"}),
		apiWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_hub_api_writes_total", Help: "FleetNode writes to the Kubernetes API, by reason.",
		}, []string{"reason"}),
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_hub_registrations_total", Help: "Register calls, by result.",
		}, []string{"result"}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_hub_certificate_renewals_total", Help: "Renew calls, by result (a gRPC code).",
		}, []string{"result"}),
		dispatched: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "drover_hub_dispatched_total", Help: "Work items sent to agents (snapshots count each item).",
		}),
		acked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "drover_hub_acked_envelopes_total", Help: "Hub->agent envelopes agents acknowledged, repeats included (one Ack may settle several).",
		}),
		batchItems: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "drover_hub_dispatch_envelope_items", Help: "Work items per Dispatch envelope sent (more than one only to agents that batch).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 9), // 1 to 256
		}),
		resyncs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "drover_hub_queue_resyncs_total", Help: "Snapshots sent because a node's send queue had filled: what did not fit went out in them.",
		}),
		unrouted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "drover_hub_reports_unrouted_total", Help: "Agent work reports (NodeState entries included) that no hub feature owns, dropped.",
		}),
		foreign: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_hub_reports_foreign_total", Help: "Agent work reports (NodeState entries included) of work the sending node was not given, dropped, by feature.",
		}, []string{"feature"}),
		tokensRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "drover_hub_operator_tokens_refused_total", Help: "Operator API calls refused because they carried a bearer token (an older drover CLI; hubs take certificates only).",
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.sessions, m.received, m.duplicates, m.rejected, m.apiWrites, m.registrations, m.renewals, m.dispatched, m.acked, m.batchItems, m.resyncs, m.unrouted, m.foreign, m.tokensRefused} {
			_ = reg.Register(c) // a second hub in one process (tests) shares the first one's series
		}
	}
	return m
}
