package mqttbridge_test

// The harness of the MQTT bridge's tests: a real kube-apiserver (testenv), a
// real hub, real agents (agent.Run) over a real broker: the embedded mochi
// broker or a `mosquitto` process with the configuration Drover generates.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/agent"
	"github.com/drover-fleet/drover/internal/agent/mqttclient"
	"github.com/drover-fleet/drover/internal/bootstrap"
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/hub/mqttbridge"
	"github.com/drover-fleet/drover/internal/mqtt/broker"
	"github.com/drover-fleet/drover/internal/mqtt/topics"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/store"
	"github.com/drover-fleet/drover/internal/testenv"
	"github.com/drover-fleet/drover/internal/testkit"
)

// Named timeouts; every wait is bounded by one of them.
const (
	waitTimeout = 30 * time.Second
	stopTimeout = 10 * time.Second
	// settle: how long a test watches for something that must not happen.
	settle = 2 * time.Second
)

var env *testenv.Env

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := fleetv1.AddToScheme(s); err != nil {
		panic(err)
	}
	var stop func()
	env, stop = testenv.StartMain(testenv.Options{Scheme: s})
	testkit.VerifyNoLeaksAfter(m, stop, testkit.IgnorePahoBackoff()...)
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// stack is one test's hub, bridge and broker in its own namespace.
type stack struct {
	kind   string // the broker: "embedded" or "mosquitto"
	t      *testing.T
	c      client.Client
	ns     string
	logs   *syncBuffer
	log    *slog.Logger
	hub    *hub.Hub
	addr   string // the hub's gRPC address (registration)
	ca     *pki.CA
	bridge *mqttbridge.Bridge
	url    string // the broker
	// mosquitto is the config directory of the mosquitto broker, and
	// mosquittoPID the file holding its PID ("" for the embedded broker).
	mosquitto, mosquittoPID string
	layout                  topics.Layout
	works                   *works
	sink                    *sink
	kill                    func()
}

// startStack runs a hub and its bridge against kind's broker: "embedded"
// (mochi, in the bridge) or "mosquitto" (a process). The hub's objects go
// to namespace ns.
func startStack(t *testing.T, kind, ns string) *stack {
	t.Helper()
	return startStackWith(t, kind, ns, nil)
}

// startStackWith is startStack with the bridge's DropFromAgent test hook.
func startStackWith(t *testing.T, kind, ns string, drop func(*agentv1.Envelope) bool) *stack {
	t.Helper()
	return startStackOpts(t, kind, ns, stackOptions{drop: drop})
}

// stackOptions change a stack's defaults.
type stackOptions struct {
	// drop is the bridge's DropFromAgent test hook.
	drop func(*agentv1.Envelope) bool
	// offline is the hub's offline timeout. Default: 20s.
	offline time.Duration
	// hubClock is the hub's clock alone; the bridge keeps the wall clock.
	// Default: the wall clock for both.
	hubClock clock.Clock
	// name is the hub's name, for several hubs in one namespace.
	// Default: the namespace.
	name string
}

// startStackOpts is startStack with o.
func startStackOpts(t *testing.T, kind, ns string, o stackOptions) *stack {
	t.Helper()
	if o.offline == 0 {
		o.offline = 20 * time.Second
	}
	e := testenv.Require(t, env)
	s := &stack{t: t, kind: kind, c: e.Client, ns: ns, logs: &syncBuffer{}, works: &works{}, sink: &sink{}}
	s.log = slog.New(slog.NewTextHandler(s.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("DROVER_TEST_LOGS") != "" {
			t.Logf("logs:\n%s", s.logs.String())
		}
	})
	s.layout, _ = topics.New("")
	name := ns
	if o.name != "" {
		name = o.name
	}
	h, err := hub.New(hub.Options{
		Name: name, Client: e.Client, Namespace: s.ns, ListenAddress: "127.0.0.1:0",
		ServingHosts: []string{"127.0.0.1"}, Features: []hub.Feature{feature{s.works, s.sink}}, Logger: s.log.With("component", "hub"),
		HeartbeatInterval: 2 * time.Second, OfflineTimeout: o.offline, Clock: o.hubClock,
	})
	if err != nil {
		t.Fatal(err)
	}
	s.hub = h
	stopHub := runStoppable(t, "hub", h.Start)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	a, err := h.Addr(ctx)
	if err != nil {
		t.Fatalf("hub did not listen: %v", err)
	}
	s.addr = a.String()
	// The hub signs with the CA Secret (its default signer) once started.
	if s.ca, err = hub.EnsureCA(ctx, s.c, s.ns, time.Now()); err != nil {
		t.Fatal(err)
	}
	opts := mqttbridge.Options{Hub: h, ServingHosts: []string{"127.0.0.1"}, Logger: s.log.With("component", "bridge"), DropFromAgent: o.drop,
		Clock: clock.Real()}
	switch kind {
	case "embedded":
		opts.Listen = "127.0.0.1:0"
	case "mosquitto":
		opts.Broker = s.startMosquitto()
	default:
		t.Fatalf("unknown broker %q", kind)
	}
	if s.bridge, err = mqttbridge.New(opts); err != nil {
		t.Fatal(err)
	}
	stopBridge := runStoppable(t, "bridge", s.bridge.Start)
	// kill stops the bridge (and its broker) and the hub, as a hub's death
	// does.
	s.kill = func() { stopBridge(); stopHub() }
	if s.url, err = s.bridge.BrokerURL(ctx); err != nil {
		t.Fatalf("bridge did not connect to its broker: %v", err)
	}
	return s
}

// run runs start until test cleanup, then checks it returned.
func run(t *testing.T, what string, start func(context.Context) error) {
	runStoppable(t, what, start)
}

// runStoppable is run, whose returned stop ends start earlier (and waits
// for it); cleanup then does nothing more.
func runStoppable(t *testing.T, what string, start func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- start(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("%s: %v", what, err)
				}
			case <-time.After(stopTimeout):
				t.Errorf("%s still running %v after stop", what, stopTimeout)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// startMosquitto runs mosquitto with the generated configuration on a free
// loopback port and returns its URL.
func (s *stack) startMosquitto() string {
	t := s.t
	bin, err := exec.LookPath("mosquitto")
	if err != nil {
		for _, p := range []string{"/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto"} {
			if _, serr := os.Stat(p); serr == nil {
				bin, err = p, nil
			}
		}
	}
	if err != nil {
		t.Fatalf("the mosquitto binary is required for this test and was not found: install it (apt-get install mosquitto; CI installs it): %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cfg := broker.MosquittoConfig{Dir: t.TempDir(), Listen: addr, Hosts: []string{"127.0.0.1"}, Layouts: []topics.Layout{s.layout}}
	if os.Geteuid() == 0 {
		cfg.User = "root" // the test's files are the test user's
	}
	conf, err := broker.WriteMosquitto(s.ca, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The test's spy (spy) may read everything: Mosquitto makes its
	// certificate's common name its client id, so it cannot be the hub's.
	acl, err := os.OpenFile(filepath.Join(cfg.Dir, "acl"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(acl, "\n# The test's spy.\nuser %s\ntopic read %s/#\n", spyCN, s.layout.Prefix)
	if err := acl.Close(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", conf, "-v")
	cmd.Stdout, cmd.Stderr = s.logs, s.logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("start mosquitto: %v", err)
	}
	s.mosquitto, s.mosquittoPID = cfg.Dir, filepath.Join(cfg.Dir, "mosquitto.pid")
	if err := os.WriteFile(s.mosquittoPID, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	testenv.Eventually(t, waitTimeout, "mosquitto listening on "+addr, func(context.Context) (bool, error) {
		select {
		case <-exited:
			return false, fmt.Errorf("mosquitto exited: %s", s.logs.String())
		default:
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false, nil
		}
		c.Close()
		return true, nil
	})
	return "ssl://" + addr
}

// token creates an auto-approving bootstrap token.
func (s *stack) token() string {
	s.t.Helper()
	return s.tokenWith(true)
}

// tokenWith creates a bootstrap token, auto-approving or not.
func (s *stack) tokenWith(autoApprove bool) string {
	s.t.Helper()
	tok, err := bootstrap.Generate()
	if err != nil {
		s.t.Fatal(err)
	}
	tok.AutoApprove = autoApprove
	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	if err := bootstrap.Create(ctx, s.c, s.ns, tok); err != nil {
		s.t.Fatal(err)
	}
	return tok.String()
}

// startAgent runs a real agent for node over MQTT; drop is the client's
// test hook (hub envelopes it loses on purpose).
func (s *stack) startAgent(node string, drop int, runners map[string]agent.Runner) {
	s.t.Helper()
	opts := s.agentOpts(node, drop, runners)
	run(s.t, "agent "+node, func(ctx context.Context) error { return agent.Run(ctx, opts) })
}

// startAgentAsync runs an agent whose end the test checks: Run's result
// arrives on the channel.
func (s *stack) startAgentAsync(node string) <-chan error {
	s.t.Helper()
	opts := s.agentOpts(node, 0, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx, opts) }()
	s.t.Cleanup(cancel)
	return done
}

func (s *stack) agentOpts(node string, drop int, runners map[string]agent.Runner) agent.Options {
	s.t.Helper()
	caFile := filepath.Join(s.t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, s.ca.CertPEM, 0o600); err != nil {
		s.t.Fatal(err)
	}
	log := s.log.With("component", "agent", "node", node)
	opts := agent.Options{
		Node: node, Hubs: []string{s.addr}, BootstrapToken: s.token(), CAFile: caFile, StateDir: s.t.TempDir(),
		Capacity: map[string]string{"cpu": "1"}, Runners: runners, Logger: log,
		Connect: mqttclient.Connector(mqttclient.Options{Broker: s.url, DropDeliveries: drop, Logger: log}),
	}
	return opts
}

// waitOnline waits until node's FleetNode is Online on this hub and its
// session has nothing unacked.
func (s *stack) waitOnline(node string) {
	s.t.Helper()
	testenv.Eventually(s.t, waitTimeout, "node "+node+" Online over MQTT", func(ctx context.Context) (bool, error) {
		var n fleetv1.FleetNode
		if err := s.c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
			return false, nil
		}
		if n.Status.Phase != fleetv1.FleetNodeOnline || n.Status.Hub != s.hub.Name() {
			return false, fmt.Errorf("phase %q hub %q", n.Status.Phase, n.Status.Hub)
		}
		return s.hub.Connected(node), nil
	})
	s.waitSettled(node)
}

// waitSettled waits until node acked everything the hub sent it.
func (s *stack) waitSettled(node string) {
	s.t.Helper()
	testenv.Eventually(s.t, waitTimeout, "node "+node+" acked everything", func(context.Context) (bool, error) {
		if p, u := s.hub.Pending(node), s.bridge.Unacked(node); p+u > 0 {
			return false, fmt.Errorf("%d pending in the hub, %d unacked in the bridge", p, u)
		}
		return true, nil
	})
}

// dispatch adds it to node's work (so snapshots keep it) and sends it.
func (s *stack) dispatch(node string, it *agentv1.WorkItem) {
	s.t.Helper()
	s.works.add(node, it)
	if err := s.hub.Dispatch(node, it); err != nil {
		s.t.Fatal(err)
	}
}

// rawNode registers node through the hub's gRPC Register (as an agent does)
// and returns TLS settings with its certificate, for a raw MQTT client.
func (s *stack) rawNode(node string) *tls.Config {
	s.t.Helper()
	keyPEM, csr, err := pki.NewKeyAndCSR(node)
	if err != nil {
		s.t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(s.ca.Cert)
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13})))
	if err != nil {
		s.t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	resp, err := agentv1.NewAgentHubClient(conn).Register(ctx, &agentv1.RegisterRequest{Node: node, BootstrapToken: s.token(), Csr: csr})
	if err != nil || resp.GetResult() != agentv1.RegisterResponse_RESULT_APPROVED {
		s.t.Fatalf("register %s: %v %s", node, err, resp.GetMessage())
	}
	cert, err := tls.X509KeyPair(pki.EncodeCert(resp.GetCertificate()), keyPEM)
	if err != nil {
		s.t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}

// spyCN is the common name of the test's spy on Mosquitto, which the
// test's ACL lets read every topic.
const spyCN = topics.HubUser + ":spy"

// spy returns the client id and TLS settings of a client with a hub's
// rights to read every topic, beside the hub's own connection: on the
// embedded broker the hub's certificate with another hub client id, on
// Mosquitto (where the common name is the client id) the spy's.
func (s *stack) spy() (string, *tls.Config) {
	s.t.Helper()
	cn := s.layout.HubCN()
	if s.kind == "mosquitto" {
		cn = spyCN
	}
	certPEM, keyPEM, err := broker.ClientCert(s.ca, cn, topics.HubOrganization, time.Now(), time.Hour)
	if err != nil {
		s.t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		s.t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(s.ca.Cert)
	return topics.HubClientID("spy"), &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}

// rawClient connects a plain MQTT client with cfg's identity.
func (s *stack) rawClient(id string, cfg *tls.Config) paho.Client {
	s.t.Helper()
	c := paho.NewClient(paho.NewClientOptions().AddBroker(s.url).SetClientID(id).SetTLSConfig(cfg).
		SetCleanSession(true).SetAutoReconnect(false).SetOrderMatters(false))
	tok := c.Connect()
	if !tok.WaitTimeout(waitTimeout) || tok.Error() != nil {
		s.t.Fatalf("mqtt client %s: connect: %v", id, tok.Error())
	}
	s.t.Cleanup(func() { c.Disconnect(0) })
	return c
}

// recorder collects the messages a raw client receives.
type recorder struct {
	mu  sync.Mutex
	got []string // topics
}

func (r *recorder) handle(_ paho.Client, m paho.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, m.Topic())
}

func (r *recorder) topics() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// sink records what the hub passes to its StatusSink.
type sink struct {
	mu     sync.Mutex
	status []*agentv1.WorkStatus
	nodes  []string
}

func (s *sink) WorkStatus(_ context.Context, node string, st *agentv1.WorkStatus) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status = append(s.status, st)
	s.nodes = append(s.nodes, node)
}

func (s *sink) NodeState(context.Context, string, []*agentv1.WorkStatus) {}

func (s *sink) statuses(node, uid string) []*agentv1.WorkStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*agentv1.WorkStatus
	for i, st := range s.status {
		if s.nodes[i] == node && st.GetUid() == uid {
			out = append(out, st)
		}
	}
	return out
}

func (s *sink) waitPhase(t *testing.T, node, uid, phase string) []*agentv1.WorkStatus {
	t.Helper()
	var got []*agentv1.WorkStatus
	testenv.Eventually(t, waitTimeout, fmt.Sprintf("%s on %s reported %s", uid, node, phase), func(context.Context) (bool, error) {
		got = s.statuses(node, uid)
		if len(got) == 0 {
			return false, nil
		}
		if p := got[len(got)-1].GetPhase(); p != phase {
			return false, fmt.Errorf("phase %s", p)
		}
		return true, nil
	})
	return got
}

// feature is the hub's one feature: works' items and sink's reports, every uid.
type feature struct {
	*works
	*sink
}

var _ hub.Feature = feature{}

func (feature) Name() string     { return "test" }
func (feature) Owns(string) bool { return true }
func (feature) Attach(hub.Link)  {}

// Assigned: every node reports on every uid (the bridge's tests are about
// transport, not about which node owns what).
func (feature) Assigned(context.Context, string, string) bool { return true }

// works is a WorkSource whose items tests set.
type works struct {
	mu    sync.Mutex
	items map[string][]*agentv1.WorkItem
}

func (w *works) WorkFor(_ context.Context, node string) ([]*agentv1.WorkItem, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.items[node]), nil
}

func (w *works) add(node string, it *agentv1.WorkItem) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.items == nil {
		w.items = map[string][]*agentv1.WorkItem{}
	}
	w.items[node] = append(w.items[node], it)
}

// counter is a Runner that counts its runs per uid.
type counter struct {
	mu   sync.Mutex
	runs map[string]int
}

func (c *counter) Run(_ context.Context, w store.Work) (string, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runs == nil {
		c.runs = map[string]int{}
	}
	c.runs[w.UID]++
	return agent.PhaseSucceeded, "counted"
}

func (c *counter) count(uid string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runs[uid]
}
