package taskhub

// Agents older than taskwire.FeatureRunAs ignore a task's securityContext
// and run it as themselves (root): the hub sends them no task at all.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/task/taskwire"
	"github.com/drover-fleet/drover/internal/testenv"
)

// runningOn creates a task whose attempt 1 runs on node, as if an earlier
// hub had sent it there.
func (f *fixture) runningOn(name, node string) (*batchv1.Task, string) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	t := &batchv1.Task{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
		Spec:       batchv1.TaskSpec{Command: []string{"/bin/sleep", "600"}},
	}
	if err := f.c.Create(ctx, t); err != nil {
		f.t.Fatal(err)
	}
	t.Status = batchv1.TaskStatus{State: batchv1.TaskRunning, Reason: ReasonStarted, NodeName: node, Attempt: 1}
	if err := f.c.Status().Update(ctx, t); err != nil {
		f.t.Fatal(err)
	}
	return t, taskwire.WorkID(string(t.UID), 1)
}

// waitCached waits until the dispatcher's cache shows each task as the
// test wrote it (state and node), so that a node's snapshot lists it.
func (f *fixture) waitCached(tasks ...*batchv1.Task) {
	f.t.Helper()
	for _, t := range tasks {
		testenv.Eventually(f.t, waitTimeout, fmt.Sprintf("the hub's cache holds task %s", t.Name), func(ctx context.Context) (bool, error) {
			var got batchv1.Task
			if err := f.d.opts.Client.Get(ctx, client.ObjectKeyFromObject(t), &got); err != nil {
				return false, client.IgnoreNotFound(err)
			}
			return got.Status.State == t.Status.State && got.Status.NodeName == t.Status.NodeName, nil
		})
	}
}

// taskItems takes what the node received so far and returns the work
// uids of its Dispatches and Snapshots, and whether a Snapshot was among
// them.
func (n *rawNode) taskItems() (uids []string, snapshot bool) {
	for {
		select {
		case env := <-n.envs:
			if env.GetKind() == agentv1.Kind_KIND_SNAPSHOT {
				snapshot = true
			}
			if env.GetKind() != agentv1.Kind_KIND_CANCEL {
				uids = append(uids, uidsIn(env)...)
			}
		default:
			return uids, snapshot
		}
	}
}

// waitTooOld waits until the task failed because node's agent is too old,
// and checks the status says why and what to do.
func (f *fixture) waitTooOld(t *batchv1.Task, node string) {
	f.t.Helper()
	got := f.waitState(t, batchv1.TaskFailed)
	if got.Status.Reason != ReasonAgentTooOld {
		f.t.Errorf("task %s failed with reason %q (%s), want %s", t.Name, got.Status.Reason, got.Status.Message, ReasonAgentTooOld)
	}
	for _, want := range []string{"node " + node, taskwire.FeatureRunAs, "NodeUpgradeJob"} {
		if !strings.Contains(got.Status.Message, want) {
			f.t.Errorf("task %s: message %q does not say %q", t.Name, got.Status.Message, want)
		}
	}
}

// TestOldAgentGetsNoTask: an agent that does not name
// taskwire.FeatureRunAs gets no task item, neither in the snapshot it gets
// when it connects nor by dispatch, and those attempts fail with
// ReasonAgentTooOld and a Warning Event; an agent that names it gets and
// runs them as before.
func TestOldAgentGetsNoTask(t *testing.T) {
	f := start(t)
	oldNode, newNode := f.node+"-old", f.node+"-new"

	// Before the nodes connect: an attempt Scheduled on the old node, and
	// on each node one that runs there (sent by an earlier hub).
	oldScheduled, oldScheduledWork := f.scheduleOn("old-scheduled", oldNode)
	oldRunning, oldRunningWork := f.runningOn("old-running", oldNode)
	newRunning, newRunningWork := f.runningOn("new-running", newNode)
	f.waitCached(oldScheduled, oldRunning, newRunning)

	old := f.rawNodeWith(oldNode, nil)
	current := f.rawNode(newNode)

	// On connect: the current agent's snapshot holds its running attempt;
	// the old agent's attempts fail instead.
	current.waitFor(agentv1.Kind_KIND_SNAPSHOT, newRunningWork)
	f.waitTooOld(oldRunning, oldNode)
	f.waitTooOld(oldScheduled, oldNode)

	// By dispatch, to the connected nodes.
	oldDispatched, oldDispatchedWork := f.scheduleOn("old-dispatched", oldNode)
	newDispatched, newDispatchedWork := f.scheduleOn("new-dispatched", newNode)
	current.waitFor(agentv1.Kind_KIND_DISPATCH, newDispatchedWork)
	f.waitTooOld(oldDispatched, oldNode)

	testenv.Eventually(t, waitTimeout, "a Warning Event says the old agent's attempt failed and why", func(ctx context.Context) (bool, error) {
		var l eventsv1.EventList
		if err := f.c.List(ctx, &l, client.InNamespace(f.ns)); err != nil {
			return false, err
		}
		for _, e := range l.Items {
			if e.Regarding.Name == oldDispatched.Name && e.Reason == "Failed" {
				if e.Type != corev1.EventTypeWarning || !strings.Contains(e.Note, ReasonAgentTooOld) || !strings.Contains(e.Note, "node "+oldNode) {
					return false, fmt.Errorf("event %s note %q", e.Type, e.Note)
				}
				return true, nil
			}
		}
		return false, nil
	})

	// The old agent got its snapshot, and no task in it or after it.
	never := []string{oldScheduledWork, oldRunningWork, oldDispatchedWork}
	got, snapshot := old.taskItems()
	testenv.Eventually(t, waitTimeout, "the old agent got its snapshot", func(context.Context) (bool, error) {
		more, s := old.taskItems()
		got, snapshot = append(got, more...), snapshot || s
		return snapshot, nil
	})
	testenv.Never(t, testenv.ShortTimeout, "a task item sent to the old agent", func(context.Context) (bool, error) {
		more, _ := old.taskItems()
		got = append(got, more...)
		return slices.ContainsFunc(got, func(u string) bool { return slices.Contains(never, u) }), nil
	})

	// The current agent runs its attempts to the end, as before.
	current.report(newDispatchedWork, taskwire.PhaseRunning, "", started())
	f.waitState(newDispatched, batchv1.TaskRunning)
	current.report(newDispatchedWork, taskwire.PhaseSucceeded, "", exited(0, "done\n"))
	current.report(newRunningWork, taskwire.PhaseSucceeded, "", exited(0, "done too\n"))
	f.waitState(newDispatched, batchv1.TaskCompleted)
	if got := f.waitState(newRunning, batchv1.TaskCompleted); got.Status.OutputTail != "done too\n" {
		t.Errorf("output tail %q, want the current agent's", got.Status.OutputTail)
	}
}
