package mqttbridge

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	resent prometheus.Counter
	joins  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		resent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "drover_hub_mqtt_resent_total",
			Help: "Hub envelopes published again over MQTT because the agent had not acked them.",
		}),
		joins: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_hub_mqtt_joins_total",
			Help: "Registrations received from joiners over MQTT, by the gRPC code of the hub's answer (OK for approved or pending).",
		}, []string{"code"}),
	}
	if reg != nil {
		reg.MustRegister(m.resent, m.joins)
	}
	return m
}
