package mqttbridge

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	resent prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		resent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "drover_hub_mqtt_resent_total",
			Help: "Hub envelopes published again over MQTT because the agent had not acked them.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.resent)
	}
	return m
}
