package mqttbridge_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/agent"
	"github.com/drover-fleet/drover/internal/agent/mqttclient"
	"github.com/drover-fleet/drover/internal/bootstrap"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/testenv"
)

// brokerOnly is a robot's agent options: its hubs are brokers' URLs, it
// registers as a joiner, connects, and renews over MQTT. Every hub
// address it is given is checked to be one of brokers, and counted.
type brokerOnly struct {
	opts      agent.Options
	registers atomic.Int64
	connects  atomic.Int64
	wrong     atomic.Value // a hub address that is not a broker's
}

func (s *stack) brokerOnlyAgent(node, token string, brokers ...string) *brokerOnly {
	s.t.Helper()
	caFile := filepath.Join(s.t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, s.ca.CertPEM, 0o600); err != nil {
		s.t.Fatal(err)
	}
	log := s.log.With("component", "agent", "node", node)
	b := &brokerOnly{}
	isBroker := func(hub string) {
		for _, u := range brokers {
			if hub == u {
				return
			}
		}
		b.wrong.Store(hub)
	}
	connect := mqttclient.Connector(mqttclient.Options{Logger: log})
	register := mqttclient.Registrar(mqttclient.JoinOptions{Logger: log})
	b.opts = agent.Options{
		Node: node, Hubs: brokers, BootstrapToken: token, CAFile: caFile, StateDir: s.t.TempDir(),
		Capacity: map[string]string{"cpu": "1"}, Logger: log, RenewOverSession: true,
		Connect: func(ctx context.Context, hub string, cfg *tls.Config) (agentv1.AgentHubClient, io.Closer, error) {
			b.connects.Add(1)
			isBroker(hub)
			return connect(ctx, hub, cfg)
		},
		Register: func(ctx context.Context, hub string, roots *x509.CertPool, req *agentv1.RegisterRequest) (*agentv1.RegisterResponse, error) {
			b.registers.Add(1)
			isBroker(hub)
			return register(ctx, hub, roots, req)
		},
	}
	return b
}

// check fails the test if the agent was ever given a hub address that is
// not a broker's: it reached the hubs over MQTT only.
func (b *brokerOnly) check(t *testing.T) {
	t.Helper()
	if w := b.wrong.Load(); w != nil {
		t.Errorf("the agent addressed %v, which is not a broker", w)
	}
	if b.registers.Load() == 0 || b.connects.Load() == 0 {
		t.Errorf("registrations %d, connections %d over MQTT; want both", b.registers.Load(), b.connects.Load())
	}
}

// TestRobotRegistersOverMQTTOnly: an agent given only the hub's broker (no
// gRPC address at all) registers with a bootstrap token over MQTT as a
// joiner, waits for an operator's approval, gets its certificate, connects
// as a node and runs work, all over MQTT. The agent's gRPC paths need a
// hub address: it has none, and every address it used was the broker's.
func TestRobotRegistersOverMQTTOnly(t *testing.T) {
	s := startStack(t, "embedded", "mqtt-join")
	node := "robot-1-" + protocol.NewID()[:8]
	a := s.brokerOnlyAgent(node, s.tokenWith(false), s.url)
	for _, h := range a.opts.Hubs {
		if h == s.addr {
			t.Fatal("the agent was given the hub's gRPC address")
		}
	}
	run(t, "agent "+node, func(ctx context.Context) error { return agent.Run(ctx, a.opts) })

	// Registered over MQTT, waiting for approval.
	var n fleetv1.FleetNode
	testenv.Eventually(t, waitTimeout, "FleetNode "+node+" registered, waiting for approval", func(ctx context.Context) (bool, error) {
		if err := s.c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
			return false, nil
		}
		return n.Annotations[fleetv1.AnnotationRegistrationKey] != "", nil
	})
	if n.Spec.Approved {
		t.Fatal("the node was approved without an operator")
	}
	// An operator approves it (as `drover approve` does).
	patch := client.MergeFrom(n.DeepCopy())
	n.Spec.Approved = true
	if err := s.c.Patch(context.Background(), &n, patch); err != nil {
		t.Fatal(err)
	}
	s.waitOnline(node)

	s.dispatch(node, &agentv1.WorkItem{Uid: "w-robot", Type: "noop", Spec: []byte(`{}`)})
	s.sink.waitPhase(t, node, "w-robot", agent.PhaseSucceeded)
	a.check(t)
	if !strings.Contains(s.logs.String(), "registration published over mqtt") {
		t.Error("the agent's log does not show a registration over MQTT")
	}
}

// TestRegistrationAndRenewalOverMQTT: mqttclient.Join gets a certificate
// for an auto-approving token; a bad token, unknown or wrong, gets the one
// error a gRPC Register gives; a node connected with its certificate
// renews it over MQTT, for its own key (the hub's renewal checks, the
// same code as gRPC's Renew).
func TestRegistrationAndRenewalOverMQTT(t *testing.T) {
	s := startStack(t, "embedded", "mqtt-renew")
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	join := mqttclient.JoinOptions{Broker: s.url, RootCAs: s.ca.Pool(), Logger: s.log}

	good := s.token()
	id, _, _ := strings.Cut(good, ".")
	other, err := bootstrap.Generate()
	if err != nil {
		t.Fatal(err)
	}
	for name, tok := range map[string]string{"unknown token": other.String(), "wrong secret": id + "." + other.Secret} {
		_, csr, err := pki.NewKeyAndCSR("bad-" + strings.ReplaceAll(name, " ", "-"))
		if err != nil {
			t.Fatal(err)
		}
		_, err = mqttclient.Join(ctx, join, &agentv1.RegisterRequest{Node: "bad-" + strings.ReplaceAll(name, " ", "-"), BootstrapToken: tok, Csr: csr})
		if status.Code(err) != codes.Unauthenticated || status.Convert(err).Message() != bootstrap.ErrNotValid.Error() {
			t.Errorf("%s: Join = %v, want Unauthenticated %q", name, err, bootstrap.ErrNotValid)
		}
	}

	node := "robot-renew-" + protocol.NewID()[:8]
	keyPEM, csr, err := pki.NewKeyAndCSR(node)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := mqttclient.Join(ctx, join, &agentv1.RegisterRequest{Node: node, BootstrapToken: good, Csr: csr})
	if err != nil || resp.GetResult() != agentv1.RegisterResponse_RESULT_APPROVED {
		t.Fatalf("Join = %v, %v; want approved", resp, err)
	}
	cert, err := tls.X509KeyPair(pki.EncodeCert(resp.GetCertificate()), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	c, err := mqttclient.Dial(ctx, mqttclient.Options{Broker: s.url, Node: node, Logger: s.log,
		TLS: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: s.ca.Pool(), MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	renewed, err := c.Renew(ctx, &agentv1.RenewRequest{Csr: csr})
	if err != nil {
		t.Fatalf("renewal over MQTT: %v", err)
	}
	nc, err := x509.ParseCertificate(renewed.GetCertificate())
	if err != nil {
		t.Fatal(err)
	}
	if pki.KeyFingerprint(nc) != pki.KeyFingerprint(cert.Leaf) || nc.Subject.CommonName != node {
		t.Errorf("renewed certificate is for %q key %s, want %q key %s", nc.Subject.CommonName, pki.KeyFingerprint(nc), node, pki.KeyFingerprint(cert.Leaf))
	}
}

// TestRobotMovesToAnotherHubsBroker: an MQTT-only agent given two hubs'
// brokers moves to the second when its hub dies, and its FleetNode goes
// from hub-a to hub-b (Ready reason MovedHub) without ever being Offline.
func TestRobotMovesToAnotherHubsBroker(t *testing.T) {
	const ns, offline = "mqtt-move", 6 * time.Second
	a := startStackOpts(t, "embedded", ns, stackOptions{name: "hub-a", offline: offline})
	b := startStackOpts(t, "embedded", ns, stackOptions{name: "hub-b", offline: offline})
	node := "robot-move-" + protocol.NewID()[:8]
	ag := a.brokerOnlyAgent(node, a.token(), a.url, b.url)
	run(t, "agent "+node, func(ctx context.Context) error { return agent.Run(ctx, ag.opts) })
	a.waitOnline(node)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	seen := map[fleetv1.FleetNodePhase]int{}
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for ctx.Err() == nil {
			var m fleetv1.FleetNode
			if err := a.c.Get(ctx, client.ObjectKey{Name: node}, &m); err == nil {
				mu.Lock()
				seen[m.Status.Phase]++
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	wentOffline := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return seen[fleetv1.FleetNodeOffline] > 0
	}

	a.kill()
	b.waitOnline(node)
	// Past the offline timeout: hub-a's death must not surface.
	deadline := time.Now().Add(offline + 3*time.Second)
	for time.Now().Before(deadline) && !wentOffline() {
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	<-watched
	if wentOffline() {
		t.Errorf("the node went Offline while moving hubs (phases seen %v)", seen)
	}
	var n fleetv1.FleetNode
	if err := b.c.Get(context.Background(), client.ObjectKey{Name: node}, &n); err != nil {
		t.Fatal(err)
	}
	if r := meta.FindStatusCondition(n.Status.Conditions, fleetv1.ReadyCondition); n.Status.Hub != "hub-b" || r == nil || r.Reason != fleetv1.ReasonMovedHub {
		t.Errorf("node hub %q Ready %+v, want hub-b and reason %s", n.Status.Hub, r, fleetv1.ReasonMovedHub)
	}
	ag.check(t)
	if ag.registers.Load() != 1 {
		t.Errorf("the agent registered %d times, want once (it moves with its certificate)", ag.registers.Load())
	}
}
