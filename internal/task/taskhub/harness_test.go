package taskhub

// The harness: a real kube-apiserver (one per package, from testenv), a
// controller-runtime manager running the dispatcher and a real hub, and a
// real agent connected over gRPC with TLS. The agent's task-exec runner
// here is a small one (the real exec driver is tested in its own package):
// it runs the command with os/exec, writes the log files per the agent's
// convention and reports taskwire.Reports.

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	"github.com/drover-fleet/drover/internal/agent"
	"github.com/drover-fleet/drover/internal/bootstrap"
	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/manager"
	"github.com/drover-fleet/drover/internal/store"
	"github.com/drover-fleet/drover/internal/task/taskwire"
	"github.com/drover-fleet/drover/internal/testenv"
	"github.com/drover-fleet/drover/internal/testkit"
)

const (
	// waitTimeout: a dispatch, a report, a reconnect.
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

// fixture is one test's hub, dispatcher, agent and namespaces.
type fixture struct {
	t         *testing.T
	c         client.Client
	ns        string // the tasks' namespace
	droverNS  string // the hub's CA, tokens and Lease
	node      string
	hub       *hub.Hub
	addr      string
	d         *Dispatcher
	reg       *prometheus.Registry
	runner    *execRunner
	stateDir  string
	agentOpts agent.Options
	// stopAgent stops the agent startAgent started and waits for it.
	stopAgent func()
}

// startAgent runs the fixture's agent (again: its state dir keeps its
// identity and its work).
func (f *fixture) startAgent() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx, f.agentOpts) }()
	var once sync.Once
	f.stopAgent = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					f.t.Errorf("agent: %v", err)
				}
			case <-time.After(stopTimeout):
				f.t.Errorf("agent still running %s after stop", stopTimeout)
			}
		})
	}
}

var nameRE = regexp.MustCompile(`[^a-z0-9]+`)

// start runs a manager with the dispatcher and a hub, and an agent for one
// node connected to it.
func start(t *testing.T) *fixture {
	t.Helper()
	e := testenv.Require(t, env)
	base := strings.Trim(nameRE.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	if len(base) > 40 {
		base = base[:40]
	}
	f := &fixture{t: t, c: e.Client, ns: "tasks-" + base, droverNS: "drover-" + base, node: "node-" + base, reg: prometheus.NewRegistry()}
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("DROVER_TEST_LOGS") != "" {
			t.Logf("hub and agent logs:\n%s", logs.String())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	for _, ns := range []string{f.ns, f.droverNS} {
		if err := hub.EnsureNamespace(ctx, f.c, ns); err != nil {
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
	f.d = New(Options{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Logger: logger.With("component", "dispatch"),
		Registerer: f.reg, CleanupTimeout: 20 * time.Second})
	if err := f.d.SetupWithManager(context.Background(), mgr); err != nil {
		t.Fatal(err)
	}
	h, err := hub.New(hub.Options{Name: "hub-" + base, Client: f.c, Namespace: f.droverNS, ListenAddress: "127.0.0.1:0",
		ServingHosts: []string{"127.0.0.1"}, Features: []hub.Feature{f.d},
		Logger: logger.With("component", "hub"), Registerer: f.reg})
	if err != nil {
		t.Fatal(err)
	}
	f.hub = h
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
	f.addr = addr.String()

	// The agent, registered with an auto-approving token.
	tok, err := bootstrap.Generate()
	if err != nil {
		t.Fatal(err)
	}
	tok.AutoApprove = true
	if err := bootstrap.Create(ctx, f.c, f.droverNS, tok); err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, f.caPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	f.stateDir = t.TempDir()
	f.runner = newExecRunner(f.stateDir)
	f.agentOpts = agent.Options{Node: f.node, Hubs: []string{f.addr}, BootstrapToken: tok.String(), CAFile: caFile,
		StateDir: f.stateDir, HeartbeatInterval: time.Second, Runners: map[string]agent.Runner{taskwire.TypeExec: f.runner},
		Logger: logger.With("component", "agent")}
	f.startAgent()
	t.Cleanup(func() { f.stopAgent() })
	testenv.Eventually(t, waitTimeout, "agent connected", func(context.Context) (bool, error) {
		return h.Connected(f.node), nil
	})
	// Tasks go before the hub and the agent stop (cleanups run last first),
	// so their finalizers are still served.
	t.Cleanup(f.deleteTasks)
	return f
}

func (f *fixture) caPEM() []byte {
	f.t.Helper()
	var s corev1.Secret
	testenv.Eventually(f.t, waitTimeout, "Drover's CA exists", func(ctx context.Context) (bool, error) {
		err := f.c.Get(ctx, client.ObjectKey{Namespace: f.droverNS, Name: hub.CASecretName}, &s)
		return err == nil, client.IgnoreNotFound(err)
	})
	return s.Data[corev1.TLSCertKey]
}

func (f *fixture) deleteTasks() {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	_ = f.c.DeleteAllOf(ctx, &batchv1.Task{}, client.InNamespace(f.ns))
	testenv.Eventually(f.t, waitTimeout, "the test's tasks are gone", func(ctx context.Context) (bool, error) {
		var l batchv1.TaskList
		if err := f.c.List(ctx, &l, client.InNamespace(f.ns)); err != nil {
			return false, err
		}
		return len(l.Items) == 0, nil
	})
}

// schedule creates a task running command and, acting as the manager,
// schedules attempt 1 onto the fixture's node.
func (f *fixture) schedule(name string, command ...string) *batchv1.Task {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	t := &batchv1.Task{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
		Spec:       batchv1.TaskSpec{Command: command, Env: []batchv1.EnvVar{{Name: "GREETING", Value: "hello"}}},
	}
	if err := f.c.Create(ctx, t); err != nil {
		f.t.Fatal(err)
	}
	f.setAttempt(t, 1)
	return t
}

// setAttempt makes attempt n Scheduled on the fixture's node, as the manager does.
func (f *fixture) setAttempt(t *batchv1.Task, n int32) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	// The hub writes the task too (its finalizer, its reports): retry on
	// a conflict, as the manager would.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := f.c.Get(ctx, client.ObjectKeyFromObject(t), t); err != nil {
			return err
		}
		t.Status = batchv1.TaskStatus{State: batchv1.TaskScheduled, Reason: batchv1.ReasonScheduled, NodeName: f.node, Attempt: n}
		return f.c.Status().Update(ctx, t)
	}); err != nil {
		f.t.Fatal(err)
	}
}

// waitState waits until the task is in state and returns it.
func (f *fixture) waitState(t *batchv1.Task, state batchv1.TaskState) *batchv1.Task {
	f.t.Helper()
	var got batchv1.Task
	testenv.Eventually(f.t, waitTimeout, fmt.Sprintf("task %s is %s", t.Name, state), func(ctx context.Context) (bool, error) {
		if err := f.c.Get(ctx, client.ObjectKeyFromObject(t), &got); err != nil {
			return false, err
		}
		if got.Status.State != state {
			return false, fmt.Errorf("state %s (%s: %s)", got.Status.State, got.Status.Reason, got.Status.Message)
		}
		return true, nil
	})
	return &got
}

// waitFinalizer waits until the task holds FinalizerCleanup.
func (f *fixture) waitFinalizer(t *batchv1.Task) {
	f.t.Helper()
	testenv.Eventually(f.t, waitTimeout, fmt.Sprintf("task %s holds %s", t.Name, FinalizerCleanup), func(ctx context.Context) (bool, error) {
		var got batchv1.Task
		if err := f.c.Get(ctx, client.ObjectKeyFromObject(t), &got); err != nil {
			return false, err
		}
		if !controllerutil.ContainsFinalizer(&got, FinalizerCleanup) {
			return false, fmt.Errorf("finalizers %v", got.Finalizers)
		}
		return true, nil
	})
}

func (f *fixture) waitGone(t *batchv1.Task) {
	f.t.Helper()
	testenv.Eventually(f.t, waitTimeout, fmt.Sprintf("task %s is gone", t.Name), func(ctx context.Context) (bool, error) {
		var got batchv1.Task
		err := f.c.Get(ctx, client.ObjectKeyFromObject(t), &got)
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		return false, fmt.Errorf("still there, finalizers %v", got.Finalizers)
	})
}

// gate is a file a task's command waits for: touching it lets it go on.
func (f *fixture) gate(name string) (path string, open func()) {
	path = filepath.Join(f.t.TempDir(), name)
	return path, func() {
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			f.t.Fatal(err)
		}
	}
}

// waitFor is a shell loop waiting for a gate file.
func waitFor(path string) string {
	return fmt.Sprintf(`while [ ! -e %q ]; do sleep 0.05; done`, path)
}

func (f *fixture) counter(name string) float64 {
	f.t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		f.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// execRunner runs task-exec items with os/exec, as the exec driver does in
// miniature: output to <state dir>/tasks/<work id>/{stdout,stderr}.log.
type execRunner struct {
	dir string

	mu        sync.Mutex
	cancelled map[string]bool
}

func newExecRunner(dir string) *execRunner {
	return &execRunner{dir: dir, cancelled: map[string]bool{}}
}

var _ agent.ReportingRunner = (*execRunner)(nil)

func (r *execRunner) Run(ctx context.Context, w store.Work) (string, string) {
	p, reason, _ := r.RunReporting(ctx, w, agent.Env{
		Report:          func(context.Context, string, string) error { return nil },
		RecordAndReport: func(context.Context, store.Action, string, string) error { return nil },
	})
	return p, reason
}

func (r *execRunner) wasCancelled(uid string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cancelled[uid]
}

func (r *execRunner) RunReporting(ctx context.Context, w store.Work, env agent.Env) (string, string, string) {
	spec, err := taskwire.DecodeSpec(w.Spec)
	if err != nil {
		return taskwire.PhaseFailed, taskwire.ReasonStartError, taskwire.Report{Message: err.Error()}.Encode()
	}
	dir := filepath.Join(r.dir, "tasks", w.UID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return taskwire.PhaseFailed, taskwire.ReasonStartError, taskwire.Report{Message: err.Error()}.Encode()
	}
	stdout, err := os.Create(filepath.Join(dir, "stdout.log"))
	if err != nil {
		return taskwire.PhaseFailed, taskwire.ReasonStartError, taskwire.Report{Message: err.Error()}.Encode()
	}
	defer stdout.Close()
	stderr, err := os.Create(filepath.Join(dir, "stderr.log"))
	if err != nil {
		return taskwire.PhaseFailed, taskwire.ReasonStartError, taskwire.Report{Message: err.Error()}.Encode()
	}
	defer stderr.Close()
	cmd := exec.Command(spec.Command[0], spec.Command[1:]...)
	cmd.Stdout, cmd.Stderr, cmd.Env = stdout, stderr, append([]string{"PATH=/usr/bin:/bin"}, spec.Env...)
	began := time.Now()
	if err := cmd.Start(); err != nil {
		return taskwire.PhaseFailed, taskwire.ReasonStartError, taskwire.Report{Message: err.Error()}.Encode()
	}
	rep := taskwire.Report{PID: cmd.Process.Pid, StartTime: began.Format(time.RFC3339Nano)}
	_ = env.Report(ctx, "Started", rep.Encode())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-done
		r.mu.Lock()
		r.cancelled[w.UID] = true
		r.mu.Unlock()
		rep.FinishTime = time.Now().Format(time.RFC3339Nano)
		return taskwire.PhaseCancelled, taskwire.ReasonCancelled, rep.Encode()
	}
	code := int32(cmd.ProcessState.ExitCode())
	rep.ExitCode, rep.FinishTime = &code, time.Now().Format(time.RFC3339Nano)
	out, _ := os.ReadFile(stdout.Name())
	errOut, _ := os.ReadFile(stderr.Name())
	rep.OutputTail = string(out) + string(errOut)
	if code != 0 {
		rep.Message = fmt.Sprintf("exited with code %d", code)
		return taskwire.PhaseFailed, taskwire.ReasonExitCode, rep.Encode()
	}
	return taskwire.PhaseSucceeded, "", rep.Encode()
}
