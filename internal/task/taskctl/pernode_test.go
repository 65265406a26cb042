package taskctl_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/clock/clocktest"
	"github.com/drover-fleet/drover/internal/task/taskctl"
	"github.com/drover-fleet/drover/internal/testenv"
)

// setNodeLabels replaces a node's labels, as `kubectl label` would.
func setNodeLabels(t *testing.T, name string, labels map[string]string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var n fleetv1.FleetNode
		if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, &n); err != nil {
			return err
		}
		n.Labels = labels
		return env.Client.Update(context.Background(), &n)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// waitTasks waits until the namespace's tasks, by name, are on the nodes
// want gives (spec.nodeName), and returns them.
func waitTasks(t *testing.T, ns string, want map[string]string) map[string]*batchv1.Task {
	t.Helper()
	var got map[string]*batchv1.Task
	testenv.Eventually(t, waitTimeout, fmt.Sprintf("tasks %v", want), func(ctx context.Context) (bool, error) {
		got = tasksOf(t, ns)
		have := map[string]string{}
		for name, tk := range got {
			if tk.DeletionTimestamp == nil {
				have[name] = tk.Spec.NodeName
			}
		}
		if fmt.Sprint(have) != fmt.Sprint(want) {
			return false, fmt.Errorf("tasks on nodes: %v", have)
		}
		return true, nil
	})
	return got
}

func waitGroup(t *testing.T, ns, name, what string, ok func(*batchv1.TaskGroup) bool) *batchv1.TaskGroup {
	t.Helper()
	var g batchv1.TaskGroup
	testenv.Eventually(t, waitTimeout, name+": "+what, func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &g); err != nil {
			return false, err
		}
		if g.Status.ObservedGeneration != g.Generation || !ok(&g) {
			return false, fmt.Errorf("phase %s desired %d counts %+v", g.Status.Phase, g.Status.Desired, g.Status.Counts)
		}
		return true, nil
	})
	return &g
}

// A perNode group (Nomad's system job) runs one task on every node that
// matches its selector and is granted to its namespace: it waits while
// none matches, gains a task when a node joins, comes Online or is
// labelled to match, loses the task of a node that stops matching, keeps
// (pinned) the task of a node that goes Offline, and once every task has
// ended is done: a node joining later gets none.
func TestPerNodeGroupFollowsTheMatchingNodes(t *testing.T) {
	testenv.Require(t, env)
	ns := startWith(t, "pernode", taskctl.Options{}, false)
	grant(t, "granted-"+ns, fleetv1.NodeGrantSpec{Namespaces: []string{ns},
		NodeSelector: metav1.LabelSelector{MatchLabels: map[string]string{"granted": ns}}})
	robot := func(extra ...string) map[string]string {
		l := map[string]string{"role": "robot-" + ns, "granted": ns}
		for i := 0; i < len(extra); i += 2 {
			l[extra[i]] = extra[i+1]
			if extra[i+1] == "" {
				delete(l, extra[i])
			}
		}
		return l
	}
	g := &batchv1.TaskGroup{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "agent"}, Spec: batchv1.TaskGroupSpec{PerNode: true,
		Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{Command: []string{"true"}, ReschedulePolicy: batchv1.RescheduleOnNodeLost,
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "robot-" + ns}}}}}}
	create(t, g)

	// Nothing matches yet: Pending, not Completed with zero tasks.
	waitGroup(t, ns, "agent", "waiting for a node", func(g *batchv1.TaskGroup) bool {
		return g.Status.Phase == batchv1.GroupPending && g.Status.Desired == 0
	})
	testenv.Never(t, time.Second, "the empty perNode group ends", func(ctx context.Context) (bool, error) {
		var g batchv1.TaskGroup
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "agent"}, &g)
		return err == nil && g.Status.Phase.Final(), nil
	})

	r1, r2, r3, r4, r5 := ns+"-r1", ns+"-r2", ns+"-r3", ns+"-r4", ns+"-r5"
	node(t, r1, fleetv1.FleetNodeOnline, nil, robot())
	node(t, r2, fleetv1.FleetNodeOnline, nil, robot("granted", "")) // not granted
	node(t, r3, fleetv1.FleetNodeOnline, nil, robot("role", ""))    // not a robot
	node(t, r4, fleetv1.FleetNodeOffline, nil, robot())             // not Online
	tasks := waitTasks(t, ns, map[string]string{"agent-" + r1: r1})
	if tk := tasks["agent-"+r1]; tk.Labels[batchv1.LabelNode] != r1 || tk.Labels[batchv1.LabelTaskGroup] != "agent" {
		t.Errorf("labels of the task: %v", tk.Labels)
	}
	waitTask(t, ns, "agent-"+r1, "scheduled on its node", func(tk *batchv1.Task) bool {
		return tk.Status.State == batchv1.TaskScheduled && tk.Status.NodeName == r1
	})
	// Scheduled is Running for the group (issue #21: not Pending).
	waitGroup(t, ns, "agent", "running on r1", func(g *batchv1.TaskGroup) bool {
		return g.Status.Phase == batchv1.GroupRunning && g.Status.Desired == 1 && g.Status.Counts.Scheduled == 1
	})

	// r4 comes Online, r3 is labelled a robot: each gets its task.
	setNodePhase(t, r4, fleetv1.FleetNodeOnline)
	setNodeLabels(t, r3, robot())
	waitTasks(t, ns, map[string]string{"agent-" + r1: r1, "agent-" + r3: r3, "agent-" + r4: r4})

	// r1 is no robot any more: its task goes. r4 goes Offline: its task
	// stays, pinned to it (not moved to r3).
	setNodeLabels(t, r1, robot("role", ""))
	waitTask(t, ns, "agent-"+r4, "scheduled", stateIs(batchv1.TaskScheduled, 1))
	setNodePhase(t, r4, fleetv1.FleetNodeOffline)
	waitTasks(t, ns, map[string]string{"agent-" + r3: r3, "agent-" + r4: r4})
	waitTask(t, ns, "agent-"+r4, "a new attempt waiting for its node", func(tk *batchv1.Task) bool {
		return tk.Status.Attempt == 2 && tk.Status.State == batchv1.TaskPending && strings.Contains(tk.Status.Message, "did not match nodeName")
	})
	waitGroup(t, ns, "agent", "two nodes", func(g *batchv1.TaskGroup) bool { return g.Status.Desired == 2 })

	// Both end; the group is done, and a robot joining later gets nothing.
	setNodePhase(t, r4, fleetv1.FleetNodeOnline)
	for _, n := range []string{r3, r4} {
		name := "agent-" + n
		tk := waitTask(t, ns, name, "scheduled", func(tk *batchv1.Task) bool { return tk.Status.State == batchv1.TaskScheduled })
		hub(t, ns, name, tk.Status.Attempt, batchv1.TaskRunning, nil, "", time.Now())
		hub(t, ns, name, tk.Status.Attempt, batchv1.TaskCompleted, ptr(int32(0)), "", time.Now())
	}
	waitGroup(t, ns, "agent", "completed", func(g *batchv1.TaskGroup) bool {
		return g.Status.Phase == batchv1.GroupCompleted && g.Status.Desired == 2 && g.Status.Counts.Completed == 2
	})
	node(t, r5, fleetv1.FleetNodeOnline, nil, robot())
	testenv.Never(t, time.Second, "a task for a robot that joined after the group ended", func(ctx context.Context) (bool, error) {
		return tasksOf(t, ns)["agent-"+r5] != nil, nil
	})
}

// A FleetJob whose perNode group matches no node yet waits for one; its
// status sums the group's desired tasks.
func TestFleetJobWithPerNodeGroupWaits(t *testing.T) {
	testenv.Require(t, env)
	ns := start(t, "pernodejob", nil)
	job := &batchv1.FleetJob{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fleet"}, Spec: batchv1.FleetJobSpec{
		NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "robot-" + ns}},
		TaskGroups: []batchv1.TaskGroupTemplate{{Name: "every", PerNode: true,
			Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{Command: []string{"true"}}}}},
	}}
	create(t, job)
	waitGroup(t, ns, "fleet-every", "waiting", func(g *batchv1.TaskGroup) bool {
		return g.Spec.PerNode && g.Status.Phase == batchv1.GroupPending
	})
	var fj batchv1.FleetJob
	testenv.WaitFor(t, env.Client, waitTimeout, client.ObjectKeyFromObject(job), &fj, func(client.Object) bool {
		return fj.Status.ObservedGeneration == fj.Generation && fj.Status.Phase == batchv1.GroupPending && len(fj.Status.Groups) == 1
	})
	node(t, ns+"-a", fleetv1.FleetNodeOnline, nil, map[string]string{"role": "robot-" + ns})
	node(t, ns+"-b", fleetv1.FleetNodeOnline, nil, map[string]string{"role": "robot-" + ns})
	testenv.WaitFor(t, env.Client, waitTimeout, client.ObjectKeyFromObject(job), &fj, func(client.Object) bool {
		return fj.Status.Desired == 2 && fj.Status.Groups[0].Desired == 2 && fj.Status.Counts.Scheduled == 2 && fj.Status.Phase == batchv1.GroupRunning
	})
}

// maxPerNode 1 with three tasks and two nodes: one task on each, the third
// Pending as InsufficientNodes (before, two landed on one node).
func TestMaxPerNodeLeavesTheRestPending(t *testing.T) {
	testenv.Require(t, env)
	ns := start(t, "maxpernode", nil)
	node(t, ns+"-a", fleetv1.FleetNodeOnline, cpu("8"), nil)
	node(t, ns+"-b", fleetv1.FleetNodeOnline, cpu("8"), nil)
	create(t, &batchv1.TaskGroup{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "one-each"}, Spec: batchv1.TaskGroupSpec{Count: 3,
		Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{Command: []string{"true"}, Resources: cpu("1"), MaxPerNode: ptr(int32(1))}}}})
	var pending string
	testenv.Eventually(t, waitTimeout, "two placed, one insufficient nodes", func(ctx context.Context) (bool, error) {
		nodes, waiting := map[string]int{}, []string{}
		for name, tk := range tasksOf(t, ns) {
			switch tk.Status.State {
			case batchv1.TaskScheduled:
				nodes[tk.Status.NodeName]++
			case batchv1.TaskPending:
				if tk.Status.Reason == batchv1.ReasonInsufficientNodes {
					waiting = append(waiting, name)
				}
			}
		}
		if len(nodes) != 2 || nodes[ns+"-a"] != 1 || nodes[ns+"-b"] != 1 || len(waiting) != 1 {
			return false, fmt.Errorf("placed %v, insufficient nodes %v", nodes, waiting)
		}
		pending = waiting[0]
		return true, nil
	})
	tk := getTask(t, ns, pending)
	if !strings.Contains(tk.Status.Message, "insufficient nodes for maxPerNode=1") {
		t.Errorf("message %q", tk.Status.Message)
	}
	waitEvent(t, ns, pending, batchv1.ReasonInsufficientNodes, corev1.EventTypeWarning, "maxPerNode")
	waitGroup(t, ns, "one-each", "running", func(g *batchv1.TaskGroup) bool {
		return g.Status.Phase == batchv1.GroupRunning && g.Status.Counts.Pending == 1 && g.Status.Counts.Scheduled == 2
	})
}

// A task with a resource name that is not valid, stored where the
// admission policy was not in force, is not placed: it waits as
// InvalidResources, naming the field (defense in depth).
func TestInvalidResourceNameIsNotPlaced(t *testing.T) {
	testenv.Require(t, env)
	ctx := context.Background()
	ns := start(t, "resname", nil)
	node(t, ns+"-a", fleetv1.FleetNodeOnline, corev1.ResourceList{"memroy": resource.MustParse("4Gi")}, nil)
	// Lift the policy for this test, as a cluster without it would be.
	var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "batch.drover.io-resources"}, &binding); err != nil {
		t.Fatalf("the admission policy's binding: %v", err)
	}
	if err := env.Client.Delete(ctx, &binding); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		restored := binding.DeepCopy()
		restored.ResourceVersion, restored.UID = "", ""
		if err := env.Client.Create(context.Background(), restored); err != nil {
			t.Errorf("restore the admission policy's binding: %v", err)
		}
	})
	tk := probeTask(ns, "typo", func(tk *batchv1.Task) {
		tk.Spec.Resources = corev1.ResourceList{"memroy": resource.MustParse("1Gi")}
	})
	testenv.Eventually(t, waitTimeout, "the API stores a task asking for memroy", func(ctx context.Context) (bool, error) {
		err := env.Client.Create(ctx, tk.DeepCopy())
		return err == nil, err
	})
	got := waitTask(t, ns, "typo", "pending as invalid", func(tk *batchv1.Task) bool {
		return tk.Status.State == batchv1.TaskPending && tk.Status.Reason == batchv1.ReasonInvalidResources
	})
	if want := `spec.resources[memroy]: "memroy" is not a resource name`; !strings.Contains(got.Status.Message, want) || !strings.Contains(got.Status.Message, "did you mean memory?") {
		t.Errorf("message %q, want it to say %q and suggest memory", got.Status.Message, want)
	}
}

// A perNode group that no node matched by its activeDeadlineSeconds ends
// Failed, DeadlineExceeded, as a counted group whose tasks never ran does.
func TestPerNodeGroupPastItsDeadline(t *testing.T) {
	testenv.Require(t, env)
	clock := clocktest.New(time.Now())
	ns := start(t, "pernodedl", clock)
	create(t, &batchv1.TaskGroup{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "idle"}, Spec: batchv1.TaskGroupSpec{PerNode: true,
		ActiveDeadlineSeconds: ptr(int64(60)),
		Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{Command: []string{"true"},
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"test": "nowhere"}}}}}})
	waitGroup(t, ns, "idle", "waiting", func(g *batchv1.TaskGroup) bool { return g.Status.Phase == batchv1.GroupPending })
	clock.Step(90 * time.Second)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error { // any write brings the controller back
		var g batchv1.TaskGroup
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "idle"}, &g); err != nil {
			return err
		}
		g.Annotations = map[string]string{"test/poke": "1"}
		return env.Client.Update(context.Background(), &g)
	})
	if err != nil {
		t.Fatal(err)
	}
	waitGroup(t, ns, "idle", "failed at its deadline", func(g *batchv1.TaskGroup) bool {
		c := meta.FindStatusCondition(g.Status.Conditions, taskctl.ConditionFailed)
		return g.Status.Phase == batchv1.GroupFailed && c != nil && c.Reason == batchv1.ReasonDeadlineExceeded
	})
}
