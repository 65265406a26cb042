package apphub

// The harness: a real kube-apiserver (one per package, from testenv), a
// controller-runtime manager running the feature and a real hub, and a
// real agent connected over gRPC with TLS. The agent's app-instance and
// app-session runners are scripted: the test receives each item, makes
// the runner report states as the agent's actors would, and sees its
// cancel.

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/drover-fleet/drover/internal/agent"
	"github.com/drover-fleet/drover/internal/bootstrap"
	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/manager"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/serverless/appwire"
	"github.com/drover-fleet/drover/internal/store"
	"github.com/drover-fleet/drover/internal/task/taskwire"
	"github.com/drover-fleet/drover/internal/testenv"
	"github.com/drover-fleet/drover/internal/testkit"
)

const (
	// waitTimeout: a dispatch, a report, a write, a reconnect.
	waitTimeout = 30 * time.Second
	// stopTimeout: a manager or an agent returning after its context ends.
	stopTimeout = 15 * time.Second
)

var env *testenv.Env

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	var stop func()
	env, stop = testenv.StartMain(testenv.Options{Scheme: manager.Scheme()})
	testkit.VerifyNoLeaksAfter(m, stop)
}

// syncBuffer collects the logs of the hub and the agent; a failed test
// prints them.
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

// fixture is one test's hub, feature, agent and namespaces.
type fixture struct {
	t        *testing.T
	c        client.Client
	ns       string // the applications' namespace
	droverNS string // the hub's CA, tokens and Lease
	node     string
	hub      *hub.Hub
	f        *Feature
	reg      *prometheus.Registry
	runner   *scriptRunner
	addr     string // the hub's
	// suffix is this run's: slice entry uids are never reused, and a run
	// before this one (-count=2) left its slices in the apiserver.
	suffix string
	logger *slog.Logger
}

var nameRE = regexp.MustCompile(`[^a-z0-9]+`)

// start runs a manager with the feature (its options changed by with)
// and a hub, and an agent for one node connected to it whose app runners
// the test scripts.
func start(t *testing.T, with ...func(*Options)) *fixture {
	t.Helper()
	e := testenv.Require(t, env)
	base := strings.Trim(nameRE.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	if len(base) > 36 {
		base = base[:36]
	}
	// A suffix of its own per run: -count=2 must not meet the FleetNode
	// (another key) or the namespaces of the run before.
	suffix := fmt.Sprintf("%04x", rand.IntN(1<<16))
	base += "-" + suffix
	fx := &fixture{t: t, c: e.Client, ns: "apps-" + base, droverNS: "drover-" + base, node: "node-" + base,
		reg: prometheus.NewRegistry(), runner: newScriptRunner(), suffix: suffix}
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("DROVER_TEST_LOGS") != "" {
			t.Logf("hub and agent logs:\n%s", logs.String())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	for _, ns := range []string{fx.ns, fx.droverNS} {
		if err := hub.EnsureNamespace(ctx, fx.c, ns); err != nil {
			t.Fatal(err)
		}
	}
	mgr, err := ctrl.NewManager(e.Config, ctrl.Options{
		Scheme:                 manager.Scheme(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Logger: logger.With("component", "apps"),
		Registerer: fx.reg, SliceWriteInterval: 3 * time.Second}
	for _, w := range with {
		w(&o)
	}
	fx.f = New(o)
	if err := fx.f.SetupWithManager(context.Background(), mgr); err != nil {
		t.Fatal(err)
	}
	h, err := hub.New(hub.Options{Name: "hub-" + base, Client: fx.c, Namespace: fx.droverNS, ListenAddress: "127.0.0.1:0",
		ServingHosts: []string{"127.0.0.1"}, Features: []hub.Feature{fx.f},
		Logger: logger.With("component", "hub"), Registerer: fx.reg})
	if err != nil {
		t.Fatal(err)
	}
	fx.hub = h
	if err := mgr.Add(h); err != nil {
		t.Fatal(err)
	}
	mctx, mcancel := context.WithCancel(context.Background())
	mdone := make(chan error, 1)
	go func() { mdone <- mgr.Start(mctx) }()
	t.Cleanup(func() {
		mcancel()
		select {
		case err := <-mdone:
			if err != nil {
				t.Errorf("manager: %v", err)
			}
		case <-time.After(stopTimeout):
			t.Errorf("manager still running %s after stop", stopTimeout)
		}
	})
	actx, acancel := context.WithTimeout(context.Background(), waitTimeout)
	defer acancel()
	addr, err := h.Addr(actx)
	if err != nil {
		t.Fatalf("hub did not listen: %v", err)
	}

	fx.addr, fx.logger = addr.String(), logger
	fx.startAgent(fx.node, fx.runner, true)
	return fx
}

// startAgent runs an agent for node whose app items go to r, naming
// protocol.FeatureApps if apps, and waits until it is connected.
func (fx *fixture) startAgent(node string, r *scriptRunner, apps bool) {
	t := fx.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	tok, err := bootstrap.Generate()
	if err != nil {
		t.Fatal(err)
	}
	tok.AutoApprove = true
	if err := bootstrap.Create(ctx, fx.c, fx.droverNS, tok); err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, fx.caPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := agent.Options{Node: node, Hubs: []string{fx.addr}, BootstrapToken: tok.String(), CAFile: caFile,
		StateDir: t.TempDir(), HeartbeatInterval: time.Second,
		Runners: map[string]agent.Runner{appwire.TypeInstance: r, appwire.TypeSession: r},
		Logger:  fx.logger.With("component", "agent", "node", node)}
	if apps {
		opts.Connect = connectNaming(protocol.FeatureApps)
	}
	actx, acancel := context.WithCancel(context.Background())
	adone := make(chan error, 1)
	go func() { adone <- agent.Run(actx, opts) }()
	t.Cleanup(func() {
		acancel()
		select {
		case err := <-adone:
			if err != nil {
				t.Errorf("agent %s: %v", node, err)
			}
		case <-time.After(stopTimeout):
			t.Errorf("agent %s still running %s after stop", node, stopTimeout)
		}
	})
	testenv.Eventually(t, waitTimeout, "agent "+node+" connected", func(context.Context) (bool, error) {
		return fx.hub.Connected(node), nil
	})
}

// id is a slice entry uid of this run.
func (fx *fixture) id(s string) string { return s + "-" + fx.suffix }

func (fx *fixture) caPEM() []byte {
	fx.t.Helper()
	var s corev1.Secret
	testenv.Eventually(fx.t, waitTimeout, "Drover's CA exists", func(ctx context.Context) (bool, error) {
		err := fx.c.Get(ctx, client.ObjectKey{Namespace: fx.droverNS, Name: hub.CASecretName}, &s)
		return err == nil, client.IgnoreNotFound(err)
	})
	return s.Data[corev1.TLSCertKey]
}

// metric is the value of a counter (labels as name, value pairs), or the
// sample count of a histogram; 0 when absent.
func (fx *fixture) metric(name string, labels ...string) float64 {
	fx.t.Helper()
	mfs, err := fx.reg.Gather()
	if err != nil {
		fx.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !labelsMatch(m, labels) {
				continue
			}
			if h := m.GetHistogram(); h != nil {
				return float64(h.GetSampleCount())
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// waitMetric waits until metric name (with labels) is above 0.
func (fx *fixture) waitMetric(name string, labels ...string) {
	fx.t.Helper()
	eventually(fx.t, name+" counted", func(context.Context) error {
		if fx.metric(name, labels...) <= 0 {
			return fmt.Errorf("not yet")
		}
		return nil
	})
}

func labelsMatch(m *dto.Metric, want []string) bool {
	for i := 0; i+1 < len(want); i += 2 {
		ok := false
		for _, l := range m.GetLabel() {
			ok = ok || (l.GetName() == want[i] && l.GetValue() == want[i+1])
		}
		if !ok {
			return false
		}
	}
	return true
}

// connectNaming is a gRPC connector whose streams name features besides
// the agent's own: the agent names protocol.FeatureApps only with its
// real app runtime (Options.Apps), and these tests script the runners.
func connectNaming(features ...string) agent.Connector {
	return func(_ context.Context, hub string, cfg *tls.Config) (agentv1.AgentHubClient, io.Closer, error) {
		conn, err := grpc.NewClient(hub, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			return nil, nil, err
		}
		return &naming{AgentHubClient: agentv1.NewAgentHubClient(conn), features: features}, conn, nil
	}
}

type naming struct {
	agentv1.AgentHubClient
	features []string
}

func (n *naming) GetMessage(ctx context.Context, req *agentv1.GetMessageRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[agentv1.Envelope], error) {
	req = proto.Clone(req).(*agentv1.GetMessageRequest)
	for _, f := range n.features {
		if !slices.Contains(req.Features, f) {
			req.Features = append(req.Features, f)
		}
	}
	return n.AgentHubClient.GetMessage(ctx, req, opts...)
}

// item is one work item the scripted runner holds: the test makes it
// report and sees it end.
type item struct {
	w         store.Work
	reports   chan [2]string // reason, message
	end       chan [3]string // phase, reason, message
	cancelled chan struct{}  // closed when the hub cancelled it
}

// scriptRunner runs app-instance and app-session items as the test says.
type scriptRunner struct {
	mu    sync.Mutex
	items map[string]*item
	added chan struct{} // wakes waitItem
}

func newScriptRunner() *scriptRunner {
	return &scriptRunner{items: map[string]*item{}, added: make(chan struct{}, 1)}
}

var _ agent.ConcurrentRunner = (*scriptRunner)(nil)

func (r *scriptRunner) RunsConcurrently() {}

func (r *scriptRunner) Run(ctx context.Context, w store.Work) (string, string) {
	p, reason, _ := r.RunReporting(ctx, w, agent.Env{Report: func(context.Context, string, string) error { return nil }})
	return p, reason
}

func (r *scriptRunner) Resume(ctx context.Context, w store.Work, env agent.Env) (string, string, string) {
	return r.RunReporting(ctx, w, env)
}

func (r *scriptRunner) RunReporting(ctx context.Context, w store.Work, env agent.Env) (string, string, string) {
	it := &item{w: w, reports: make(chan [2]string, 64), end: make(chan [3]string, 1), cancelled: make(chan struct{})}
	r.mu.Lock()
	r.items[w.UID] = it
	r.mu.Unlock()
	select {
	case r.added <- struct{}{}:
	default:
	}
	for {
		select {
		case rep := <-it.reports:
			_ = env.Report(ctx, rep[0], rep[1])
		case e := <-it.end:
			return e[0], e[1], e[2]
		case <-ctx.Done():
			close(it.cancelled)
			// As the actors end a cancelled item: terminated, closed.
			if w.Type == appwire.TypeSession {
				return taskwire.PhaseCancelled, "Terminated", encode(appwire.SessionReport{State: "Terminated", Reason: "Closed"})
			}
			return taskwire.PhaseCancelled, "Terminated", encode(appwire.InstanceReport{State: "Terminated"})
		}
	}
}

func encode(v any) string {
	b, err := appwire.Encode(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// waitItem waits until the runner holds uid.
func (r *scriptRunner) waitItem(t *testing.T, uid string) *item {
	t.Helper()
	deadline := time.After(waitTimeout)
	for {
		r.mu.Lock()
		it := r.items[uid]
		r.mu.Unlock()
		if it != nil {
			return it
		}
		select {
		case <-r.added:
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatalf("the agent did not get work item %s within %s", uid, waitTimeout)
		}
	}
}

func (r *scriptRunner) has(uid string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.items[uid] != nil
}

// report makes the item report state with the JSON of rep.
func (it *item) report(state string, rep any) { it.reports <- [2]string{state, encode(rep)} }

func (it *item) waitCancelled(t *testing.T) {
	t.Helper()
	select {
	case <-it.cancelled:
	case <-time.After(waitTimeout):
		t.Fatalf("work item %s was not cancelled within %s", it.w.UID, waitTimeout)
	}
}

func eventually(t *testing.T, what string, cond func(ctx context.Context) error) {
	t.Helper()
	testenv.Eventually(t, waitTimeout, what, func(ctx context.Context) (bool, error) {
		if err := cond(ctx); err != nil {
			return false, fmt.Errorf("%w", err)
		}
		return true, nil
	})
}
