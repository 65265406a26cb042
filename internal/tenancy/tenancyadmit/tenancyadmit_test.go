package tenancyadmit_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/manager"
	"github.com/drover-fleet/drover/internal/tenancy/tenancyadmit"
	"github.com/drover-fleet/drover/internal/testenv"
	"github.com/drover-fleet/drover/internal/testkit"
)

// Named timeouts.
const (
	// startTimeout bounds a webhook server's start: certificate,
	// configuration, and the API server loading it.
	startTimeout = 2 * time.Minute
	stopTimeout  = 30 * time.Second
	droverNS     = "drover-system" // made by `drover controlplane` (config/rbac)
)

var env *testenv.Env

func TestMain(m *testing.M) {
	var stop func()
	env, stop = testenv.StartMain(testenv.Options{Scheme: manager.Scheme()})
	code := m.Run()
	stop()
	os.Exit(code)
}

// webhook is a manager serving only the tenancy webhook.
type webhook struct {
	reg  *prometheus.Registry
	stop func()
}

// startWebhook runs a manager with the webhook on a free loopback port
// until the test ends (or stop), and waits until the API server calls it.
func startWebhook(t *testing.T) *webhook {
	t.Helper()
	e := testenv.Require(t, env)
	mgr, err := ctrl.NewManager(e.Config, ctrl.Options{Scheme: manager.Scheme(),
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		t.Fatal(err)
	}
	w := &webhook{reg: prometheus.NewRegistry()}
	srv, err := tenancyadmit.Setup(mgr, tenancyadmit.Options{Namespace: droverNS, BindAddress: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil)), Registerer: w.reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	stopped := false
	w.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("manager: %v", err)
			}
		case <-time.After(stopTimeout):
			t.Errorf("manager still running %v after stop", stopTimeout)
		}
	}
	t.Cleanup(w.stop)
	actx, acancel := context.WithTimeout(ctx, startTimeout)
	defer acancel()
	if _, err := srv.Addr(actx); err != nil {
		t.Fatalf("webhook not serving within %v: %v", startTimeout, err)
	}
	return w
}

// testWriter sends the webhook's log to the test's.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

func (w *webhook) count(kind, result string) float64 {
	mfs, err := w.reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "drover_tenancy_admission_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["kind"] == kind && l["result"] == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func create(t *testing.T, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := env.Client.Create(context.Background(), o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
}

func task(ns, name string, mut func(*batchv1.TaskSpec)) *batchv1.Task {
	t := &batchv1.Task{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: batchv1.TaskSpec{Command: []string{"true"}}}
	if mut != nil {
		mut(&t.Spec)
	}
	return t
}

// refused creates o and wants the webhook's refusal holding every want.
func refused(t *testing.T, o client.Object, want ...string) {
	t.Helper()
	err := env.Client.Create(context.Background(), o)
	if err == nil {
		t.Fatalf("%T %s/%s was admitted; want refused with %q", o, o.GetNamespace(), o.GetName(), want)
	}
	for _, w := range append([]string{`admission webhook "tenancy.drover.io" denied the request`}, want...) {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%T %s/%s refused with %q; want it to say %q", o, o.GetNamespace(), o.GetName(), err, w)
		}
	}
}

func TestAdmission(t *testing.T) {
	w := startWebhook(t)
	ctx := context.Background()
	create(t,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "no-grant"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}},
		&fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: "lab-1", Labels: map[string]string{"zone": "lab"}}},
		&fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: "office-1", Labels: map[string]string{"zone": "office"}}},
		// Created just before the Tasks: a refusal by a cache that has not
		// seen the grant yet is checked again against the API server.
		&fleetv1.NodeGrant{ObjectMeta: metav1.ObjectMeta{Name: "team-a-lab"}, Spec: fleetv1.NodeGrantSpec{
			Namespaces:   []string{"team-a"},
			NodeSelector: metav1.LabelSelector{MatchLabels: map[string]string{"zone": "lab"}},
			RunAs:        &fleetv1.RunAsPolicy{Users: []fleetv1.IDRange{{Min: 1000, Max: 1999}}},
			HostDirs:     []string{"/srv/lab"},
		}},
	)

	t.Run("no grant", func(t *testing.T) {
		refused(t, task("no-grant", "t", nil), `spec: namespace "no-grant" has no NodeGrant`)
	})
	t.Run("ungranted node", func(t *testing.T) {
		refused(t, task("team-a", "office", func(s *batchv1.TaskSpec) { s.NodeName = "office-1" }),
			`spec: node "office-1" is not granted to namespace "team-a"`, `NodeGrant "team-a-lab" grants only nodes zone=lab`)
	})
	t.Run("granted node", func(t *testing.T) {
		create(t, task("team-a", "lab", func(s *batchv1.TaskSpec) { s.NodeName = "lab-1" }))
	})
	t.Run("no node", func(t *testing.T) {
		create(t, task("team-a", "anywhere", nil))
	})
	t.Run("node not registered yet", func(t *testing.T) {
		// Checked without a node; the scheduler checks it when it exists.
		create(t, task("team-a", "later", func(s *batchv1.TaskSpec) { s.NodeName = "lab-9" }))
		refused(t, task("team-a", "later-root", func(s *batchv1.TaskSpec) {
			s.NodeName = "lab-9"
			s.SecurityContext = &batchv1.TaskSecurityContext{RunAsUser: ptr.To[int64](0)}
		}), `does not allow runAsUser 0`)
	})
	t.Run("runAsUser", func(t *testing.T) {
		refused(t, task("team-a", "root", func(s *batchv1.TaskSpec) {
			s.NodeName = "lab-1"
			s.SecurityContext = &batchv1.TaskSecurityContext{RunAsUser: ptr.To[int64](0)}
		}), `NodeGrant "team-a-lab" does not allow runAsUser 0 (users 1000-1999)`)
		create(t, task("team-a", "uid-1500", func(s *batchv1.TaskSpec) {
			s.NodeName = "lab-1"
			s.SecurityContext = &batchv1.TaskSecurityContext{RunAsUser: ptr.To[int64](1500)}
		}))
		refused(t, task("team-a", "gid-0", func(s *batchv1.TaskSpec) {
			s.SecurityContext = &batchv1.TaskSecurityContext{RunAsUser: ptr.To[int64](1500), RunAsGroup: ptr.To[int64](0)}
		}), `does not allow group 0`)
	})
	t.Run("workingDir", func(t *testing.T) {
		refused(t, task("team-a", "etc", func(s *batchv1.TaskSpec) { s.WorkingDir = "/etc" }), `does not allow workingDir /etc (hostDirs: /srv/lab)`)
		create(t, task("team-a", "srv", func(s *batchv1.TaskSpec) { s.WorkingDir = "/srv/lab/run" }),
			task("team-a", "relative", func(s *batchv1.TaskSpec) { s.WorkingDir = "out/run" }))
	})
	t.Run("TaskGroup", func(t *testing.T) {
		group := func(name, node string) *batchv1.TaskGroup {
			return &batchv1.TaskGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name}, Spec: batchv1.TaskGroupSpec{Count: 2,
				Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{Command: []string{"true"}, NodeName: node}}}}
		}
		refused(t, group("office", "office-1"), `spec.template.spec: node "office-1" is not granted`, `NodeGrant "team-a-lab"`)
		create(t, group("lab", "lab-1"))
		// Each of a multi-task group's tasks is checked, by name.
		multi := &batchv1.TaskGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "multi"}, Spec: batchv1.TaskGroupSpec{Count: 1,
			Tasks: []batchv1.GroupTask{
				{Name: "main", Spec: batchv1.TaskSpec{Command: []string{"true"}, NodeName: "lab-1"}},
				{Name: "side", Lifecycle: batchv1.LifecycleSidecar, Spec: batchv1.TaskSpec{Command: []string{"true"}, NodeName: "office-1"}},
			}}}
		refused(t, multi, `spec.tasks[side].spec: node "office-1" is not granted`)
	})
	t.Run("FleetJob", func(t *testing.T) {
		job := func(name string, buildUser int64) *batchv1.FleetJob {
			return &batchv1.FleetJob{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name}, Spec: batchv1.FleetJobSpec{
				TaskGroups: []batchv1.TaskGroupTemplate{
					{Name: "fetch", Count: 1, Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{Command: []string{"true"}}}},
					{Name: "build", Count: 3, Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{Command: []string{"true"},
						SecurityContext: &batchv1.TaskSecurityContext{RunAsUser: ptr.To(buildUser)}}}},
				}}}
		}
		refused(t, job("as-root", 0), `spec.taskGroups[build].template.spec: namespace "team-a" may not run this work: NodeGrant "team-a-lab" does not allow runAsUser 0`)
		create(t, job("as-1000", 1000))
		refused(t, &batchv1.FleetJob{ObjectMeta: metav1.ObjectMeta{Namespace: "no-grant", Name: "j"}, Spec: batchv1.FleetJobSpec{
			TaskGroups: []batchv1.TaskGroupTemplate{
				{Name: "a", Count: 1, Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{Command: []string{"true"}}}},
				{Name: "b", Count: 1, Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{Command: []string{"true"}}}},
			}}}, `spec.taskGroups[a].template.spec: namespace "no-grant" has no NodeGrant`, `(and 1 more task groups refused)`)
	})
	t.Run("spec update", func(t *testing.T) {
		var tk batchv1.Task
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "team-a", Name: "anywhere"}, &tk); err != nil {
			t.Fatal(err)
		}
		tk.Spec.SecurityContext = &batchv1.TaskSecurityContext{RunAsUser: ptr.To[int64](0)}
		err := env.Client.Update(ctx, &tk)
		if err == nil || !strings.Contains(err.Error(), `does not allow runAsUser 0`) {
			t.Fatalf("update to runAsUser 0: %v; want refused", err)
		}
	})
	t.Run("namespace selector", func(t *testing.T) {
		create(t,
			&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ci-1", Labels: map[string]string{"tier": "ci"}}},
			&fleetv1.NodeGrant{ObjectMeta: metav1.ObjectMeta{Name: "ci"}, Spec: fleetv1.NodeGrantSpec{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "ci"}}}},
		)
		create(t, task("ci-1", "t", func(s *batchv1.TaskSpec) { s.NodeName = "office-1" }))
		refused(t, task("ci-1", "root", func(s *batchv1.TaskSpec) {
			s.SecurityContext = &batchv1.TaskSecurityContext{RunAsUser: ptr.To[int64](0)}
		}), `NodeGrant "ci" does not allow runAsUser 0 (it allows only the node's task user)`)
	})
	t.Run("grant deleted", func(t *testing.T) {
		if err := env.Client.Delete(ctx, &fleetv1.NodeGrant{ObjectMeta: metav1.ObjectMeta{Name: "ci"}}); err != nil {
			t.Fatal(err)
		}
		// The cached policy is dropped once the watch tells of it.
		testenv.Eventually(t, testkit.DefaultTimeout, "a Task in ci-1 refused", func(ctx context.Context) (bool, error) {
			err := env.Client.Create(ctx, task("ci-1", "after", nil), client.DryRunAll)
			if err == nil {
				return false, errors.New("admitted")
			}
			if strings.Contains(err.Error(), `namespace "ci-1" has no NodeGrant`) {
				return true, nil
			}
			return false, err
		})
	})

	for _, c := range []struct {
		kind, result string
		min          float64
	}{{"Task", "denied", 7}, {"Task", "allowed", 7}, {"TaskGroup", "denied", 2}, {"TaskGroup", "allowed", 1},
		{"FleetJob", "denied", 2}, {"FleetJob", "allowed", 1}} {
		if got := w.count(c.kind, c.result); got < c.min {
			t.Errorf("drover_tenancy_admission_total{kind=%q,result=%q} = %v, want at least %v", c.kind, c.result, got, c.min)
		}
	}
	if got := w.count("Task", "error"); got != 0 {
		t.Errorf("drover_tenancy_admission_total{kind=Task,result=error} = %v, want 0", got)
	}
}

// TestFailClosed: with the webhook configuration installed and no server
// answering, work cannot be created, but updates that leave spec alone
// (finalizers: the hub's, the manager's) and deletes go through.
func TestFailClosed(t *testing.T) {
	w := startWebhook(t)
	ctx := context.Background()
	create(t,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "closed"}},
		&fleetv1.NodeGrant{ObjectMeta: metav1.ObjectMeta{Name: "closed"}, Spec: fleetv1.NodeGrantSpec{Namespaces: []string{"closed"}}},
	)
	keep := task("closed", "keep", nil)
	testenv.Eventually(t, testkit.DefaultTimeout, "a Task admitted in a granted namespace", func(ctx context.Context) (bool, error) {
		return env.Client.Create(ctx, keep) == nil, nil
	})
	w.stop()

	err := env.Client.Create(ctx, task("closed", "new", nil))
	if err == nil || !strings.Contains(err.Error(), `failed calling webhook "tenancy.drover.io"`) {
		t.Fatalf("create with the webhook down: %v; want the API server's failed calling webhook", err)
	}
	group := &batchv1.TaskGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "closed", Name: "g"}, Spec: batchv1.TaskGroupSpec{Count: 1,
		Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{Command: []string{"true"}}}}}
	if err := env.Client.Create(ctx, group); err == nil || !strings.Contains(err.Error(), "failed calling webhook") {
		t.Fatalf("create a TaskGroup with the webhook down: %v; want refused", err)
	}
	// A spec change is refused too ...
	spec := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"priority":5}}`))
	if err := env.Client.Patch(ctx, keep, spec); err == nil || !strings.Contains(err.Error(), "failed calling webhook") {
		t.Fatalf("spec change with the webhook down: %v; want refused", err)
	}
	// ... but not a finalizer, a label, a status write or a delete.
	if err := env.Client.Patch(ctx, keep, client.RawPatch(types.MergePatchType,
		[]byte(`{"metadata":{"finalizers":["drover.io/test"],"labels":{"a":"b"}}}`))); err != nil {
		t.Fatalf("add a finalizer with the webhook down: %v", err)
	}
	keep.Status.State = batchv1.TaskFailed
	if err := env.Client.Status().Update(ctx, keep); err != nil {
		t.Fatalf("status write with the webhook down: %v", err)
	}
	if err := env.Client.Delete(ctx, keep); err != nil {
		t.Fatalf("delete with the webhook down: %v", err)
	}
	if err := env.Client.Patch(ctx, keep, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))); err != nil {
		t.Fatalf("remove the finalizer with the webhook down: %v", err)
	}
	testenv.Eventually(t, testkit.DefaultTimeout, "the Task gone", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(keep), &batchv1.Task{})
		if err == nil {
			return false, errors.New("still there")
		}
		return true, client.IgnoreNotFound(err)
	})

	// A manager started again serves it under the same certificate.
	var before corev1.Secret
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: droverNS, Name: tenancyadmit.SecretName}, &before); err != nil {
		t.Fatal(err)
	}
	startWebhook(t)
	create(t, task("closed", "again", nil))
	var after corev1.Secret
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: droverNS, Name: tenancyadmit.SecretName}, &after); err != nil {
		t.Fatal(err)
	}
	if after.ResourceVersion != before.ResourceVersion {
		t.Errorf("the webhook's Secret changed on a restart (resourceVersion %s -> %s)", before.ResourceVersion, after.ResourceVersion)
	}
}
