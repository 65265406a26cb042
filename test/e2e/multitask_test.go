package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/testkit"
)

// waitGroup polls a TaskGroup until cond says "" (done) and returns it.
func waitGroup(t *testing.T, c *cluster, name string, within time.Duration, cond func(*batchv1.TaskGroup) string) *batchv1.TaskGroup {
	t.Helper()
	g := &batchv1.TaskGroup{}
	testkit.Eventually(t, within, func() string {
		if err := c.client.Get(context.Background(), client.ObjectKey{Namespace: taskNS, Name: name}, g); err != nil {
			return err.Error()
		}
		if why := cond(g); why != "" {
			return fmt.Sprintf("group %s: %s (status %+v)", name, why, g.Status)
		}
		return ""
	})
	return g
}

func groupPhase(want batchv1.GroupPhase) func(*batchv1.TaskGroup) string {
	return func(g *batchv1.TaskGroup) string {
		if g.Status.Phase != want {
			return fmt.Sprintf("phase %q, want %q", g.Status.Phase, want)
		}
		return ""
	}
}

// TestMultiTaskGroup runs TaskGroups with init, main and sidecar tasks on
// a real agent: the init runs (and reports its output) before the main
// starts, on the same node; the sidecar is stopped as SidecarStopped when
// the main ends and the group completes; a failing init fails the group
// with InitFailed and its main never runs.
func TestMultiTaskGroup(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	tok := c.token(t, true, time.Hour)
	c.startAgent(t, "mt-robot", t.TempDir(), "--hub", c.hub, "--token", tok, "--labels", "kind=robot")
	c.waitPhase(t, "mt-robot", fleetv1.FleetNodeOnline, defaultTimeout)

	t.Run("init, then main and sidecar; the sidecar stops with the main", func(t *testing.T) {
		g := &batchv1.TaskGroup{ObjectMeta: metav1.ObjectMeta{Name: "calibrate", Namespace: taskNS},
			Spec: batchv1.TaskGroupSpec{Count: 1, Tasks: []batchv1.GroupTask{
				{Name: "prep", Lifecycle: batchv1.LifecycleInit, Spec: batchv1.TaskSpec{Command: []string{"sh", "-c", "echo prepared"}}},
				{Name: "work", Spec: batchv1.TaskSpec{Command: []string{"sh", "-c", "sleep 2; echo worked"}}},
				{Name: "logger", Lifecycle: batchv1.LifecycleSidecar, Spec: batchv1.TaskSpec{Command: []string{"sleep", "300"}}},
			}}}
		if err := c.client.Create(ctx, g); err != nil {
			t.Fatal(err)
		}
		prep := waitTask(t, c, "calibrate-0-prep", taskTimeout, inState(batchv1.TaskCompleted))
		if !strings.Contains(prep.Status.OutputTail, "prepared") {
			t.Errorf("init output tail %q, want it to say prepared", prep.Status.OutputTail)
		}
		work := waitTask(t, c, "calibrate-0-work", taskTimeout, func(tk *batchv1.Task) string {
			if tk.Status.StartTime == nil {
				return "not started"
			}
			return ""
		})
		if work.Status.StartTime.Before(prep.Status.FinishTime) || work.Status.NodeName != prep.Status.NodeName {
			t.Errorf("main started %s on %s; want after the init finished (%s) on the init's node %s",
				work.Status.StartTime, work.Status.NodeName, prep.Status.FinishTime, prep.Status.NodeName)
		}
		done := waitGroup(t, c, "calibrate", taskTimeout, groupPhase(batchv1.GroupCompleted))
		if done.Status.TaskProgress != "3/3" {
			t.Errorf("taskProgress %q, want 3/3", done.Status.TaskProgress)
		}
		if st := done.Status.Tasks; len(st) != 3 || st[2].Stopped != 1 || st[1].Completed != 1 || st[0].Completed != 1 {
			t.Errorf("status.tasks = %+v, want prep and work completed, logger stopped", st)
		}
		work = waitTask(t, c, "calibrate-0-work", taskTimeout, inState(batchv1.TaskCompleted))
		if !strings.Contains(work.Status.OutputTail, "worked") {
			t.Errorf("main output tail %q", work.Status.OutputTail)
		}
		testkit.Eventually(t, taskTimeout, func() string {
			var evs corev1.EventList
			if err := c.client.List(ctx, &evs, client.InNamespace(taskNS)); err != nil {
				return err.Error()
			}
			for _, e := range evs.Items {
				if e.Reason == batchv1.ReasonSidecarStopped && strings.Contains(e.Message, "calibrate-0-logger") {
					return ""
				}
			}
			return "no SidecarStopped event naming calibrate-0-logger"
		})
	})

	t.Run("a failing init fails the group as InitFailed", func(t *testing.T) {
		g := &batchv1.TaskGroup{ObjectMeta: metav1.ObjectMeta{Name: "broken", Namespace: taskNS},
			Spec: batchv1.TaskGroupSpec{Count: 1, Tasks: []batchv1.GroupTask{
				{Name: "prep", Lifecycle: batchv1.LifecycleInit, Spec: batchv1.TaskSpec{Command: []string{"sh", "-c", "exit 4"}}},
				{Name: "work", Spec: batchv1.TaskSpec{Command: []string{"true"}}},
			}}}
		if err := c.client.Create(ctx, g); err != nil {
			t.Fatal(err)
		}
		failed := waitGroup(t, c, "broken", taskTimeout, groupPhase(batchv1.GroupFailed))
		cond := meta.FindStatusCondition(failed.Status.Conditions, batchv1.ConditionFailed)
		if cond == nil || cond.Reason != batchv1.ReasonInitFailed || !strings.Contains(cond.Message, "init task prep failed") {
			t.Errorf("Failed condition %+v, want reason InitFailed naming prep", cond)
		}
		if tk := waitTask(t, c, "broken-0-prep", taskTimeout, inState(batchv1.TaskFailed)); exitCode(tk) != 4 {
			t.Errorf("init exit %d, want 4", exitCode(tk))
		}
		var work batchv1.Task
		if err := c.client.Get(ctx, client.ObjectKey{Namespace: taskNS, Name: "broken-0-work"}, &work); err == nil && work.Status.StartTime != nil {
			t.Errorf("main started at %s after its init failed", work.Status.StartTime)
		}
	})
}
