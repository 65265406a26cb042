package taskhub

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	"github.com/drover-fleet/drover/internal/task/taskwire"
	"github.com/drover-fleet/drover/internal/testenv"
)

func TestTaskRunsToCompletion(t *testing.T) {
	f := start(t)
	gate, open := f.gate("go")
	task := f.schedule("greet", "/bin/sh", "-c", `echo "$GREETING from the task"; `+waitFor(gate)+`; echo bye >&2`)

	running := f.waitState(task, batchv1.TaskRunning)
	if running.Status.StartTime == nil {
		t.Error("Running without a startTime")
	}
	f.waitFinalizer(task)
	open()
	done := f.waitState(task, batchv1.TaskCompleted)
	st := done.Status
	if st.ExitCode == nil || *st.ExitCode != 0 {
		t.Errorf("exitCode = %v, want 0", st.ExitCode)
	}
	if !strings.Contains(st.OutputTail, "hello from the task") || !strings.Contains(st.OutputTail, "bye") {
		t.Errorf("outputTail = %q, want the task's stdout and stderr", st.OutputTail)
	}
	if st.FinishTime == nil || st.StartTime == nil || st.FinishTime.Before(st.StartTime) {
		t.Errorf("startTime %v, finishTime %v", st.StartTime, st.FinishTime)
	}
	if st.Attempt != 1 || st.NodeName != f.node {
		t.Errorf("attempt %d on %q, want 1 on %s", st.Attempt, st.NodeName, f.node)
	}
	if !meta.IsStatusConditionTrue(st.Conditions, batchv1.ConditionComplete) || meta.FindStatusCondition(st.Conditions, batchv1.ConditionFailed) != nil {
		t.Errorf("conditions %+v, want Complete True (kubectl wait --for=condition=Complete) and no Failed", st.Conditions)
	}
	// The hub counts a write once it has returned, which may be after the
	// test saw it: wait for the counts rather than for a fast machine.
	testenv.Eventually(t, waitTimeout, "dispatch and status writes counted", func(context.Context) (bool, error) {
		if n := f.counter("drover_hub_task_dispatched_total"); n < 1 {
			return false, fmt.Errorf("dispatched counter %v", n)
		}
		if n := f.counter("drover_hub_task_status_writes_total"); n < 2 {
			return false, fmt.Errorf("status writes counter %v, want at least Running and Completed", n)
		}
		return true, nil
	})
	// Each write starts from what the last one returned, not from a cache
	// that has not seen it yet.
	if n := f.counter("drover_hub_task_write_conflicts_total"); n != 0 {
		t.Errorf("write conflicts counter %v, want 0", n)
	}
}

func TestNewer(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"12", "11", true},
		{"11", "12", false},
		{"12", "12", false},
		{"100", "99", true}, // numbers, not strings
		{"x", "1", false},   // opaque: not comparable, not newer
		{"2", "", false},
	} {
		if got := newer(c.a, c.b); got != c.want {
			t.Errorf("newer(%q, %q) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

func TestTaskFailsWithExitCode(t *testing.T) {
	f := start(t)
	task := f.schedule("broken", "/bin/sh", "-c", "echo oops >&2; exit 3")
	got := f.waitState(task, batchv1.TaskFailed)
	st := got.Status
	if st.ExitCode == nil || *st.ExitCode != 3 {
		t.Errorf("exitCode = %v, want 3", st.ExitCode)
	}
	if st.Reason != taskwire.ReasonExitCode {
		t.Errorf("reason = %q, want %s", st.Reason, taskwire.ReasonExitCode)
	}
	if !strings.Contains(st.OutputTail, "oops") || !strings.Contains(st.Message, "3") {
		t.Errorf("outputTail %q, message %q", st.OutputTail, st.Message)
	}
	// `kubectl describe task` says so too, restart or not.
	testenv.Eventually(t, waitTimeout, "a Warning Event says the attempt failed", func(ctx context.Context) (bool, error) {
		var l eventsv1.EventList
		if err := f.c.List(ctx, &l, client.InNamespace(f.ns)); err != nil {
			return false, err
		}
		for _, e := range l.Items {
			if e.Regarding.Name == task.Name && e.Reason == "Failed" {
				if e.Type != corev1.EventTypeWarning || !strings.Contains(e.Note, "exit code 3") || !strings.Contains(e.Note, "attempt 1 on node "+f.node) {
					return false, fmt.Errorf("event %s note %q", e.Type, e.Note)
				}
				return true, nil
			}
		}
		return false, nil
	})
}

// One item runs at a time on this agent: a second task waits on the node,
// Dispatching, until the first ends.
func TestTaskWaitsDispatching(t *testing.T) {
	f := start(t)
	gate, open := f.gate("go")
	first := f.schedule("first", "/bin/sh", "-c", waitFor(gate))
	f.waitState(first, batchv1.TaskRunning)
	second := f.schedule("second", "true")
	got := f.waitState(second, batchv1.TaskDispatching)
	if !strings.Contains(got.Status.Message, f.node) {
		t.Errorf("Dispatching message %q does not name the node", got.Status.Message)
	}
	open()
	f.waitState(first, batchv1.TaskCompleted)
	f.waitState(second, batchv1.TaskCompleted)
}

func TestDeletedTaskStopsItsProcess(t *testing.T) {
	f := start(t)
	gate, _ := f.gate("never")
	task := f.schedule("forever", "/bin/sh", "-c", waitFor(gate))
	running := f.waitState(task, batchv1.TaskRunning)
	f.waitFinalizer(task)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	if err := f.c.Delete(ctx, running); err != nil {
		t.Fatal(err)
	}
	f.waitGone(task)
	work := taskwire.WorkID(string(running.UID), 1)
	if !f.runner.wasCancelled(work) {
		t.Errorf("the task is gone but its process %s was not stopped", work)
	}
	if n := f.counter("drover_hub_task_cancels_total"); n != 1 {
		t.Errorf("cancels counter %v, want 1", n)
	}
}

// A task never dispatched gets no finalizer, and deleting it waits for nobody.
func TestUndispatchedTaskHasNoFinalizer(t *testing.T) {
	f := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	task := &batchv1.Task{}
	task.Namespace, task.Name = f.ns, "elsewhere"
	task.Spec.Command = []string{"true"}
	if err := f.c.Create(ctx, task); err != nil {
		t.Fatal(err)
	}
	task.Status = batchv1.TaskStatus{State: batchv1.TaskScheduled, NodeName: "node-on-no-hub", Attempt: 1}
	if err := f.c.Status().Update(ctx, task); err != nil {
		t.Fatal(err)
	}
	testenv.Never(t, testenv.ShortTimeout/2, "a finalizer on a task this hub did not send", func(context.Context) (bool, error) {
		var got batchv1.Task
		if err := f.c.Get(ctx, client.ObjectKeyFromObject(task), &got); err != nil {
			return false, err
		}
		return len(got.Finalizers) > 0 || got.Status.State != batchv1.TaskScheduled, nil
	})
	if err := f.c.Delete(ctx, task); err != nil {
		t.Fatal(err)
	}
	f.waitGone(task)
}

func TestNewAttemptReplacesTheOld(t *testing.T) {
	f := start(t)
	gate, open := f.gate("go")
	task := f.schedule("retried", "/bin/sh", "-c", waitFor(gate))
	running := f.waitState(task, batchv1.TaskRunning)
	old := taskwire.WorkID(string(running.UID), 1)
	uids := func() []string {
		ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
		defer cancel()
		items, err := f.d.WorkFor(ctx, f.node)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, it := range items {
			out = append(out, it.GetUid())
		}
		return out
	}
	if got := uids(); !slices.Equal(got, []string{old}) {
		t.Fatalf("WorkFor = %v, want [%s]", got, old)
	}

	// The manager starts attempt 2 on the same node.
	f.setAttempt(task, 2)
	next := taskwire.WorkID(string(running.UID), 2)
	testenv.Eventually(t, waitTimeout, "the old attempt is cancelled on the node", func(context.Context) (bool, error) {
		return f.runner.wasCancelled(old), nil
	})
	testenv.Eventually(t, waitTimeout, "WorkFor lists attempt 2 only", func(context.Context) (bool, error) {
		got := uids()
		if !slices.Equal(got, []string{next}) {
			return false, fmt.Errorf("WorkFor = %v", got)
		}
		return true, nil
	})
	got := f.waitState(task, batchv1.TaskRunning)
	if got.Status.Attempt != 2 {
		t.Fatalf("attempt %d Running, want 2", got.Status.Attempt)
	}
	open()
	done := f.waitState(task, batchv1.TaskCompleted)
	if done.Status.Attempt != 2 {
		t.Errorf("attempt %d Completed, want 2", done.Status.Attempt)
	}
}

// A deleted task whose node has left the hub is let go at once: whichever
// hub the node reconnects to sends a snapshot without it, and the agent
// cancels it then.
func TestDeletedTaskOnDisconnectedNode(t *testing.T) {
	f := start(t)
	gate, _ := f.gate("never")
	task := f.schedule("orphan", "/bin/sh", "-c", waitFor(gate))
	running := f.waitState(task, batchv1.TaskRunning)
	f.waitFinalizer(task)
	f.stopAgent()
	testenv.Eventually(t, waitTimeout, "the node left the hub", func(context.Context) (bool, error) {
		return !f.hub.Connected(f.node), nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	if err := f.c.Delete(ctx, running); err != nil {
		t.Fatal(err)
	}
	f.waitGone(task)
	testenv.Eventually(t, waitTimeout, "an Event says why the task was let go", func(ctx context.Context) (bool, error) {
		var l eventsv1.EventList
		if err := f.c.List(ctx, &l, client.InNamespace(f.ns)); err != nil {
			return false, err
		}
		for _, e := range l.Items {
			if e.Regarding.Name == task.Name && e.Reason == ReasonCleanedUp {
				if !strings.Contains(e.Note, "not connected to any hub") {
					return false, fmt.Errorf("event note %q", e.Note)
				}
				return true, nil
			}
		}
		return false, nil
	})
	// `drover describe task` finds them by the task's uid, through the core API.
	var core corev1.EventList
	if err := f.c.List(ctx, &core, client.InNamespace(f.ns), client.MatchingFields{"involvedObject.uid": string(running.UID)}); err != nil || len(core.Items) == 0 {
		t.Errorf("events by involvedObject.uid: %d, %v", len(core.Items), err)
	}
}

// A task scheduled while its node is away reaches it in the snapshot the
// node gets when it connects (WorkFor), and is written Dispatching and given
// the finalizer then.
func TestTaskReachesNodeOnConnect(t *testing.T) {
	f := start(t)
	f.stopAgent()
	testenv.Eventually(t, waitTimeout, "the node left the hub", func(context.Context) (bool, error) {
		return !f.hub.Connected(f.node), nil
	})
	gate, open := f.gate("go")
	task := f.schedule("later", "/bin/sh", "-c", "echo caught up; "+waitFor(gate))
	testenv.Never(t, testenv.ShortTimeout/5, "a task dispatched to a node that is away", func(context.Context) (bool, error) {
		var got batchv1.Task
		ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
		defer cancel()
		if err := f.c.Get(ctx, client.ObjectKeyFromObject(task), &got); err != nil {
			return false, err
		}
		return got.Status.State != batchv1.TaskScheduled || len(got.Finalizers) > 0, nil
	})
	f.startAgent()
	f.waitState(task, batchv1.TaskRunning)
	f.waitFinalizer(task)
	open()
	done := f.waitState(task, batchv1.TaskCompleted)
	if !strings.Contains(done.Status.OutputTail, "caught up") {
		t.Errorf("outputTail %q", done.Status.OutputTail)
	}
}

// A task that ends at once needs no finalizer, and gets none.
func TestShortTaskHasNoFinalizer(t *testing.T) {
	f := start(t)
	task := f.schedule("short", "true")
	done := f.waitState(task, batchv1.TaskCompleted)
	// A task that ends within FlushInterval of its dispatch gets no
	// finalizer write at all; on a busy machine it may end later and get
	// one, which must then go: an ended task never holds its deletion.
	// (How many writes a task costs is bench/tasks' business, not a test's.)
	testenv.Eventually(t, waitTimeout, "no finalizer on a task that ended", func(ctx context.Context) (bool, error) {
		var got batchv1.Task
		if err := f.c.Get(ctx, client.ObjectKeyFromObject(done), &got); err != nil {
			return false, err
		}
		if len(got.Finalizers) > 0 {
			return false, fmt.Errorf("finalizers %v", got.Finalizers)
		}
		return true, nil
	})
}

// A task too large for a work item fails with the reason, and the node's
// other work goes on.
func TestTaskTooLarge(t *testing.T) {
	f := start(t)
	huge := make([]string, 40)
	for i := range huge {
		huge[i] = strings.Repeat("a", 4000)
	}
	big := f.schedule("huge", append([]string{"echo"}, huge...)...)
	small := f.schedule("small", "true")
	got := f.waitState(big, batchv1.TaskFailed)
	if got.Status.Reason != ReasonSpecTooLarge || !strings.Contains(got.Status.Message, "more than") {
		t.Errorf("reason %q, message %q", got.Status.Reason, got.Status.Message)
	}
	f.waitState(small, batchv1.TaskCompleted)
}

// A status patch applies over a change to the metadata made after the
// status it was made from (the finalizer's write), and not over a change
// to the state.
func TestStatusPatchTestsWhatItWasMadeFrom(t *testing.T) {
	f := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	task := &batchv1.Task{}
	task.Namespace, task.Name = f.ns, "patched"
	task.Spec.Command = []string{"true"}
	if err := f.c.Create(ctx, task); err != nil {
		t.Fatal(err)
	}
	task.Status = batchv1.TaskStatus{State: batchv1.TaskScheduled, NodeName: "node-on-no-hub", Attempt: 1}
	if err := f.c.Status().Update(ctx, task); err != nil {
		t.Fatal(err)
	}
	scheduled := task.Status
	running := scheduled
	running.State, running.Reason, running.Message = batchv1.TaskRunning, ReasonStarted, "started as pid 1"

	labelled := task.DeepCopy()
	labelled.Labels = map[string]string{"touched": "yes"}
	if err := f.c.Update(ctx, labelled); err != nil {
		t.Fatal(err)
	}
	patch, err := statusPatch(&scheduled, &running)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.c.Status().Patch(ctx, task, client.RawPatch(types.JSONPatchType, patch)); err != nil {
		t.Fatalf("patch over a metadata change: %v", err)
	}
	if task.Status.State != batchv1.TaskRunning || task.Status.Message != running.Message || task.Labels["touched"] != "yes" {
		t.Errorf("after the patch: state %s, message %q, labels %v", task.Status.State, task.Status.Message, task.Labels)
	}

	failed := scheduled
	failed.State, failed.Reason = batchv1.TaskFailed, "Stale"
	if patch, err = statusPatch(&scheduled, &failed); err != nil {
		t.Fatal(err)
	}
	if err := f.c.Status().Patch(ctx, task.DeepCopy(), client.RawPatch(types.JSONPatchType, patch)); err == nil {
		t.Error("a patch made from Scheduled applied to a Running task")
	}
	var got batchv1.Task
	if err := f.c.Get(ctx, client.ObjectKeyFromObject(task), &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.State != batchv1.TaskRunning {
		t.Errorf("state %s after a stale patch, want %s", got.Status.State, batchv1.TaskRunning)
	}
}
