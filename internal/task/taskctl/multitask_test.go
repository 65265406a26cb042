package taskctl_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/task/taskctl"
	"github.com/drover-fleet/drover/internal/testenv"
)

func multiGroup(ns, name string, tasks ...batchv1.GroupTask) *batchv1.TaskGroup {
	return &batchv1.TaskGroup{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: batchv1.TaskGroupSpec{Count: 1, Tasks: tasks}}
}

func member(name string, role batchv1.TaskLifecycle, cpus string) batchv1.GroupTask {
	return batchv1.GroupTask{Name: name, Lifecycle: role, Spec: batchv1.TaskSpec{Command: []string{"true"}, Resources: cpu(cpus)}}
}

// TestMultiTaskGroupInitThenMainAndSidecar: an instance goes to the one
// node with room for its biggest init (3 cpu, more than its main and
// sidecar together), holds that room while it runs, runs its init first,
// then its main and sidecar there; the sidecar is stopped when the main
// ends, and the group completes, its status counting each task.
func TestMultiTaskGroupInitThenMainAndSidecar(t *testing.T) {
	ns := start(t, "multitask", nil)
	ctx := context.Background()
	node(t, "mt-small", fleetv1.FleetNodeOnline, cpu("2"), nil)
	node(t, "mt-big", fleetv1.FleetNodeOnline, cpu("4"), nil)
	g := multiGroup(ns, "robot",
		member("setup", batchv1.LifecycleInit, "3"),
		member("work", batchv1.LifecycleMain, "1"),
		member("log", batchv1.LifecycleSidecar, "1"))
	if err := env.Client.Create(ctx, g); err != nil {
		t.Fatal(err)
	}
	init := waitTask(t, ns, "robot-0-setup", "init scheduled", stateIs(batchv1.TaskScheduled, 1))
	if init.Status.NodeName != "mt-big" {
		t.Fatalf("init on %s, want mt-big (the only node with room for 3 cpu)", init.Status.NodeName)
	}
	for _, name := range []string{"robot-0-work", "robot-0-log"} {
		tk := getTask(t, ns, name)
		if tk.Status.State.Holds() || len(tk.Spec.SchedulingGates) == 0 {
			t.Errorf("%s is %s with gates %v while the init has not run; want it gated", name, tk.Status.State, tk.Spec.SchedulingGates)
		}
	}
	waitGroup(t, ns, "robot", "running, 0/3 tasks ended", func(g *batchv1.TaskGroup) bool {
		return g.Status.Phase == batchv1.GroupRunning && g.Status.TaskProgress == "0/3"
	})
	// The instance holds 3 cpu of mt-big: a task of 2 cpu goes to mt-small.
	other := &batchv1.Task{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: ns},
		Spec: batchv1.TaskSpec{Command: []string{"true"}, Resources: cpu("2")}}
	if err := env.Client.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	if o := waitTask(t, ns, "other", "scheduled", stateIs(batchv1.TaskScheduled, 1)); o.Status.NodeName != "mt-small" {
		t.Errorf("other task on %s, want mt-small (mt-big's room is the instance's)", o.Status.NodeName)
	}
	now := time.Now()
	hub(t, ns, "robot-0-setup", 1, batchv1.TaskRunning, nil, "", now)
	hub(t, ns, "robot-0-setup", 1, batchv1.TaskCompleted, ptr(int32(0)), "Completed", now)
	for _, name := range []string{"robot-0-work", "robot-0-log"} {
		tk := waitTask(t, ns, name, "scheduled after the init", stateIs(batchv1.TaskScheduled, 1))
		if tk.Status.NodeName != "mt-big" || len(tk.Spec.SchedulingGates) != 0 {
			t.Errorf("%s on %s with gates %v, want on mt-big, ungated", name, tk.Status.NodeName, tk.Spec.SchedulingGates)
		}
		hub(t, ns, name, 1, batchv1.TaskRunning, nil, "", now)
	}
	waitGroup(t, ns, "robot", "1/3 tasks ended", func(g *batchv1.TaskGroup) bool { return g.Status.TaskProgress == "1/3" })
	hub(t, ns, "robot-0-work", 1, batchv1.TaskCompleted, ptr(int32(0)), "Completed", now)
	got := waitGroup(t, ns, "robot", "Completed", func(g *batchv1.TaskGroup) bool { return g.Status.Phase == batchv1.GroupCompleted })
	if got.Status.TaskProgress != "3/3" || got.Status.Counts.Completed != 1 || got.Status.Desired != 1 {
		t.Errorf("status = progress %s, counts %+v, desired %d; want 3/3, 1 instance completed", got.Status.TaskProgress, got.Status.Counts, got.Status.Desired)
	}
	// The counts count instances, and the condition says so.
	if c := meta.FindStatusCondition(got.Status.Conditions, taskctl.ConditionComplete); c == nil || c.Message != "1/1 instances completed" {
		t.Errorf("Complete condition = %+v, want message %q", c, "1/1 instances completed")
	}
	want := []batchv1.GroupTaskStatus{
		{Name: "setup", Lifecycle: batchv1.LifecycleInit, Completed: 1},
		{Name: "work", Lifecycle: batchv1.LifecycleMain, Completed: 1},
		{Name: "log", Lifecycle: batchv1.LifecycleSidecar, Stopped: 1},
	}
	if !slices.Equal(got.Status.Tasks, want) {
		t.Errorf("status.tasks = %+v, want %+v", got.Status.Tasks, want)
	}
	if _, still := tasksOf(t, ns)["robot-0-log"]; still {
		t.Errorf("sidecar task still there after the main ended")
	}
}

// TestMultiTaskGroupInitFailure: an init that fails for good fails the
// instance (InitFailed, naming it) and the tasks after it never start.
func TestMultiTaskGroupInitFailure(t *testing.T) {
	ns := start(t, "multitask-fail", nil)
	ctx := context.Background()
	node(t, "mtf-a", fleetv1.FleetNodeOnline, cpu("4"), nil)
	g := multiGroup(ns, "robot", member("fetch", batchv1.LifecycleInit, "1"), member("work", batchv1.LifecycleMain, "1"))
	if err := env.Client.Create(ctx, g); err != nil {
		t.Fatal(err)
	}
	waitTask(t, ns, "robot-0-fetch", "scheduled", stateIs(batchv1.TaskScheduled, 1))
	hub(t, ns, "robot-0-fetch", 1, batchv1.TaskFailed, ptr(int32(3)), "Error", time.Now())
	got := waitGroup(t, ns, "robot", "Failed", func(g *batchv1.TaskGroup) bool { return g.Status.Phase == batchv1.GroupFailed })
	c := meta.FindStatusCondition(got.Status.Conditions, "Failed")
	if c == nil || c.Reason != batchv1.ReasonInitFailed || !strings.Contains(c.Message, "init task fetch failed") {
		t.Errorf("Failed condition = %+v, want reason InitFailed naming fetch", c)
	}
	testenv.Eventually(t, waitTimeout, "the main never starts and is removed", func(context.Context) (bool, error) {
		if tk, ok := tasksOf(t, ns)["robot-0-work"]; ok {
			return false, fmt.Errorf("main task is %q", tk.Status.State)
		}
		return true, nil
	})
	if st := got.Status.Tasks; len(st) != 2 || st[0].Failed != 1 || st[1].Stopped != 1 {
		t.Errorf("status.tasks = %+v, want fetch failed, work stopped", st)
	}
}

// TestMultiTaskPerNodeGroup: a perNode group with tasks has one instance
// per matching node, each of its tasks pinned to that node.
func TestMultiTaskPerNodeGroup(t *testing.T) {
	ns := start(t, "multitask-pernode", nil)
	ctx := context.Background()
	node(t, "mtp-a", fleetv1.FleetNodeOnline, cpu("4"), map[string]string{"arm": "yes"})
	node(t, "mtp-b", fleetv1.FleetNodeOnline, cpu("4"), map[string]string{"arm": "yes"})
	node(t, "mtp-c", fleetv1.FleetNodeOnline, cpu("4"), nil)
	g := multiGroup(ns, "calib", member("init", batchv1.LifecycleInit, "1"), member("main", batchv1.LifecycleMain, "1"))
	g.Spec.Count, g.Spec.PerNode = 0, true
	g.Spec.Tasks[1].Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"arm": "yes"}}
	if err := env.Client.Create(ctx, g); err != nil {
		t.Fatal(err)
	}
	waitTasks(t, ns, map[string]string{"calib-mtp-a-init": "mtp-a", "calib-mtp-a-main": "mtp-a", "calib-mtp-b-init": "mtp-b", "calib-mtp-b-main": "mtp-b"})
	waitGroup(t, ns, "calib", "2 instances", func(g *batchv1.TaskGroup) bool {
		return g.Status.Desired == 2 && g.Status.TaskProgress == "0/4"
	})
}
