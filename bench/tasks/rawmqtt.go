package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/mqtt/broker"
	"github.com/drover-fleet/drover/internal/mqtt/topics"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol"
)

// rawMQTT measures plain QoS 1 publish → receive on the broker at url:
// one publisher with a hub's certificate for prefix and one subscriber with
// node bench-raw's, on that node's dispatch topic, the same envelope bytes
// Drover dispatches, no acks of its own. Messages the broker drops (QoS 1
// queues are bounded) are not waited for: the rate counts what arrived.
// Mosquitto makes a certificate's common name its client id, so on a
// broker the hub shares prefix must be another than the hub's (its
// publisher would disconnect the hub's bridge).
func (r *runner) rawMQTT(ctx context.Context, url, prefix string, n int) (float64, error) {
	var s corev1.Secret
	if err := r.c.Get(ctx, client.ObjectKey{Namespace: "drover-system", Name: hub.CASecretName}, &s); err != nil {
		return 0, fmt.Errorf("read Drover's CA: %w", err)
	}
	ca, err := pki.ParseCA(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return 0, err
	}
	layout, err := topics.New(prefix)
	if err != nil {
		return 0, err
	}
	tlsFor := func(certPEM, keyPEM []byte, err error) (*tls.Config, error) {
		if err != nil {
			return nil, err
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, err
		}
		return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: ca.Pool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}, nil
	}
	hubTLS, err := tlsFor(broker.HubClientCert(ca, layout, time.Now(), time.Hour))
	if err != nil {
		return 0, err
	}
	const node = "bench-raw"
	nodeTLS, err := tlsFor(broker.ClientCert(ca, node, topics.NodeOrganization, time.Now(), time.Hour))
	if err != nil {
		return 0, err
	}
	connect := func(id string, tlsCfg *tls.Config) (paho.Client, error) {
		o := paho.NewClientOptions().AddBroker(url).SetClientID(id).SetTLSConfig(tlsCfg).
			SetCleanSession(true).SetAutoReconnect(false).SetOrderMatters(false).SetMaxResumePubInFlight(1000)
		// The hub may print its ready line just before its broker listens.
		deadline := time.Now().Add(30 * time.Second)
		for {
			c := paho.NewClient(o)
			t := c.Connect()
			if t.WaitTimeout(30*time.Second) && t.Error() == nil {
				return c, nil
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("connect %s to %s: %v", id, url, t.Error())
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	sub, err := connect(topics.AgentClientID(node), nodeTLS)
	if err != nil {
		return 0, err
	}
	defer sub.Disconnect(100)
	pub, err := connect(topics.HubClientID("bench-raw-pub"), hubTLS)
	if err != nil {
		return 0, err
	}
	defer pub.Disconnect(100)
	topic := layout.Dispatch(node)
	var got atomic.Int64
	last := atomic.Int64{}
	if t := sub.Subscribe(topic, 1, func(paho.Client, paho.Message) {
		got.Add(1)
		last.Store(time.Now().UnixNano())
	}); !t.WaitTimeout(10*time.Second) || t.Error() != nil {
		return 0, fmt.Errorf("subscribe: %v", t.Error())
	}
	payload, err := protocol.Encode(sampleDispatch(0))
	if err != nil {
		return 0, err
	}
	began := time.Now()
	// At most 1,000 publishes unanswered, as a client with a bounded
	// in-flight window would.
	window := make(chan paho.Token, 1000)
	done := make(chan error, 1)
	go func() {
		for t := range window {
			if !t.WaitTimeout(30*time.Second) || t.Error() != nil {
				done <- fmt.Errorf("publish: %v", t.Error())
				for range window {
				}
				return
			}
		}
		done <- nil
	}()
	for range n {
		window <- pub.Publish(topic, 1, false, payload)
	}
	close(window)
	if err := <-done; err != nil {
		return 0, err
	}
	// Wait until all arrived, or nothing has for a second.
	deadline := time.Now().Add(2 * time.Minute)
	for got.Load() < int64(n) && time.Now().Before(deadline) {
		if l := last.Load(); l > 0 && time.Since(time.Unix(0, l)) > time.Second {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	received := got.Load()
	if received == 0 {
		return 0, errors.New("raw MQTT: nothing arrived")
	}
	took := time.Unix(0, last.Load()).Sub(began)
	if received < int64(n) {
		logf("raw MQTT on %s: %d of %d QoS 1 messages arrived (the broker dropped the rest)", url, received, n)
	}
	return float64(received) / took.Seconds(), nil
}
