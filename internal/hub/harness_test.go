package hub

// The harness of the hub's integration tests: a real kube-apiserver (one per
// package, from testenv), hubs and agents in this process, real gRPC over
// loopback with real TLS.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/agent"
	"github.com/drover-fleet/drover/internal/agent/taskexec"
	"github.com/drover-fleet/drover/internal/bootstrap"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/store"
	"github.com/drover-fleet/drover/internal/testenv"
	"github.com/drover-fleet/drover/internal/testkit"
)

// Named timeouts. Every wait in these tests is bounded by one of them.
const (
	// waitTimeout: something that should happen within a round trip or an
	// agent reconnect (backoff starts at 0.5s and doubles), or a
	// controller's pass. Generous: on a loaded CI machine a round trip
	// through a conflict-retrying writer and a controller took over 20 s.
	waitTimeout = 60 * time.Second
	// stopTimeout: a hub or an agent returning after its context ends.
	stopTimeout = 10 * time.Second
	// callTimeout: one RPC of a raw test client.
	callTimeout = 5 * time.Second
	// settle: how long a test watches for something that must not happen
	// (a second run, a second status).
	settle = time.Second
)

var env *testenv.Env

func testScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := fleetv1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == taskexec.LogShimArg {
		// An agent of these tests re-executed the binary as the log shim
		// of a process it runs (TestAppsThroughHubAndAgent's instances).
		os.Exit(taskexec.RunLogShim(os.Args[2:]))
	}
	ctrllog.SetLogger(logr.Discard()) // the API client logs nothing worth reading here
	var stop func()
	env, stop = testenv.StartMain(testenv.Options{Scheme: testScheme()})
	testkit.VerifyNoLeaksAfter(m, stop)
}

// syncBuffer collects log output of hubs and agents; a failed test prints
// it, and so does every test when DROVER_TEST_LOGS is set.
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

// fixture is one test's corner of the shared API server: its own namespace
// (so its own CA, tokens and Leases) and its own node names.
type fixture struct {
	t      *testing.T
	c      client.Client
	ns     string
	logs   *syncBuffer
	logger *slog.Logger
}

func newFixture(t *testing.T, ns string) *fixture {
	t.Helper()
	e := testenv.Require(t, env)
	f := &fixture{t: t, c: e.Client, ns: ns, logs: &syncBuffer{}}
	f.logger = slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	// Registered first, so it runs last: after every hub and agent stopped.
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("DROVER_TEST_LOGS") != "" {
			t.Logf("hub and agent logs:\n%s", f.logs.String())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	if err := EnsureNamespace(ctx, f.c, ns); err != nil {
		t.Fatal(err)
	}
	return f
}

// token creates an auto-approving bootstrap token.
func (f *fixture) token() string {
	f.t.Helper()
	tok, err := bootstrap.Generate()
	if err != nil {
		f.t.Fatal(err)
	}
	tok.AutoApprove = true
	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	if err := bootstrap.Create(ctx, f.c, f.ns, tok); err != nil {
		f.t.Fatal(err)
	}
	return tok.String()
}

// caPEM returns the CA the fixture's hubs use (it exists once a hub started).
func (f *fixture) caPEM() []byte {
	f.t.Helper()
	var s corev1.Secret
	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	if err := f.c.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: CASecretName}, &s); err != nil {
		f.t.Fatalf("read CA: %v", err)
	}
	return s.Data[corev1.TLSCertKey]
}

func (f *fixture) caFile() string {
	f.t.Helper()
	p := filepath.Join(f.t.TempDir(), "ca.crt")
	if err := os.WriteFile(p, f.caPEM(), 0o600); err != nil {
		f.t.Fatal(err)
	}
	return p
}

// runningHub is a Hub started by startHub.
type runningHub struct {
	*Hub
	addr   string
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// startHub starts a hub with opts completed by the fixture (client,
// namespace, a free loopback port unless ListenAddress is set, a fresh
// metrics registry, the fixture's logger). It stops at test cleanup.
func (f *fixture) startHub(opts Options) *runningHub {
	f.t.Helper()
	opts.Client = f.c
	opts.Namespace = f.ns
	if opts.ListenAddress == "" {
		opts.ListenAddress = "127.0.0.1:0"
	}
	opts.ServingHosts = []string{"127.0.0.1"}
	reg := prometheus.NewRegistry()
	opts.Registerer = reg
	opts.Logger = f.logger
	h, err := New(opts)
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningHub{Hub: h, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- h.Start(ctx) }()
	actx, acancel := context.WithTimeout(context.Background(), waitTimeout)
	defer acancel()
	addr, err := h.Addr(actx)
	if err != nil {
		cancel()
		select {
		case err = <-r.done:
		default:
		}
		f.t.Fatalf("hub %s did not start listening: %v", opts.Name, err)
	}
	r.addr = addr.String()
	f.t.Cleanup(func() { r.stop(f.t) })
	return r
}

// stop stops the hub and waits for Start to return.
func (r *runningHub) stop(t *testing.T) {
	t.Helper()
	r.once.Do(func() {
		r.cancel()
		select {
		case err := <-r.done:
			if err != nil {
				t.Errorf("hub %s: %v", r.Name(), err)
			}
		case <-time.After(stopTimeout):
			t.Errorf("hub %s still running %s after stop", r.Name(), stopTimeout)
		}
	})
}

// counter returns the value of the hub's counter name with the given label
// values (none for a plain counter); 0 if it has not been touched.
func (r *runningHub) counter(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if labelsMatch(m, labels) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func labelsMatch(m *dto.Metric, want []string) bool {
	got := make([]string, 0, len(m.GetLabel()))
	for _, l := range m.GetLabel() {
		got = append(got, l.GetValue())
	}
	return slices.Equal(got, want)
}

// runningAgent is an agent started by startAgent.
type runningAgent struct {
	opts   agent.Options
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// startAgent runs an agent for node against hubs, keeping its state in dir.
// It stops at test cleanup.
func (f *fixture) startAgent(opts agent.Options) *runningAgent {
	f.t.Helper()
	if opts.Logger == nil {
		opts.Logger = f.logger.With("component", "agent")
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &runningAgent{opts: opts, cancel: cancel, done: make(chan error, 1)}
	go func() { a.done <- agent.Run(ctx, opts) }()
	f.t.Cleanup(func() { a.stop(f.t) })
	return a
}

// stop stops the agent and waits for Run to return.
func (a *runningAgent) stop(t *testing.T) {
	t.Helper()
	a.once.Do(func() {
		a.cancel()
		select {
		case err := <-a.done:
			// Stopped while it was still starting (opening its DB, say):
			// that is a stop too, not a failure.
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("agent %s: %v", a.opts.Node, err)
			}
		case <-time.After(stopTimeout):
			t.Errorf("agent %s still running %s after stop", a.opts.Node, stopTimeout)
		}
	})
}

// waitConnected waits until node has a stream open on h.
func waitConnected(t *testing.T, h *runningHub, node string) {
	t.Helper()
	testenv.Eventually(t, waitTimeout, fmt.Sprintf("node %s connected to hub %s", node, h.Name()), func(context.Context) (bool, error) {
		return h.Connected(node), nil
	})
}

// waitReady waits until h has written node's connect: the FleetNode is
// Ready at h. A stream the test ends before then abandons that write.
func (f *fixture) waitReady(h *runningHub, node string) {
	f.t.Helper()
	testenv.Eventually(f.t, waitTimeout, fmt.Sprintf("node %s Ready at hub %s", node, h.Name()), func(ctx context.Context) (bool, error) {
		var n fleetv1.FleetNode
		if err := f.c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
			return false, err
		}
		r := meta.FindStatusCondition(n.Status.Conditions, fleetv1.ReadyCondition)
		if n.Status.Hub != h.Name() || r == nil || r.Status != metav1.ConditionTrue {
			return false, fmt.Errorf("hub %q, Ready %+v", n.Status.Hub, r)
		}
		return true, nil
	})
}

// waitNoPending waits until node has acked everything h sent it.
func waitNoPending(t *testing.T, h *runningHub, node string) {
	t.Helper()
	testenv.Eventually(t, waitTimeout, fmt.Sprintf("node %s acked all of hub %s's messages", node, h.Name()), func(context.Context) (bool, error) {
		if n := h.Pending(node); n != 0 {
			return false, fmt.Errorf("%d unacked", n)
		}
		return true, nil
	})
}

// sink records what hubs pass to their StatusSink. One sink may serve
// several hubs, to count deliveries across a hub restart.
type sink struct {
	mu     sync.Mutex
	status []sinkStatus
	states []sinkState
}

type sinkStatus struct {
	node string
	st   *agentv1.WorkStatus
}

type sinkState struct {
	node string
	work []*agentv1.WorkStatus
}

var _ StatusSink = (*sink)(nil)

func (s *sink) WorkStatus(_ context.Context, node string, st *agentv1.WorkStatus) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status = append(s.status, sinkStatus{node, st})
}

func (s *sink) NodeState(_ context.Context, node string, work []*agentv1.WorkStatus) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.states = append(s.states, sinkState{node, work})
}

// statuses returns the statuses reported for uid, in order.
func (s *sink) statuses(node, uid string) []*agentv1.WorkStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*agentv1.WorkStatus
	for _, r := range s.status {
		if r.node == node && r.st.GetUid() == uid {
			out = append(out, r.st)
		}
	}
	return out
}

// nodeStates counts the NodeState reports of node.
func (s *sink) nodeStates(node string) []sinkState {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []sinkState
	for _, r := range s.states {
		if r.node == node {
			out = append(out, r)
		}
	}
	return out
}

// waitStatus waits until uid's reported phase is phase and returns the statuses so far.
func (s *sink) waitStatus(t *testing.T, node, uid, phase string) []*agentv1.WorkStatus {
	t.Helper()
	var got []*agentv1.WorkStatus
	testenv.Eventually(t, waitTimeout, fmt.Sprintf("work %s on node %s reported %s", uid, node, phase), func(context.Context) (bool, error) {
		got = s.statuses(node, uid)
		if len(got) == 0 {
			return false, nil
		}
		last := got[len(got)-1]
		if last.GetPhase() != phase {
			return false, fmt.Errorf("phase %s (%s)", last.GetPhase(), last.GetReason())
		}
		return true, nil
	})
	return got
}

// works is a WorkSource whose items tests set.
type works struct {
	mu    sync.Mutex
	items map[string][]*agentv1.WorkItem
}

var _ WorkSource = (*works)(nil)

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

// runner is a test Runner: it counts runs per uid and, when gate is set,
// waits for it (or the context) before finishing.
type runner struct {
	mu      sync.Mutex
	runs    map[string]int
	specs   map[string][]byte
	started chan string   // receives each uid as its run begins (the first 1024)
	gate    chan struct{} // nil: finish at once
	phase   string        // result; default Succeeded
	reason  string
}

func newRunner() *runner {
	return &runner{runs: map[string]int{}, specs: map[string][]byte{}, started: make(chan string, 1024)}
}

func (r *runner) Run(ctx context.Context, w store.Work) (string, string) {
	r.mu.Lock()
	r.runs[w.UID]++
	r.specs[w.UID] = w.Spec
	gate, phase, reason := r.gate, r.phase, r.reason
	r.mu.Unlock()
	select {
	case r.started <- w.UID:
	default: // nobody waits for starts in this test
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return agent.PhaseFailed, "interrupted: " + ctx.Err().Error()
		}
	}
	if phase == "" {
		phase = agent.PhaseSucceeded
	}
	return phase, reason
}

func (r *runner) count(uid string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs[uid]
}

// waitStarted waits until the runner began uid.
func (r *runner) waitStarted(t *testing.T, uid string) {
	t.Helper()
	timer := time.NewTimer(waitTimeout)
	defer timer.Stop()
	for {
		select {
		case got := <-r.started:
			if got == uid {
				return
			}
		case <-timer.C:
			t.Fatalf("runner did not start %s within %s", uid, waitTimeout)
		}
	}
}

// rawNode is a node registered through the real Register RPC whose
// certificate a test uses with a raw gRPC client, to send what a real agent
// never would.
type rawNode struct {
	name   string
	cert   tls.Certificate
	keyPEM []byte
	ca     *x509.CertPool
	// now, when set, is the time the client checks the hub's certificate
	// at (a hub on a fake clock signs on it).
	now func() time.Time
}

// registerRaw registers node with h using a fresh auto-approving token.
func (f *fixture) registerRaw(h *runningHub, node string) *rawNode {
	f.t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(f.caPEM()) {
		f.t.Fatal("no CA certificate")
	}
	keyPEM, csr, err := pki.NewKeyAndCSR(node)
	if err != nil {
		f.t.Fatal(err)
	}
	conn := dialRaw(f.t, h.addr, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13})
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	resp, err := agentv1.NewAgentHubClient(conn).Register(ctx, &agentv1.RegisterRequest{Node: node, BootstrapToken: f.token(), Csr: csr})
	if err != nil {
		f.t.Fatalf("register %s: %v", node, err)
	}
	if resp.GetResult() != agentv1.RegisterResponse_RESULT_APPROVED {
		f.t.Fatalf("register %s: %v %s", node, resp.GetResult(), resp.GetMessage())
	}
	cert, err := tls.X509KeyPair(pki.EncodeCert(resp.GetCertificate()), keyPEM)
	if err != nil {
		f.t.Fatal(err)
	}
	return &rawNode{name: node, cert: cert, keyPEM: keyPEM, ca: pool}
}

// client returns a client that presents the node's certificate, or none
// when anonymous.
func (n *rawNode) client(t *testing.T, addr string, anonymous bool) agentv1.AgentHubClient {
	t.Helper()
	cfg := &tls.Config{RootCAs: n.ca, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13, Time: n.now}
	if !anonymous {
		cfg.Certificates = []tls.Certificate{n.cert}
	}
	return agentv1.NewAgentHubClient(dialRaw(t, addr, cfg))
}

func dialRaw(t *testing.T, addr string, cfg *tls.Config) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(credentials.NewTLS(cfg)),
		// Let oversized envelopes leave the client: the hub must refuse them itself.
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(8*protocol.MaxEnvelopeBytes)),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
