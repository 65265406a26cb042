package nodejobhub_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/nodejob"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobhub"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/testenv"
	"github.com/drover-fleet/drover/internal/testkit"
)

var (
	env    *testenv.Env
	scheme = runtime.NewScheme()
)

const (
	waitTimeout = 30 * time.Second
	digest      = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, opsv1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	var stop func()
	env, stop = testenv.StartMain(testenv.Options{Scheme: scheme})
	testkit.VerifyNoLeaksAfter(m, stop)
}

// recordingHub stands in for the hub's stream side: the hub itself is tested
// with real agents in internal/hub; here what matters is what the executor
// asks of it.
type recordingHub struct {
	mu         sync.Mutex
	connected  map[string]bool
	dispatched []string // node/uid/type
	cancelled  []string // node/uid
	specs      map[string][]byte
	// failSend: Dispatch to these nodes fails with the error.
	failSend map[string]error
}

func (h *recordingHub) Dispatch(node string, it *agentv1.WorkItem) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.failSend[node]; err != nil {
		return err
	}
	h.dispatched = append(h.dispatched, node+"/"+it.GetUid()+"/"+it.GetType())
	h.specs[it.GetUid()] = it.GetSpec()
	return nil
}

func (h *recordingHub) Cancel(node, uid string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cancelled = append(h.cancelled, node+"/"+uid)
	return nil
}

func (h *recordingHub) Connected(node string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.connected[node]
}

func (h *recordingHub) HubName() string { return "test-hub" }

func (h *recordingHub) Address(string) string { return "" }

// Supports is false: node jobs go to agents of any version (an old agent
// must still take the upgrade that makes it new).
func (h *recordingHub) Supports(string, string) bool { return false }

func (h *recordingHub) Call(context.Context, string, *agentv1.WorkItem, func(*agentv1.WorkStatus) bool) (*agentv1.WorkStatus, error) {
	return nil, errors.New("node jobs make no calls")
}

var _ hub.Link = (*recordingHub)(nil)

func (h *recordingHub) has(list *[]string, want string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range *list {
		if s == want {
			return true
		}
	}
	return false
}

// start runs an executor until the test ends; hold is its HoldInterval
// (0: the default).
func start(t *testing.T, hold time.Duration) (*nodejobhub.Executor, *recordingHub, prometheus.Gatherer) {
	t.Helper()
	return startWith(t, hold, nil)
}

// startWith is start with the executor's client wrapped by wrap (nil: as is).
func startWith(t *testing.T, hold time.Duration, wrap func(client.Client) client.Client) (*nodejobhub.Executor, *recordingHub, prometheus.Gatherer) {
	t.Helper()
	skip := true
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: &skip}})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	var logger *slog.Logger
	if os.Getenv("DROVER_TEST_LOGS") != "" {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	c := mgr.GetClient()
	if wrap != nil {
		c = wrap(c)
	}
	e := nodejobhub.New(nodejobhub.Options{Client: c, APIReader: mgr.GetAPIReader(), Registerer: reg, FlushInterval: 300 * time.Millisecond, HoldInterval: hold, Logger: logger})
	h := &recordingHub{connected: map[string]bool{"n1": true}, specs: map[string][]byte{}, failSend: map[string]error{}}
	e.Attach(h)
	if err := e.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	return e, h, reg
}

// jobWithSlice creates job and the slice the manager would have made.
func jobWithSlice(t *testing.T, job opsv1.NodeJob, entries ...opsv1.NodeTaskStatus) *opsv1.NodeTaskSlice {
	t.Helper()
	ctx := context.Background()
	if err := env.Client.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	s := &opsv1.NodeTaskSlice{
		ObjectMeta: metav1.ObjectMeta{Name: nodejob.SliceName(job.JobKind(), job.GetName(), job.GetUID(), 0),
			Labels: map[string]string{opsv1.LabelJobUID: string(job.GetUID()), opsv1.LabelJobKind: job.JobKind(), opsv1.LabelJobName: job.GetName()}},
		Job:   opsv1.JobReference{Kind: job.JobKind(), Name: job.GetName(), UID: job.GetUID()},
		Nodes: entries,
	}
	if err := env.Client.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	return s
}

func entry(node string, p opsv1.NodeTaskPhase) opsv1.NodeTaskStatus {
	return opsv1.NodeTaskStatus{NodeName: node, Phase: p}
}

func sliceEntry(t *testing.T, name, node string) opsv1.NodeTaskStatus {
	t.Helper()
	var s opsv1.NodeTaskSlice
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, &s); err != nil {
		t.Fatal(err)
	}
	for _, e := range s.Nodes {
		if e.NodeName == node {
			return e
		}
	}
	t.Fatalf("node %s not in slice %s", node, name)
	return opsv1.NodeTaskStatus{}
}

func TestDispatchReportsConfirmAndDelete(t *testing.T) {
	testenv.Require(t, env)
	e, h, reg := start(t, 0)
	ctx := context.Background()
	job := &opsv1.NodeUpgradeJob{ObjectMeta: metav1.ObjectMeta{Name: "exec-upgrade"}, Spec: opsv1.NodeUpgradeJobSpec{
		NodeNames: []string{"n1", "n2", "n3"}, Version: "v1.2.3", RequireConfirmation: true,
		Artifact: opsv1.AgentArtifact{URL: "https://example.com/agent", SHA256: digest}}}
	s := jobWithSlice(t, job, entry("n1", "InProgress"), entry("n2", "Pending"), entry("n3", "InProgress"))
	uid := string(job.UID)

	testenv.Eventually(t, waitTimeout, "n1 dispatched", func(context.Context) (bool, error) {
		return h.has(&h.dispatched, "n1/"+uid+"/"+nodejobwire.TypeUpgrade), nil
	})
	spec, err := nodejobwire.DecodeUpgrade(h.specs[uid])
	if err != nil || spec.Version != "v1.2.3" || !spec.RequireConfirmation || spec.Confirmed {
		t.Errorf("dispatched spec = %+v, %v", spec, err)
	}
	if h.has(&h.dispatched, "n3/"+uid+"/"+nodejobwire.TypeUpgrade) {
		t.Error("dispatched to n3, which is not connected to this hub")
	}
	for node, want := range map[string]int{"n1": 1, "n2": 0, "n3": 1} {
		items, err := e.WorkFor(ctx, node)
		if err != nil || len(items) != want {
			t.Errorf("WorkFor(%s) = %d items, %v; want %d", node, len(items), err, want)
		}
	}

	// Reports from one flush become one write.
	now := time.Now()
	for _, r := range []struct {
		phase string
		r     nodejobwire.Report
	}{
		{nodejobwire.PhaseRunning, nodejobwire.Report{Action: nodejobwire.Check, Success: true, Time: now}},
		{nodejobwire.PhaseRunning, nodejobwire.Report{Action: nodejobwire.Confirm, Running: true, Time: now}},
	} {
		e.WorkStatus(ctx, "n1", &agentv1.WorkStatus{Uid: uid, Phase: r.phase, Reason: r.r.Action, Message: nodejobwire.EncodeReport(r.r)})
	}
	testenv.Eventually(t, waitTimeout, "reports written", func(context.Context) (bool, error) {
		if got := sliceEntry(t, s.Name, "n1"); got.Action != nodejobwire.Confirm || len(got.ActionFlow) != 2 {
			return false, fmt.Errorf("entry %+v", got)
		}
		return true, nil
	})
	if n := testutil.ToFloat64(mustCounter(t, reg, "drover_hub_nodejob_slice_writes_total")); n != 1 {
		t.Errorf("slice writes = %v, want 1 for two reports in one flush", n)
	}

	// An operator confirms n1: the confirmation goes out as its own item.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(job), job); err != nil {
			return err
		}
		job.Spec.Confirmed = &opsv1.Confirmation{NodeNames: []string{"n1"}}
		return env.Client.Update(ctx, job)
	}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "confirmation dispatched", func(context.Context) (bool, error) {
		return h.has(&h.dispatched, "n1/"+nodejobwire.ConfirmUID(uid)+"/"+nodejobwire.TypeConfirm), nil
	})

	// A final report ends the node.
	rb := nodejobwire.Report{Action: nodejobwire.RollBack, Success: true, Reason: "rolled back to v1.0.0", Time: time.Now()}
	e.WorkStatus(ctx, "n1", &agentv1.WorkStatus{Uid: uid, Phase: nodejobwire.PhaseFailed, Reason: rb.Action, Message: nodejobwire.EncodeReport(rb)})
	testenv.Eventually(t, waitTimeout, "n1 failed", func(context.Context) (bool, error) {
		return sliceEntry(t, s.Name, "n1").Phase == opsv1.NodeTaskPhaseFailure, nil
	})

	// Reports of work that is not a node job's are not ours.
	e.WorkStatus(ctx, "n1", &agentv1.WorkStatus{Uid: "some-task", Phase: "Succeeded"})
	for id, want := range map[string]bool{uid: true, nodejobwire.ConfirmUID(uid): true, "some-task": false, nodejobwire.ConfirmUID("some-task"): false} {
		if got := e.Owns(id); got != want {
			t.Errorf("Owns(%s) = %v, want %v", id, got, want)
		}
	}

	// Deleting the job cancels its work on connected nodes.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
			return err
		}
		s.Nodes[2].Phase = opsv1.NodeTaskPhaseInProgress
		return env.Client.Update(ctx, s)
	}); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	h.connected["n3"] = true
	h.mu.Unlock()
	if err := env.Client.Delete(ctx, job); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "n3's work cancelled", func(context.Context) (bool, error) {
		return h.has(&h.cancelled, "n3/"+uid), nil
	})
	if items, _ := e.WorkFor(ctx, "n3"); len(items) != 0 {
		t.Errorf("a deleted job's work is still listed for n3: %v", items)
	}
	if e.Owns(uid) {
		t.Errorf("the executor still owns deleted job %s's uid", uid)
	}
}

// TestJobsGetOnlyTheirRegistriesCredentials: a pre-pull and an upgrade
// from an OCI artifact carry the entries of their job's dockerconfigjson
// Secret for the registries their images are on, and no others.
func TestJobsGetOnlyTheirRegistriesCredentials(t *testing.T) {
	testenv.Require(t, env)
	_, h, _ := start(t, 0)
	h.mu.Lock()
	h.connected["n2"] = true
	h.mu.Unlock()
	ctx := context.Background()
	auth := func(u, p string) string { return base64.StdEncoding.EncodeToString([]byte(u + ":" + p)) }
	cfg := fmt.Sprintf(`{"auths":{"registry.example.com:5000":{"auth":%q},"https://other.example.com/v1/":{"username":"o","password":"p"},"docker.io":{"username":"d","password":"h"}}}`, auth("alice", "s3cret"))
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pull", Namespace: "default"}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(cfg)}}
	if err := env.Client.Create(ctx, sec); err != nil {
		t.Fatal(err)
	}
	ref := &corev1.SecretReference{Name: "pull", Namespace: "default"}
	alice := nodejobwire.Credential{Username: "alice", Password: "s3cret"}
	tests := []struct {
		name, node, typ string
		job             opsv1.NodeJob
		auth            func([]byte) (map[string]nodejobwire.Credential, error)
		want            map[string]nodejobwire.Credential
	}{
		{"pre-pull", "n1", nodejobwire.TypePrePull,
			&opsv1.ImagePrePullJob{ObjectMeta: metav1.ObjectMeta{Name: "exec-pull"}, Spec: opsv1.ImagePrePullJobSpec{
				NodeNames: []string{"n1"}, Images: []string{"registry.example.com:5000/team/app:v1", "nginx"}, RetryTimes: 2, ImageSecretRef: ref}},
			func(b []byte) (map[string]nodejobwire.Credential, error) {
				s, err := nodejobwire.DecodePrePull(b)
				return s.Auth, err
			},
			map[string]nodejobwire.Credential{"registry.example.com:5000": alice, "index.docker.io": {Username: "d", Password: "h"}}},
		{"upgrade from an OCI artifact", "n2", nodejobwire.TypeUpgrade,
			&opsv1.NodeUpgradeJob{ObjectMeta: metav1.ObjectMeta{Name: "exec-oci-upgrade"}, Spec: opsv1.NodeUpgradeJobSpec{
				NodeNames: []string{"n2"}, Version: "v2.0.0", Artifact: opsv1.AgentArtifact{
					Image: "registry.example.com:5000/drover/agent:v2.0.0", SHA256: strings.Repeat("a", 64), ImageSecretRef: ref}}},
			func(b []byte) (map[string]nodejobwire.Credential, error) {
				s, err := nodejobwire.DecodeUpgrade(b)
				return s.Auth, err
			},
			map[string]nodejobwire.Credential{"registry.example.com:5000": alice}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			jobWithSlice(t, tt.job, entry(tt.node, "InProgress"))
			uid := string(tt.job.GetUID())
			testenv.Eventually(t, waitTimeout, tt.name+" dispatched", func(context.Context) (bool, error) {
				return h.has(&h.dispatched, tt.node+"/"+uid+"/"+tt.typ), nil
			})
			h.mu.Lock()
			got, err := tt.auth(h.specs[uid])
			h.mu.Unlock()
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got, tt.want) {
				t.Errorf("auth = %+v; want %+v", got, tt.want)
			}
		})
	}
}

func mustCounter(t *testing.T, g prometheus.Gatherer, name string) prometheus.Collector {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: "copy"})
			c.Add(mf.GetMetric()[0].GetCounter().GetValue())
			return c
		}
	}
	t.Fatalf("metric %s not registered", name)
	return nil
}

func TestActionReportsWaitForThePhaseChangeOrTheTimeout(t *testing.T) {
	testenv.Require(t, env)
	e, h, reg := start(t, time.Hour)
	h.mu.Lock()
	h.connected["h1"], h.connected["h2"] = true, true
	h.mu.Unlock()
	ctx := context.Background()
	admitted := func(node string) opsv1.NodeTaskStatus {
		now := metav1.NowMicro()
		return opsv1.NodeTaskStatus{NodeName: node, Phase: opsv1.NodeTaskPhaseInProgress, Reason: "dispatched to hub x", UpdateTime: &now}
	}
	send := func(node, uid, phase string, r nodejobwire.Report) {
		e.WorkStatus(ctx, node, &agentv1.WorkStatus{Uid: uid, Phase: phase, Reason: r.Action, Message: nodejobwire.EncodeReport(r)})
	}
	upgradeJob := func(name, node string, timeout int32) *opsv1.NodeUpgradeJob {
		return &opsv1.NodeUpgradeJob{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: opsv1.NodeUpgradeJobSpec{
			NodeNames: []string{node}, Version: "v1.2.3", Artifact: opsv1.AgentArtifact{URL: "https://example.com/agent", SHA256: digest},
			JobExecution: opsv1.JobExecution{TimeoutSeconds: timeout}}}
	}

	// Long timeout: Check and BackUp wait for the report that ends the
	// node, and all three go out in one write.
	long := upgradeJob("exec-hold", "h1", 600)
	ls := jobWithSlice(t, long, admitted("h1"))
	lu := string(long.UID)
	testenv.Eventually(t, waitTimeout, "h1 dispatched", func(context.Context) (bool, error) {
		return h.has(&h.dispatched, "h1/"+lu+"/"+nodejobwire.TypeUpgrade), nil
	})
	send("h1", lu, nodejobwire.PhaseRunning, nodejobwire.Report{Action: nodejobwire.Check, Success: true, Time: time.Now()})
	send("h1", lu, nodejobwire.PhaseRunning, nodejobwire.Report{Action: nodejobwire.BackUp, Success: true, Time: time.Now()})
	testenv.Never(t, 2*time.Second, "Check and BackUp written before the node ended", func(context.Context) (bool, error) {
		return sliceEntry(t, ls.Name, "h1").Action != "", nil
	})
	send("h1", lu, nodejobwire.PhaseSucceeded, nodejobwire.Report{Action: nodejobwire.Upgrade, Success: true, Time: time.Now(), CurrentVersion: "v1.2.3"})
	testenv.Eventually(t, waitTimeout, "h1 Successful with its three actions", func(context.Context) (bool, error) {
		got := sliceEntry(t, ls.Name, "h1")
		if got.Phase != opsv1.NodeTaskPhaseSuccessful || len(got.ActionFlow) != 3 || got.ActionFlow[0].Action != nodejobwire.Check {
			return false, fmt.Errorf("entry %+v", got)
		}
		return true, nil
	})
	if n := testutil.ToFloat64(mustCounter(t, reg, "drover_hub_nodejob_slice_writes_total")); n != 1 {
		t.Errorf("slice writes = %v, want 1 for three reports", n)
	}

	// A 2 s timeout: a held report is written within half of it, before
	// the manager would give up on a node that did report.
	short := upgradeJob("exec-hold-short", "h2", 2)
	ss := jobWithSlice(t, short, admitted("h2"))
	su := string(short.UID)
	testenv.Eventually(t, waitTimeout, "h2 dispatched", func(context.Context) (bool, error) {
		return h.has(&h.dispatched, "h2/"+su+"/"+nodejobwire.TypeUpgrade), nil
	})
	send("h2", su, nodejobwire.PhaseRunning, nodejobwire.Report{Action: nodejobwire.Check, Success: true, Time: time.Now()})
	testenv.Eventually(t, waitTimeout, "h2's Check written without a later report", func(context.Context) (bool, error) {
		got := sliceEntry(t, ss.Name, "h2")
		return got.Action == nodejobwire.Check && got.Phase == opsv1.NodeTaskPhaseInProgress, nil
	})
}
