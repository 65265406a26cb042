package taskctl_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/clock/clocktest"
	"github.com/drover-fleet/drover/internal/task/taskctl"
	"github.com/drover-fleet/drover/internal/testenv"
	"github.com/drover-fleet/drover/internal/testkit"
)

var (
	env    *testenv.Env
	scheme = runtime.NewScheme()
)

const waitTimeout = testenv.DefaultTimeout

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, fleetv1.AddToScheme, batchv1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	var stop func()
	env, stop = testenv.StartMain(testenv.Options{Scheme: scheme})
	code := m.Run()
	stop()
	os.Exit(code)
}

var namespaces atomic.Int32

// start runs the task controllers with clock until the test ends, in a new
// namespace named after base, which it returns, granted every node (a
// NodeGrant: the scheduler places nothing in a namespace without one). At
// the end the test's FleetNodes and objects are deleted, so that the next
// test's scheduler sees only its own.
func start(t *testing.T, base string, clock *clocktest.Fake) string {
	t.Helper()
	var opts taskctl.Options
	if clock != nil {
		opts.Clock = clock
	}
	return startWith(t, base, opts, true)
}

// startWith is start with opts (the clock among them; nil: the real one)
// and, unless granted, no NodeGrant for the namespace.
func startWith(t *testing.T, base string, opts taskctl.Options, granted bool) string {
	t.Helper()
	ctx := context.Background()
	ns := fmt.Sprintf("%s-%d", base, namespaces.Add(1))
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	if granted {
		grant(t, "all-"+ns, fleetv1.NodeGrantSpec{Namespaces: []string{ns}})
	}
	skip := true // each test runs its own manager with the same controllers
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: &skip}})
	if err != nil {
		t.Fatal(err)
	}
	opts.DispatchTimeout, opts.RecorderName = time.Minute, "test"
	if err := taskctl.Setup(mgr, opts); err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
		var nodes fleetv1.FleetNodeList
		if err := env.Client.List(ctx, &nodes); err != nil {
			t.Error(err)
		}
		for i := range nodes.Items {
			if err := env.Client.Delete(ctx, &nodes.Items[i]); client.IgnoreNotFound(err) != nil {
				t.Error(err)
			}
		}
		for _, obj := range []client.Object{&batchv1.FleetJob{}, &batchv1.TaskGroup{}, &batchv1.Task{}} {
			if err := env.Client.DeleteAllOf(ctx, obj, client.InNamespace(ns)); err != nil {
				t.Error(err)
			}
		}
	})
	return ns
}

// grant creates a NodeGrant for the rest of the test: the tenancy policy
// an administrator sets.
func grant(t *testing.T, name string, spec fleetv1.NodeGrantSpec) *fleetv1.NodeGrant {
	t.Helper()
	g := &fleetv1.NodeGrant{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
	if err := env.Client.Create(context.Background(), g); err != nil {
		t.Fatalf("create NodeGrant %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := env.Client.Delete(context.Background(), g); client.IgnoreNotFound(err) != nil {
			t.Errorf("delete NodeGrant %s: %v", name, err)
		}
	})
	return g
}

func cpu(v string) corev1.ResourceList {
	return corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(v)}
}

// node creates a FleetNode and writes its status as a hub would.
func node(t *testing.T, name string, phase fleetv1.FleetNodePhase, capacity corev1.ResourceList, labels map[string]string) {
	t.Helper()
	ctx := context.Background()
	n := &fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: fleetv1.FleetNodeSpec{Approved: true}}
	if err := env.Client.Create(ctx, n); err != nil {
		t.Fatal(err)
	}
	n.Status.Phase, n.Status.Capacity, n.Status.Hub = phase, capacity, "hub-x"
	if err := env.Client.Status().Update(ctx, n); err != nil {
		t.Fatal(err)
	}
}

func setNodePhase(t *testing.T, name string, phase fleetv1.FleetNodePhase) {
	t.Helper()
	ctx := context.Background()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var n fleetv1.FleetNode
		if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
			return err
		}
		n.Status.Phase = phase
		return env.Client.Status().Update(ctx, &n)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func getTask(t *testing.T, ns, name string) *batchv1.Task {
	t.Helper()
	var tk batchv1.Task
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &tk); err != nil {
		t.Fatal(err)
	}
	return &tk
}

// hub writes task's status as the hub serving its node does: only for the
// current attempt, which it checks.
func hub(t *testing.T, ns, name string, attempt int32, state batchv1.TaskState, exit *int32, reason string, finish time.Time) {
	t.Helper()
	ctx := context.Background()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var tk batchv1.Task
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &tk); err != nil {
			return err
		}
		if tk.Status.Attempt != attempt || !tk.Status.State.Holds() {
			return fmt.Errorf("task %s is at attempt %d %s, not %d", name, tk.Status.Attempt, tk.Status.State, attempt)
		}
		tk.Status.State, tk.Status.Reason, tk.Status.ExitCode = state, reason, exit
		now := metav1.NewTime(finish)
		if state == batchv1.TaskRunning {
			tk.Status.StartTime = &now
		}
		if state.Final() {
			tk.Status.FinishTime = &now
			tk.Status.OutputTail = "output of attempt " + fmt.Sprint(attempt)
		}
		return env.Client.Status().Update(ctx, &tk)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// poke changes an annotation of the task, as any write to it would, so the
// controllers look at it again after the fake clock moved.
func poke(t *testing.T, ns, name string) {
	t.Helper()
	ctx := context.Background()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var tk batchv1.Task
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &tk); err != nil {
			return err
		}
		if tk.Annotations == nil {
			tk.Annotations = map[string]string{}
		}
		tk.Annotations["test/poke"] = fmt.Sprint(time.Now().UnixNano())
		return env.Client.Update(ctx, &tk)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func waitTask(t *testing.T, ns, name, what string, ok func(*batchv1.Task) bool) *batchv1.Task {
	t.Helper()
	var tk batchv1.Task
	testenv.Eventually(t, waitTimeout, name+": "+what, func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &tk); err != nil {
			return false, err
		}
		if !ok(&tk) {
			return false, fmt.Errorf("state %s attempt %d node %q reason %s: %s", tk.Status.State, tk.Status.Attempt, tk.Status.NodeName, tk.Status.Reason, tk.Status.Message)
		}
		return true, nil
	})
	return &tk
}

func stateIs(s batchv1.TaskState, attempt int32) func(*batchv1.Task) bool {
	return func(tk *batchv1.Task) bool { return tk.Status.State == s && tk.Status.Attempt == attempt }
}

func tasksOf(t *testing.T, ns string) map[string]*batchv1.Task {
	t.Helper()
	var l batchv1.TaskList
	if err := env.Client.List(context.Background(), &l, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	out := map[string]*batchv1.Task{}
	for i := range l.Items {
		out[l.Items[i].Name] = &l.Items[i]
	}
	return out
}

func summary(tasks map[string]*batchv1.Task) string {
	var s []string
	for n, tk := range tasks {
		s = append(s, n+"="+string(tk.Status.State))
	}
	sort.Strings(s)
	return strings.Join(s, " ")
}

func TestFleetJobCascadesThroughGroupsAndTasks(t *testing.T) {
	testenv.Require(t, env)
	ns := start(t, "cascade", nil)
	ctx := context.Background()
	sel := map[string]string{"test": "cascade"}

	job := &batchv1.FleetJob{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "build"}, Spec: batchv1.FleetJobSpec{
		NodeSelector: &metav1.LabelSelector{MatchLabels: sel},
		TaskGroups: []batchv1.TaskGroupTemplate{
			{Name: "a", Count: 3, Template: batchv1.TaskTemplate{Labels: map[string]string{"app": "a"}, Spec: batchv1.TaskSpec{Command: []string{"true"}, Resources: cpu("1")}}},
			{Name: "b", Count: 2, Template: batchv1.TaskTemplate{
				Metadata: batchv1.TemplateMetadata{Labels: map[string]string{"app": "b"}, Annotations: map[string]string{"team": "robots"}},
				Spec:     batchv1.TaskSpec{Command: []string{"true"}, Resources: cpu("1"), Priority: 5}}},
		},
	}}
	if err := env.Client.Create(ctx, job); err != nil {
		t.Fatal(err)
	}

	// Groups and tasks, owned and labelled.
	for _, g := range []struct {
		name  string
		count int
	}{{"build-a", 3}, {"build-b", 2}} {
		var tg batchv1.TaskGroup
		testenv.WaitFor(t, env.Client, waitTimeout, client.ObjectKey{Namespace: ns, Name: g.name}, &tg, nil)
		if o := metav1.GetControllerOf(&tg); o == nil || o.Kind != "FleetJob" || o.UID != job.UID || tg.Labels[batchv1.LabelFleetJob] != "build" {
			t.Errorf("TaskGroup %s: owner %+v labels %v", g.name, o, tg.Labels)
		}
		if tg.Spec.Template.Spec.NodeSelector == nil || tg.Spec.Template.Spec.NodeSelector.MatchLabels["test"] != "cascade" {
			t.Errorf("TaskGroup %s did not inherit the job's nodeSelector: %+v", g.name, tg.Spec.Template.Spec.NodeSelector)
		}
		for i := range g.count {
			name := fmt.Sprintf("%s-%d", g.name, i)
			var tk batchv1.Task
			testenv.WaitFor(t, env.Client, waitTimeout, client.ObjectKey{Namespace: ns, Name: name}, &tk, nil)
			o := metav1.GetControllerOf(&tk)
			if o == nil || o.Kind != "TaskGroup" || o.UID != tg.UID || tk.Labels[batchv1.LabelTaskGroup] != g.name ||
				tk.Labels[batchv1.LabelIndex] != fmt.Sprint(i) || tk.Labels[batchv1.LabelFleetJob] != "build" {
				t.Errorf("Task %s: owner %+v labels %v", name, o, tk.Labels)
			}
		}
	}
	if tk := getTask(t, ns, "build-a-0"); tk.Labels["app"] != "a" {
		t.Errorf("template labels not on the task: %v", tk.Labels)
	}
	if tk := getTask(t, ns, "build-b-1"); tk.Labels["app"] != "b" || tk.Annotations["team"] != "robots" {
		t.Errorf("template metadata not on the task: labels %v, annotations %v", tk.Labels, tk.Annotations)
	}
	// No nodes yet: every task waits, so that all five compete once nodes
	// come.
	for _, name := range []string{"build-a-0", "build-a-1", "build-a-2", "build-b-0", "build-b-1"} {
		tk := waitTask(t, ns, name, "unschedulable", func(tk *batchv1.Task) bool { return tk.Status.Reason == batchv1.ReasonUnschedulable })
		if want := "0/0 nodes are available: no FleetNodes."; tk.Status.Message != want || tk.Status.State != batchv1.TaskPending || tk.Status.Attempt != 1 {
			t.Errorf("%s: %s attempt %d: %q, want %q", name, tk.Status.State, tk.Status.Attempt, tk.Status.Message, want)
		}
	}
	node(t, "cascade-off", fleetv1.FleetNodeOffline, cpu("8"), sel)
	node(t, "cascade-1", fleetv1.FleetNodeOnline, cpu("2"), sel)
	node(t, "cascade-2", fleetv1.FleetNodeOnline, cpu("2"), sel)

	// 5 tasks of 1 cpu, 4 cpus Online: group b (priority 5) first, then the
	// oldest of a; one of a waits, and says why.
	var unplaced string
	testenv.Eventually(t, waitTimeout, "four scheduled, one unschedulable", func(context.Context) (bool, error) {
		tasks := tasksOf(t, ns)
		perNode := map[string]int{}
		unplaced = ""
		for name, tk := range tasks {
			switch {
			case tk.Status.State == batchv1.TaskScheduled:
				perNode[tk.Status.NodeName]++
			case tk.Status.State == batchv1.TaskPending && tk.Status.Reason == batchv1.ReasonUnschedulable:
				unplaced = name
			}
		}
		if perNode["cascade-1"] != 2 || perNode["cascade-2"] != 2 || unplaced == "" {
			return false, fmt.Errorf("per node %v, unplaced %q: %s", perNode, unplaced, summary(tasks))
		}
		return true, nil
	})
	if !strings.HasPrefix(unplaced, "build-a-") {
		t.Errorf("the unplaced task is %s, want one of group a (group b has priority)", unplaced)
	}
	// The scheduler may have written a message while its cache knew only
	// some of the nodes; the next loop brings it up to date.
	tk := waitTask(t, ns, unplaced, "the message of all three nodes", func(tk *batchv1.Task) bool {
		return tk.Status.Message == "0/3 nodes are available: 2 insufficient cpu, 1 Offline."
	})
	if c := meta.FindStatusCondition(tk.Status.Conditions, taskctl.ConditionScheduled); c == nil || c.Status != metav1.ConditionFalse || c.Reason != batchv1.ReasonUnschedulable {
		t.Errorf("Scheduled condition = %+v", c)
	}
	testenv.Eventually(t, waitTimeout, "a FailedScheduling Event", func(ctx context.Context) (bool, error) {
		var evs eventsv1.EventList
		if err := env.Client.List(ctx, &evs, client.InNamespace(ns)); err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Regarding.Name == unplaced && e.Reason == taskctl.ReasonFailedScheduling && strings.Contains(e.Note, "insufficient cpu") {
				return true, nil
			}
		}
		return false, nil
	})

	var fj batchv1.FleetJob
	testenv.WaitFor(t, env.Client, waitTimeout, client.ObjectKeyFromObject(job), &fj, func(client.Object) bool {
		c := fj.Status.Counts
		// Placed on nodes is running (issue #21), though no process started yet.
		return fj.Status.Phase == batchv1.GroupRunning && fj.Status.Desired == 5 && c.Total == 5 && c.Scheduled == 4 && c.Pending == 1 && len(fj.Status.Groups) == 2
	})

	// The hub starts the four.
	tasks := tasksOf(t, ns)
	for name, tk := range tasks {
		if tk.Status.State == batchv1.TaskScheduled {
			hub(t, ns, name, 1, batchv1.TaskDispatching, nil, "", time.Now())
			hub(t, ns, name, 1, batchv1.TaskRunning, nil, "", time.Now())
		}
	}
	testenv.WaitFor(t, env.Client, waitTimeout, client.ObjectKeyFromObject(job), &fj, func(client.Object) bool {
		return fj.Status.Phase == batchv1.GroupRunning && fj.Status.Counts.Running == 4
	})
	var ga batchv1.TaskGroup
	testenv.WaitFor(t, env.Client, waitTimeout, client.ObjectKey{Namespace: ns, Name: "build-a"}, &ga, func(client.Object) bool {
		return ga.Status.Phase == batchv1.GroupRunning && ga.Status.Counts.Running == 2 && ga.Status.Counts.Pending == 1 && ga.Status.Counts.Total == 3
	})

	// One finishes: its cpu goes to the waiting task.
	const first = "build-b-0" // group b has priority: scheduled
	hub(t, ns, first, 1, batchv1.TaskCompleted, ptr(int32(0)), "", time.Now())
	placed := waitTask(t, ns, unplaced, "scheduled once a cpu is free", stateIs(batchv1.TaskScheduled, 1))
	if placed.Status.NodeName != tasks[first].Status.NodeName {
		t.Errorf("placed on %s, want %s where the cpu was freed", placed.Status.NodeName, tasks[first].Status.NodeName)
	}
	hub(t, ns, unplaced, 1, batchv1.TaskRunning, nil, "", time.Now())

	// All complete but one, which fails (restartPolicy Never): a Failed job.
	for name := range tasks {
		if name == first {
			continue
		}
		if name == "build-b-1" {
			hub(t, ns, name, 1, batchv1.TaskFailed, ptr(int32(2)), "ExitCode", time.Now())
			continue
		}
		hub(t, ns, name, 1, batchv1.TaskCompleted, ptr(int32(0)), "", time.Now())
	}
	testenv.WaitFor(t, env.Client, waitTimeout, client.ObjectKeyFromObject(job), &fj, func(client.Object) bool {
		return fj.Status.Phase == batchv1.GroupFailed
	})
	c := fj.Status.Counts
	if c.Total != 5 || c.Completed != 4 || c.Failed != 1 {
		t.Errorf("job counts %+v", c)
	}
	want := []batchv1.GroupSummary{
		{Name: "a", Phase: batchv1.GroupCompleted, Desired: 3, Counts: batchv1.TaskCounts{Total: 3, Completed: 3}},
		{Name: "b", Phase: batchv1.GroupFailed, Desired: 2, Counts: batchv1.TaskCounts{Total: 2, Completed: 1, Failed: 1}},
	}
	if fmt.Sprint(fj.Status.Groups) != fmt.Sprint(want) {
		t.Errorf("groups = %+v, want %+v", fj.Status.Groups, want)
	}
	if cond := meta.FindStatusCondition(fj.Status.Conditions, taskctl.ConditionComplete); cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != taskctl.ReasonTasksFailed {
		t.Errorf("Complete condition = %+v", cond)
	}
	testenv.Eventually(t, waitTimeout, "the job's phase Events", func(ctx context.Context) (bool, error) {
		var evs eventsv1.EventList
		if err := env.Client.List(ctx, &evs, client.InNamespace(ns)); err != nil {
			return false, err
		}
		seen := map[string]bool{}
		for _, e := range evs.Items {
			if e.Regarding.Kind == "FleetJob" && e.Regarding.Name == "build" {
				seen[e.Reason+"/"+e.Type] = true
			}
		}
		if !seen["Running/Normal"] || !seen["Failed/Warning"] {
			return false, fmt.Errorf("events seen: %v", seen)
		}
		return true, nil
	})
	if tk := getTask(t, ns, "build-b-1"); tk.Status.State != batchv1.TaskFailed || tk.Status.Reason != "ExitCode" || tk.Status.Attempt != 1 {
		t.Errorf("failed task (restartPolicy Never) = %+v", tk.Status)
	}

	// Deleting the job deletes its groups and their tasks (no garbage
	// collector in the embedded control plane).
	if err := env.Client.Delete(ctx, &fj); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "groups and tasks deleted with the job", func(ctx context.Context) (bool, error) {
		var gl batchv1.TaskGroupList
		if err := env.Client.List(ctx, &gl, client.InNamespace(ns)); err != nil {
			return false, err
		}
		if n := len(tasksOf(t, ns)); len(gl.Items) > 0 || n > 0 {
			return false, fmt.Errorf("%d groups, %d tasks left", len(gl.Items), n)
		}
		return true, nil
	})
}

func ptr[T any](v T) *T { return &v }

// counter reads a counter from controller-runtime's registry (the manager's
// /metrics); labels are name=value pairs the series must carry.
func counter(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					found = found || lp.GetName() == labels[i] && lp.GetValue() == labels[i+1]
				}
				if !found {
					continue series
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// A TaskGroup on its own; OnFailure with a backoff measured on the fake
// clock, then attempts exhausted.
func TestRestartAfterBackoffThenAttemptsExhausted(t *testing.T) {
	testenv.Require(t, env)
	clock := clocktest.New(time.Now())
	ns := start(t, "restart", clock)
	ctx := context.Background()
	node(t, "restart-1", fleetv1.FleetNodeOnline, cpu("4"), nil)
	g := &batchv1.TaskGroup{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "flaky"}, Spec: batchv1.TaskGroupSpec{Count: 1, Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{
		Command: []string{"false"}, RestartPolicy: batchv1.RestartOnFailure, MaxAttempts: 2, Backoff: &metav1.Duration{Duration: 2 * time.Minute},
	}}}}
	if err := env.Client.Create(ctx, g); err != nil {
		t.Fatal(err)
	}
	const name = "flaky-0"
	restarts, exhausted := counter(t, "drover_task_restarts_total"), counter(t, "drover_tasks_failed_total", "reason", batchv1.ReasonAttemptsSpent)
	waitTask(t, ns, name, "scheduled", stateIs(batchv1.TaskScheduled, 1))
	hub(t, ns, name, 1, batchv1.TaskRunning, nil, "", clock.Now())
	clock.Step(time.Second)
	finish := clock.Now()
	hub(t, ns, name, 1, batchv1.TaskFailed, ptr(int32(3)), "ExitCode", finish)

	tk := waitTask(t, ns, name, "waiting out its backoff", func(tk *batchv1.Task) bool {
		return tk.Status.State == batchv1.TaskPending && tk.Status.Attempt == 2 && tk.Status.Reason == batchv1.ReasonBackoff
	})
	// The API keeps times to the second.
	if want := finish.Truncate(time.Second).Add(2 * time.Minute); tk.Status.NextAttemptTime == nil || !tk.Status.NextAttemptTime.Time.Equal(want) {
		t.Errorf("nextAttemptTime = %v, want %v", tk.Status.NextAttemptTime, want)
	}
	if h := tk.Status.History; len(h) != 1 || h[0].Attempt != 1 || h[0].Node != "restart-1" || h[0].State != batchv1.TaskFailed || h[0].ExitCode == nil || *h[0].ExitCode != 3 || h[0].Reason != "ExitCode" {
		t.Errorf("history = %+v", h)
	}
	if tk.Status.NodeName != "" || tk.Status.ExitCode != nil || tk.Status.OutputTail != "" {
		t.Errorf("attempt 2 keeps attempt 1's details: %+v", tk.Status)
	}
	var tg batchv1.TaskGroup
	testenv.WaitFor(t, env.Client, waitTimeout, client.ObjectKeyFromObject(g), &tg, func(client.Object) bool {
		return tg.Status.Phase == batchv1.GroupRunning && tg.Status.Counts.Pending == 1
	})

	// The clock has not moved: it stays Pending whatever happens to it.
	poke(t, ns, name)
	testenv.Never(t, 2*time.Second, "scheduled before the backoff passed", func(ctx context.Context) (bool, error) {
		var tk batchv1.Task
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &tk)
		return err == nil && tk.Status.State != batchv1.TaskPending, nil
	})

	clock.Step(2*time.Minute + 2*time.Second)
	poke(t, ns, name)
	waitTask(t, ns, name, "attempt 2 scheduled after the backoff", stateIs(batchv1.TaskScheduled, 2))
	hub(t, ns, name, 2, batchv1.TaskFailed, ptr(int32(3)), "ExitCode", clock.Now())
	tk = waitTask(t, ns, name, "attempts exhausted", func(tk *batchv1.Task) bool {
		return tk.Status.State == batchv1.TaskFailed && tk.Status.Reason == batchv1.ReasonAttemptsSpent
	})
	if tk.Status.Attempt != 2 || !strings.Contains(tk.Status.Message, "ExitCode") || tk.Status.ExitCode == nil || *tk.Status.ExitCode != 3 {
		t.Errorf("final status = %+v", tk.Status)
	}
	if c := meta.FindStatusCondition(tk.Status.Conditions, batchv1.ConditionFailed); c == nil || c.Status != metav1.ConditionTrue || c.Reason != batchv1.ReasonAttemptsSpent {
		t.Errorf("Failed condition %+v, want True, %s", c, batchv1.ReasonAttemptsSpent)
	}
	// The controller counts a change after its write returns: the test may
	// read the status first.
	testkit.Eventually(t, waitTimeout, func() string {
		if r, e := counter(t, "drover_task_restarts_total")-restarts, counter(t, "drover_tasks_failed_total", "reason", batchv1.ReasonAttemptsSpent)-exhausted; r != 1 || e != 1 {
			return fmt.Sprintf("metrics: %v restarts, %v exhausted; want 1 and 1", r, e)
		}
		return ""
	})
	testenv.WaitFor(t, env.Client, waitTimeout, client.ObjectKeyFromObject(g), &tg, func(client.Object) bool {
		return tg.Status.Phase == batchv1.GroupFailed && tg.Status.Counts.Failed == 1 && meta.IsStatusConditionTrue(tg.Status.Conditions, taskctl.ConditionFailed)
	})

	// Final is final.
	clock.Step(time.Hour)
	poke(t, ns, name)
	testenv.Never(t, time.Second, "a final task changes", func(ctx context.Context) (bool, error) {
		var tk batchv1.Task
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &tk)
		return err == nil && (tk.Status.State != batchv1.TaskFailed || tk.Status.Attempt != 2), nil
	})

	// Scale up: a second task appears and is scheduled.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(g), g); err != nil {
			return err
		}
		g.Spec.Count = 2
		return env.Client.Update(ctx, g)
	}); err != nil {
		t.Fatal(err)
	}
	waitTask(t, ns, "flaky-1", "scheduled after a scale-up", stateIs(batchv1.TaskScheduled, 1))
	testenv.WaitFor(t, env.Client, waitTimeout, client.ObjectKeyFromObject(g), &tg, func(client.Object) bool {
		return tg.Status.Phase == batchv1.GroupRunning && tg.Status.Counts.Total == 2
	})
}

func TestNodeOfflineReschedulesOrFails(t *testing.T) {
	testenv.Require(t, env)
	ns := start(t, "offline", nil)
	ctx := context.Background()
	node(t, "offline-1", fleetv1.FleetNodeOnline, cpu("4"), nil)
	mk := func(name string, policy batchv1.ReschedulePolicy) {
		tk := &batchv1.Task{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: batchv1.TaskSpec{Command: []string{"sleep", "1000"}, ReschedulePolicy: policy}}
		if err := env.Client.Create(ctx, tk); err != nil {
			t.Fatal(err)
		}
	}
	lostBefore := counter(t, "drover_task_reschedules_total", "reason", batchv1.ReasonNodeLost)
	mk("moves", batchv1.RescheduleOnNodeLost)
	mk("stays", batchv1.RescheduleNever)
	for _, n := range []string{"moves", "stays"} {
		waitTask(t, ns, n, "scheduled", stateIs(batchv1.TaskScheduled, 1))
		hub(t, ns, n, 1, batchv1.TaskDispatching, nil, "", time.Now())
		hub(t, ns, n, 1, batchv1.TaskRunning, nil, "", time.Now())
	}
	node(t, "offline-2", fleetv1.FleetNodeOnline, cpu("4"), nil)
	setNodePhase(t, "offline-1", fleetv1.FleetNodeOffline)

	tk := waitTask(t, ns, "moves", "attempt 2 on the other node", func(tk *batchv1.Task) bool {
		return tk.Status.State == batchv1.TaskScheduled && tk.Status.Attempt == 2
	})
	if tk.Status.NodeName != "offline-2" {
		t.Errorf("attempt 2 on %s", tk.Status.NodeName)
	}
	if h := tk.Status.History; len(h) != 1 || h[0].Attempt != 1 || h[0].Node != "offline-1" || h[0].State != batchv1.TaskFailed || h[0].StartTime == nil || h[0].Reason != batchv1.ReasonNodeLost || h[0].FinishTime == nil {
		t.Errorf("history = %+v", h)
	}
	testkit.Eventually(t, waitTimeout, func() string { // counted after the write: see above
		if d := counter(t, "drover_task_reschedules_total", "reason", batchv1.ReasonNodeLost) - lostBefore; d != 1 {
			return fmt.Sprintf("drover_task_reschedules_total{reason=NodeLost} grew by %v, want 1", d)
		}
		return ""
	})
	tk = waitTask(t, ns, "stays", "failed with its node", func(tk *batchv1.Task) bool { return tk.Status.State == batchv1.TaskFailed })
	if tk.Status.Reason != batchv1.ReasonNodeLost || tk.Status.Attempt != 1 || len(tk.Status.History) != 1 {
		t.Errorf("status = %+v", tk.Status)
	}

	// The node comes back: nothing returns to it (the hub's work list
	// holds attempt 2 for offline-2 only).
	setNodePhase(t, "offline-1", fleetv1.FleetNodeOnline)
	testenv.Never(t, time.Second, "a task goes back to the old node", func(ctx context.Context) (bool, error) {
		var a, b batchv1.Task
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "moves"}, &a); err != nil {
			return false, nil
		}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "stays"}, &b); err != nil {
			return false, nil
		}
		return a.Status.NodeName != "offline-2" || a.Status.Attempt != 2 || b.Status.State != batchv1.TaskFailed, nil
	})
}

func TestDispatchTimeoutStartsANewAttempt(t *testing.T) {
	testenv.Require(t, env)
	clock := clocktest.New(time.Now())
	ns := start(t, "dispatch", clock) // dispatch timeout 1m
	ctx := context.Background()
	node(t, "dispatch-1", fleetv1.FleetNodeOnline, nil, nil)
	tk := &batchv1.Task{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "stuck"}, Spec: batchv1.TaskSpec{Command: []string{"true"}}}
	if err := env.Client.Create(ctx, tk); err != nil {
		t.Fatal(err)
	}
	waitTask(t, ns, "stuck", "scheduled", stateIs(batchv1.TaskScheduled, 1))
	hub(t, ns, "stuck", 1, batchv1.TaskDispatching, nil, "", clock.Now())
	clock.Step(30 * time.Second)
	poke(t, ns, "stuck")
	testenv.Never(t, time.Second, "timed out early", func(ctx context.Context) (bool, error) {
		var tk batchv1.Task
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "stuck"}, &tk)
		return err == nil && tk.Status.Attempt != 1, nil
	})
	clock.Step(31 * time.Second)
	poke(t, ns, "stuck")
	got := waitTask(t, ns, "stuck", "attempt 2", func(tk *batchv1.Task) bool { return tk.Status.Attempt == 2 && tk.Status.State == batchv1.TaskScheduled })
	if h := got.Status.History; len(h) != 1 || h[0].Reason != taskctl.ReasonDispatchTimeout || h[0].State != batchv1.TaskFailed || h[0].StartTime != nil {
		t.Errorf("history = %+v", h)
	}
}

// Lowering a group's count deletes the tasks above it; a group dropped from
// the job is deleted with its tasks.
func TestJobScaleDownAndGroupRemoval(t *testing.T) {
	testenv.Require(t, env)
	ns := start(t, "scale", nil)
	ctx := context.Background()
	tmpl := batchv1.TaskTemplate{Spec: batchv1.TaskSpec{Command: []string{"true"}}}
	job := &batchv1.FleetJob{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sc"}, Spec: batchv1.FleetJobSpec{
		TaskGroups: []batchv1.TaskGroupTemplate{{Name: "x", Count: 3, Template: tmpl}, {Name: "y", Count: 1, Template: tmpl}},
	}}
	if err := env.Client.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	names := func() string {
		var s []string
		for n := range tasksOf(t, ns) {
			s = append(s, n)
		}
		sort.Strings(s)
		return strings.Join(s, " ")
	}
	testenv.Eventually(t, waitTimeout, "four tasks", func(context.Context) (bool, error) {
		if got := names(); got != "sc-x-0 sc-x-1 sc-x-2 sc-y-0" {
			return false, fmt.Errorf("tasks: %s", got)
		}
		return true, nil
	})
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(job), job); err != nil {
			return err
		}
		job.Spec.TaskGroups = []batchv1.TaskGroupTemplate{{Name: "x", Count: 1, Template: tmpl}}
		return env.Client.Update(ctx, job)
	}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "one task left", func(ctx context.Context) (bool, error) {
		if got := names(); got != "sc-x-0" {
			return false, fmt.Errorf("tasks: %s", got)
		}
		var gl batchv1.TaskGroupList
		if err := env.Client.List(ctx, &gl, client.InNamespace(ns)); err != nil {
			return false, err
		}
		if len(gl.Items) != 1 || gl.Items[0].Name != "sc-x" || gl.Items[0].Spec.Count != 1 {
			return false, fmt.Errorf("%d groups", len(gl.Items))
		}
		return true, nil
	})
	var fj batchv1.FleetJob
	testenv.WaitFor(t, env.Client, waitTimeout, client.ObjectKeyFromObject(job), &fj, func(client.Object) bool {
		return fj.Status.Counts.Total == 1 && len(fj.Status.Groups) == 1 && fj.Status.ObservedGeneration == fj.Generation
	})

	// A task deleted by hand is made again, afresh.
	old := getTask(t, ns, "sc-x-0")
	if err := env.Client.Delete(ctx, old); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "sc-x-0 made again", func(ctx context.Context) (bool, error) {
		var tk batchv1.Task
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(old), &tk); err != nil {
			return false, err
		}
		return tk.UID != old.UID, nil
	})
}

// A group spread over zones: the big node alone would take every task by
// balance; maxSkew 1 keeps the zones within one task of each other.
func TestGroupSpreadsOverZones(t *testing.T) {
	testenv.Require(t, env)
	ns := start(t, "spread", nil)
	ctx := context.Background()
	node(t, "spread-big", fleetv1.FleetNodeOnline, cpu("100"), map[string]string{"zone": "a"})
	node(t, "spread-small", fleetv1.FleetNodeOnline, cpu("4"), map[string]string{"zone": "b"})
	g := &batchv1.TaskGroup{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sp"}, Spec: batchv1.TaskGroupSpec{Count: 4, Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{
		Command: []string{"true"}, Resources: cpu("1"), Spread: &batchv1.SpreadConstraint{TopologyKey: "zone", MaxSkew: 1},
	}}}}
	if err := env.Client.Create(ctx, g); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "two tasks per zone", func(context.Context) (bool, error) {
		perNode := map[string]int{}
		for _, tk := range tasksOf(t, ns) {
			if tk.Status.State == batchv1.TaskScheduled {
				perNode[tk.Status.NodeName]++
			}
		}
		if perNode["spread-big"] != 2 || perNode["spread-small"] != 2 {
			return false, fmt.Errorf("per node: %v", perNode)
		}
		return true, nil
	})
}

// A finished job stays as it ended: a task deleted afterwards is not made
// again and run a second time (a finished batch/v1 Job keeps its Pods'
// count too). While it runs, tasks on nodes count as active.
func TestFinishedJobStaysFinished(t *testing.T) {
	testenv.Require(t, env)
	ns := start(t, "settled", nil)
	ctx := context.Background()
	node(t, "settled-1", fleetv1.FleetNodeOnline, cpu("4"), nil)
	job := &batchv1.FleetJob{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "once"}, Spec: batchv1.FleetJobSpec{
		TaskGroups: []batchv1.TaskGroupTemplate{{Name: "g", Count: 2, Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{Command: []string{"true"}}}}},
	}}
	if err := env.Client.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"once-g-0", "once-g-1"} {
		waitTask(t, ns, name, "scheduled", stateIs(batchv1.TaskScheduled, 1))
	}
	var fj batchv1.FleetJob
	testenv.WaitFor(t, env.Client, waitTimeout, client.ObjectKeyFromObject(job), &fj, func(client.Object) bool {
		return fj.Status.Counts.Active == 2 && fj.Status.Counts.Scheduled == 2
	})
	for _, name := range []string{"once-g-0", "once-g-1"} {
		hub(t, ns, name, 1, batchv1.TaskCompleted, ptr(int32(0)), "Completed", time.Now())
	}
	testenv.WaitFor(t, env.Client, waitTimeout, client.ObjectKeyFromObject(job), &fj, func(client.Object) bool {
		return fj.Status.Phase == batchv1.GroupCompleted && fj.Status.Counts.Completed == 2 && fj.Status.Counts.Active == 0
	})
	if err := env.Client.Delete(ctx, getTask(t, ns, "once-g-0")); err != nil {
		t.Fatal(err)
	}
	testenv.Never(t, 2*time.Second, "a finished job's deleted task is made again", func(ctx context.Context) (bool, error) {
		var tk batchv1.Task
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "once-g-0"}, &tk)
		return err == nil, nil
	})
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(job), &fj); err != nil {
		t.Fatal(err)
	}
	if fj.Status.Phase != batchv1.GroupCompleted || fj.Status.Counts.Completed != 2 {
		t.Errorf("job after a task was deleted: phase %s, counts %+v", fj.Status.Phase, fj.Status.Counts)
	}
	// Edited after it finished: group g shrinks to 1 (its index 0 is made
	// again) and a group h of 1 is added. Until the groups have caught up
	// with their new specs their counts lag in opposite directions (g's
	// still says 2 completed, h has none) and add up to the job's 2: the
	// job must not end on them.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(job), &fj); err != nil {
			return err
		}
		fj.Spec.TaskGroups[0].Count = 1
		fj.Spec.TaskGroups = append(fj.Spec.TaskGroups, batchv1.TaskGroupTemplate{Name: "h", Count: 1,
			Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{Command: []string{"true"}}}})
		return env.Client.Update(ctx, &fj)
	}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"once-g-0", "once-h-0"} {
		waitTask(t, ns, name, "scheduled after the edit", stateIs(batchv1.TaskScheduled, 1))
	}
	testenv.WaitFor(t, env.Client, waitTimeout, client.ObjectKeyFromObject(job), &fj, func(client.Object) bool {
		return fj.Status.ObservedGeneration == fj.Generation && fj.Status.Counts.Active == 2
	})
	if fj.Status.Phase.Final() {
		t.Fatalf("job %s with 2 tasks scheduled", fj.Status.Phase)
	}
	for _, name := range []string{"once-g-0", "once-h-0"} {
		hub(t, ns, name, 1, batchv1.TaskCompleted, ptr(int32(0)), "Completed", time.Now())
	}
	testenv.WaitFor(t, env.Client, waitTimeout, client.ObjectKeyFromObject(job), &fj, func(client.Object) bool {
		return fj.Status.Phase == batchv1.GroupCompleted && fj.Status.Counts.Completed == 2 && fj.Status.Counts.Total == 2
	})

	// `kubectl delete --cascade=foreground`: the job goes last, once its
	// groups and tasks are gone (the control plane's garbage collector
	// removes the finalizer the apiserver put on it).
	if err := env.Client.Delete(ctx, &fj, client.PropagationPolicy(metav1.DeletePropagationForeground)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "the job, its group and its task gone", func(ctx context.Context) (bool, error) {
		var groups batchv1.TaskGroupList
		var tasks batchv1.TaskList
		if err := env.Client.List(ctx, &groups, client.InNamespace(ns)); err != nil {
			return false, err
		}
		if err := env.Client.List(ctx, &tasks, client.InNamespace(ns)); err != nil {
			return false, err
		}
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(job), &batchv1.FleetJob{})
		if !apierrors.IsNotFound(err) || len(groups.Items)+len(tasks.Items) > 0 {
			return false, fmt.Errorf("job: %v; %d groups, %d tasks left", err, len(groups.Items), len(tasks.Items))
		}
		return true, nil
	})
}

// A task being deleted still holds its node's resources until it is gone
// (its hub may still be stopping the process): nothing is placed in its
// room before then.
func TestDeletingTaskHoldsItsResources(t *testing.T) {
	testenv.Require(t, env)
	ns := start(t, "deleting", nil)
	ctx := context.Background()
	node(t, "deleting-1", fleetv1.FleetNodeOnline, cpu("1"), nil)
	mk := func(name string) *batchv1.Task {
		tk := &batchv1.Task{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: batchv1.TaskSpec{Command: []string{"sleep", "60"}, Resources: cpu("1")}}
		if err := env.Client.Create(ctx, tk); err != nil {
			t.Fatal(err)
		}
		return tk
	}
	mk("first")
	waitTask(t, ns, "first", "scheduled", stateIs(batchv1.TaskScheduled, 1))
	hub(t, ns, "first", 1, batchv1.TaskRunning, nil, "", time.Now())
	// The hub's cleanup finalizer keeps it while the process is stopped.
	first := getTask(t, ns, "first")
	first.Finalizers = append(first.Finalizers, "test.drover.io/hold")
	if err := env.Client.Update(ctx, first); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, first); err != nil {
		t.Fatal(err)
	}
	mk("second")
	waitTask(t, ns, "second", "unschedulable while the first is stopping", func(tk *batchv1.Task) bool {
		return tk.Status.Reason == batchv1.ReasonUnschedulable && strings.Contains(tk.Status.Message, "insufficient cpu")
	})
	first = getTask(t, ns, "first")
	first.Finalizers = nil
	if err := env.Client.Update(ctx, first); err != nil {
		t.Fatal(err)
	}
	waitTask(t, ns, "second", "scheduled once the first is gone", stateIs(batchv1.TaskScheduled, 1))
}

// TestActiveDeadline: a job whose group cannot finish (no node matches it)
// ends at activeDeadlineSeconds: that group's unfinished tasks are deleted
// and it ends Failed, reason DeadlineExceeded, and so does the job; a group
// that finished before is left as it ended.
func TestActiveDeadline(t *testing.T) {
	clock := clocktest.New(time.Now())
	ns := start(t, "deadline", clock)
	ctx := context.Background()
	sel := map[string]string{"test": "deadline"}
	node(t, "deadline-1", fleetv1.FleetNodeOnline, cpu("4"), sel)
	job := &batchv1.FleetJob{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "dl"}, Spec: batchv1.FleetJobSpec{
		ActiveDeadlineSeconds: ptr(int64(60)),
		TaskGroups: []batchv1.TaskGroupTemplate{
			{Name: "quick", Count: 1, Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{Command: []string{"true"},
				NodeSelector: &metav1.LabelSelector{MatchLabels: sel}}}},
			{Name: "stuck", Count: 2, Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{Command: []string{"true"},
				NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"test": "nowhere"}}}}},
		},
	}}
	if err := env.Client.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	waitTask(t, ns, "dl-quick-0", "scheduled", stateIs(batchv1.TaskScheduled, 1))
	hub(t, ns, "dl-quick-0", 1, batchv1.TaskCompleted, ptr(int32(0)), "Completed", clock.Now())
	for _, name := range []string{"dl-stuck-0", "dl-stuck-1"} {
		waitTask(t, ns, name, "unschedulable", func(tk *batchv1.Task) bool { return tk.Status.Reason == batchv1.ReasonUnschedulable })
	}
	var quick batchv1.TaskGroup
	testenv.WaitFor(t, env.Client, waitTimeout, client.ObjectKey{Namespace: ns, Name: "dl-quick"}, &quick, func(client.Object) bool {
		return quick.Status.Phase == batchv1.GroupCompleted
	})

	// The group was made a moment after the fake clock started.
	clock.Step(90 * time.Second)
	poke(t, ns, "dl-stuck-0")
	var stuck batchv1.TaskGroup
	testenv.WaitFor(t, env.Client, waitTimeout, client.ObjectKey{Namespace: ns, Name: "dl-stuck"}, &stuck, func(client.Object) bool {
		c := meta.FindStatusCondition(stuck.Status.Conditions, taskctl.ConditionFailed)
		return stuck.Status.Phase == batchv1.GroupFailed && c != nil && c.Status == metav1.ConditionTrue && c.Reason == batchv1.ReasonDeadlineExceeded
	})
	if c := stuck.Status.Counts; c.Failed != 2 || c.Total != 2 {
		t.Errorf("counts %+v, want the 2 stopped tasks failed", c)
	}
	testenv.Eventually(t, waitTimeout, "the unfinished tasks deleted", func(ctx context.Context) (bool, error) {
		var list batchv1.TaskList
		if err := env.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{batchv1.LabelTaskGroup: "dl-stuck"}); err != nil {
			return false, err
		}
		return len(list.Items) == 0, nil
	})
	var j batchv1.FleetJob
	testenv.WaitFor(t, env.Client, waitTimeout, client.ObjectKeyFromObject(job), &j, func(client.Object) bool {
		return j.Status.Phase == batchv1.GroupFailed && meta.IsStatusConditionTrue(j.Status.Conditions, taskctl.ConditionFailed)
	})
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "dl-quick"}, &quick); err != nil || quick.Status.Phase != batchv1.GroupCompleted {
		t.Errorf("the group that finished in time: %s, %v", quick.Status.Phase, err)
	}
	if tk := getTask(t, ns, "dl-quick-0"); tk.Status.State != batchv1.TaskCompleted {
		t.Errorf("the finished task: %s", tk.Status.State)
	}
}
