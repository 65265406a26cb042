package mqttbridge_test

import (
	"context"
	"crypto/tls"
	"slices"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/fleetnode"
	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/mqtt/broker"
	"github.com/drover-fleet/drover/internal/mqtt/topics"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/testenv"
)

// tryConnect connects node's client id with cfg and disconnects; it
// returns why the broker refused, nil when it admitted it.
func (s *stack) tryConnect(node string, cfg *tls.Config) error {
	s.t.Helper()
	c := paho.NewClient(paho.NewClientOptions().AddBroker(s.url).SetClientID(topics.AgentClientID(node)).SetTLSConfig(cfg).
		SetAutoReconnect(false).SetConnectRetry(false).SetConnectTimeout(waitTimeout))
	tok := c.Connect()
	if !tok.WaitTimeout(waitTimeout) {
		s.t.Fatalf("connect as %s: no answer in %v", node, waitTimeout)
	}
	if tok.Error() != nil {
		return tok.Error()
	}
	c.Disconnect(0)
	return nil
}

// TestMosquittoRefusesARevokedCertificate: an external Mosquitto, which
// knows nothing of keys, refuses a revoked node's certificate once the
// CRL that `drover mqtt crl` writes lists it and Mosquitto re-read it
// (SIGHUP); another node's certificate still connects, and so does the
// hub's bridge.
func TestMosquittoRefusesARevokedCertificate(t *testing.T) {
	s := startStack(t, "mosquitto", "mqtt-crl")
	// Unique per run: a revoked FleetNode stays revoked (go test -count=2).
	revoked, kept := "crl-revoked-"+protocol.NewID()[:8], "crl-kept-"+protocol.NewID()[:8]
	revokedCfg, keptCfg := s.rawNode(revoked), s.rawNode(kept)
	for node, cfg := range map[string]*tls.Config{revoked: revokedCfg, kept: keptCfg} {
		if err := s.tryConnect(node, cfg); err != nil {
			t.Fatalf("%s before the revocation: %v", node, err)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	// Register recorded the serial of the certificate it signed.
	var n fleetv1.FleetNode
	if err := s.c.Get(ctx, client.ObjectKey{Name: revoked}, &n); err != nil {
		t.Fatal(err)
	}
	serial := fleetnode.SerialHex(revokedCfg.Certificates[0].Leaf.SerialNumber)
	if !slices.ContainsFunc(n.Status.Certificates, func(c fleetv1.NodeCertificate) bool {
		return c.Serial == serial && c.Issuer == s.ca.Cert.Subject.CommonName
	}) {
		t.Fatalf("status.certificates %+v, want serial %s of %s", n.Status.Certificates, serial, s.ca.Cert.Subject.CommonName)
	}

	if _, err := hub.RevokeNode(ctx, s.c, s.ns, revoked, time.Now()); err != nil {
		t.Fatal(err)
	}
	var list corev1.ConfigMap
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: hub.RevokedKeysName}, &list); err != nil {
		t.Fatal(err)
	}
	crl, err := hub.CRL([]*pki.CA{s.ca}, &list, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := broker.WriteCRL(s.mosquitto, crl); err != nil {
		t.Fatal(err)
	}
	if _, err := broker.ReloadMosquitto(s.mosquittoPID); err != nil {
		t.Fatal(err)
	}

	// Mosquitto re-reads the file when it handles the signal. The client
	// sees the TLS alert (certificate revoked), or a reset if Mosquitto
	// closed before it read the alert; Mosquitto logs why.
	testenv.Eventually(t, waitTimeout, "Mosquitto refusing the revoked certificate", func(context.Context) (bool, error) {
		return s.tryConnect(revoked, revokedCfg) != nil, nil
	})
	// A connection may pass while Mosquitto has the signal but not yet the
	// file; from the first refusal on, every one is refused.
	if err := s.tryConnect(revoked, revokedCfg); err == nil {
		t.Error("Mosquitto admitted the revoked certificate again")
	}
	testenv.Eventually(t, waitTimeout, "Mosquitto logging the TLS handshake's refusal", func(context.Context) (bool, error) {
		return strings.Contains(s.logs.String(), "certificate verify failed"), nil
	})
	if err := s.tryConnect(kept, keptCfg); err != nil {
		t.Errorf("a node that was not revoked: %v", err)
	}
	// The bridge's own connection is still open, and a new one is admitted.
	id, cfg := s.spy()
	s.rawClient(id, cfg)
}
