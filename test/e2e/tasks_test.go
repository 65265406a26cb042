package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/testkit"
)

// taskTimeout bounds one short task end to end: schedule, dispatch, start,
// exit, report.
const taskTimeout = 60 * time.Second

const taskNS = "default"

func newTask(name string, spec batchv1.TaskSpec) *batchv1.Task {
	return &batchv1.Task{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: taskNS}, Spec: spec}
}

// waitTask polls a Task until cond says "" (done) and returns it.
func waitTask(t *testing.T, c *cluster, name string, within time.Duration, cond func(*batchv1.Task) string) *batchv1.Task {
	t.Helper()
	tk := &batchv1.Task{}
	testkit.Eventually(t, within, func() string {
		if err := c.client.Get(context.Background(), client.ObjectKey{Namespace: taskNS, Name: name}, tk); err != nil {
			return err.Error()
		}
		if why := cond(tk); why != "" {
			return fmt.Sprintf("task %s: %s (status %+v)", name, why, tk.Status)
		}
		return ""
	})
	return tk
}

func inState(want batchv1.TaskState) func(*batchv1.Task) string {
	return func(tk *batchv1.Task) string {
		if tk.Status.State != want {
			return fmt.Sprintf("state %q, want %q", tk.Status.State, want)
		}
		return ""
	}
}

func exitCode(tk *batchv1.Task) int32 {
	if tk.Status.ExitCode == nil {
		return -1
	}
	return *tk.Status.ExitCode
}

// TestTasks runs FleetJobs and Tasks on real drover-agent processes through
// `drover server`: scheduling by labels, the exec driver's exit codes and
// timeouts, cancellation by deleting a Task, restarts, rescheduling after a
// node is lost, and `drover logs`.
func TestTasks(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	tok := c.token(t, true, time.Hour)
	for _, n := range []string{"robot-1", "robot-2"} {
		c.startAgent(t, n, t.TempDir(), "--hub", c.hub, "--token", tok, "--labels", "kind=robot")
		c.waitPhase(t, n, fleetv1.FleetNodeOnline, defaultTimeout)
	}

	t.Run("a FleetJob's groups and tasks run and their status cascades", func(t *testing.T) {
		job := &batchv1.FleetJob{
			ObjectMeta: metav1.ObjectMeta{Name: "survey", Namespace: taskNS},
			Spec: batchv1.FleetJobSpec{
				NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kind": "robot"}},
				TaskGroups: []batchv1.TaskGroupTemplate{
					{Name: "scan", Count: 2, Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{
						Command: []string{"sh", "-c", "echo scanning $DROVER_TASK_NAME; echo warn >&2"}}}},
					{Name: "idle", Count: 1, Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{Command: []string{"true"}}}},
				},
			},
		}
		if err := c.client.Create(ctx, job); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, taskTimeout, func() string {
			if err := c.client.Get(ctx, client.ObjectKeyFromObject(job), job); err != nil {
				return err.Error()
			}
			if job.Status.Phase != batchv1.GroupCompleted || job.Status.Counts.Completed != 3 {
				out, _ := c.cli(t, "get", "tasks", "-n", taskNS)
				return fmt.Sprintf("job status %+v\n%s", job.Status, out)
			}
			return ""
		})
		var groups batchv1.TaskGroupList
		if err := c.client.List(ctx, &groups, client.InNamespace(taskNS), client.MatchingLabels{batchv1.LabelFleetJob: "survey"}); err != nil {
			t.Fatal(err)
		}
		if len(groups.Items) != 2 {
			t.Fatalf("%d TaskGroups, want 2", len(groups.Items))
		}
		for _, g := range groups.Items {
			if g.Status.Phase != batchv1.GroupCompleted || g.Status.Counts.Total != g.Spec.Count {
				t.Errorf("group %s status %+v", g.Name, g.Status)
			}
		}
		tk := waitTask(t, c, "survey-scan-0", defaultTimeout, inState(batchv1.TaskCompleted))
		if exitCode(tk) != 0 || !strings.Contains(tk.Status.OutputTail, "scanning survey-scan-0") {
			t.Errorf("exit %d, output tail %q", exitCode(tk), tk.Status.OutputTail)
		}
		if tk.Status.NodeName != "robot-1" && tk.Status.NodeName != "robot-2" {
			t.Errorf("ran on %q", tk.Status.NodeName)
		}
		out, err := c.cli(t, "logs", "-n", taskNS, "survey-scan-0")
		if err != nil || !strings.Contains(out, "scanning survey-scan-0") {
			t.Errorf("drover logs: err %v, output:\n%s", err, out)
		}
		out, err = c.cli(t, "describe", "fj", "survey", "-n", taskNS)
		for _, want := range []string{"Completed", "3 total: 0 pending, 0 active", "restart Never, reschedule OnNodeLost", "survey-scan", "survey-idle-0", "Condition Complete:"} {
			if err != nil || !strings.Contains(out, want) {
				t.Errorf("drover describe fj lacks %q (err %v):\n%s", want, err, out)
			}
		}
	})

	t.Run("a non-zero exit fails the task with its exit code", func(t *testing.T) {
		if err := c.client.Create(ctx, newTask("exit-3", batchv1.TaskSpec{Command: []string{"sh", "-c", "exit 3"}})); err != nil {
			t.Fatal(err)
		}
		tk := waitTask(t, c, "exit-3", taskTimeout, inState(batchv1.TaskFailed))
		if exitCode(tk) != 3 {
			t.Errorf("exit code %d, want 3", exitCode(tk))
		}
	})

	t.Run("a timeout ends with SIGTERM (143) or SIGKILL (137)", func(t *testing.T) {
		sec := metav1.Duration{Duration: time.Second}
		for name, tt := range map[string]struct {
			cmd  []string
			want int32
		}{
			"timeout-term": {[]string{"sleep", "60"}, 143},
			"timeout-kill": {[]string{"sh", "-c", "trap '' TERM; sleep 60 & wait; sleep 60"}, 137},
		} {
			if err := c.client.Create(ctx, newTask(name, batchv1.TaskSpec{Command: tt.cmd, Timeout: &sec, KillTimeout: &sec})); err != nil {
				t.Fatal(err)
			}
			tk := waitTask(t, c, name, taskTimeout, inState(batchv1.TaskFailed))
			if exitCode(tk) != tt.want || tk.Status.Reason != "timeout" {
				t.Errorf("%s: exit %d reason %q, want %d timeout", name, exitCode(tk), tk.Status.Reason, tt.want)
			}
		}
	})

	t.Run("deleting a running task stops its process", func(t *testing.T) {
		pidFile := filepath.Join(openDir(t), "pid") // written by the task, as nobody
		if err := c.client.Create(ctx, newTask("long", batchv1.TaskSpec{Command: []string{"sh", "-c", "echo $$ > " + pidFile + "; exec sleep 300"}})); err != nil {
			t.Fatal(err)
		}
		waitTask(t, c, "long", taskTimeout, inState(batchv1.TaskRunning))
		var pid int
		testkit.Eventually(t, defaultTimeout, func() string {
			b, err := os.ReadFile(pidFile)
			if err != nil {
				return err.Error()
			}
			pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				return err.Error()
			}
			return ""
		})
		if err := c.client.Delete(ctx, &batchv1.Task{ObjectMeta: metav1.ObjectMeta{Name: "long", Namespace: taskNS}}); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, defaultTimeout, func() string {
			if err := syscall.Kill(pid, 0); err == nil {
				return fmt.Sprintf("process %d still runs", pid)
			}
			err := c.client.Get(ctx, client.ObjectKey{Namespace: taskNS, Name: "long"}, &batchv1.Task{})
			if !apierrors.IsNotFound(err) {
				return fmt.Sprintf("task still exists (err %v)", err)
			}
			return ""
		})
	})

	t.Run("a task that fits no node stays Pending and says why", func(t *testing.T) {
		spec := batchv1.TaskSpec{Command: []string{"true"}, NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kind": "drone"}}}
		if err := c.client.Create(ctx, newTask("nowhere", spec)); err != nil {
			t.Fatal(err)
		}
		waitTask(t, c, "nowhere", taskTimeout, func(tk *batchv1.Task) string {
			if tk.Status.State != batchv1.TaskPending || tk.Status.Reason != batchv1.ReasonUnschedulable || !strings.Contains(tk.Status.Message, "nodeSelector") {
				return "not Pending/Unschedulable with a message naming the selector"
			}
			return ""
		})
	})

	t.Run("OnFailure restarts with backoff until attempts run out", func(t *testing.T) {
		spec := batchv1.TaskSpec{Command: []string{"false"}, RestartPolicy: batchv1.RestartOnFailure, MaxAttempts: 2,
			Backoff: &metav1.Duration{Duration: time.Second}}
		if err := c.client.Create(ctx, newTask("flaky", spec)); err != nil {
			t.Fatal(err)
		}
		tk := waitTask(t, c, "flaky", taskTimeout, func(tk *batchv1.Task) string {
			if tk.Status.State != batchv1.TaskFailed || tk.Status.Attempt != 2 {
				return "not Failed at attempt 2"
			}
			return ""
		})
		if len(tk.Status.History) < 1 || tk.Status.History[0].Attempt != 1 || exitCode(tk) != 1 {
			t.Errorf("history %+v exit %d", tk.Status.History, exitCode(tk))
		}
	})

	t.Run("a task on a lost node is rescheduled as a new attempt", func(t *testing.T) {
		lost := c.startAgent(t, "robot-lost", t.TempDir(), "--hub", c.hub, "--token", tok, "--labels", "kind=walker")
		c.waitPhase(t, "robot-lost", fleetv1.FleetNodeOnline, defaultTimeout)
		spec := batchv1.TaskSpec{Command: []string{"sleep", "300"},
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kind": "walker"}}}
		if err := c.client.Create(ctx, newTask("walk", spec)); err != nil {
			t.Fatal(err)
		}
		waitTask(t, c, "walk", taskTimeout, inState(batchv1.TaskRunning))
		c.startAgent(t, "robot-spare", t.TempDir(), "--hub", c.hub, "--token", tok, "--labels", "kind=walker")
		c.waitPhase(t, "robot-spare", fleetv1.FleetNodeOnline, defaultTimeout)
		lost.stop(syscall.SIGKILL)
		tk := waitTask(t, c, "walk", offlineTimeout+taskTimeout, func(tk *batchv1.Task) string {
			if tk.Status.State != batchv1.TaskRunning || tk.Status.NodeName != "robot-spare" || tk.Status.Attempt != 2 {
				return "not Running on robot-spare at attempt 2"
			}
			return ""
		})
		if len(tk.Status.History) == 0 || tk.Status.History[0].Node != "robot-lost" || tk.Status.History[0].Reason != batchv1.ReasonNodeLost {
			t.Errorf("history %+v, want attempt 1 on robot-lost ended NodeLost", tk.Status.History)
		}
		if err := c.client.Delete(ctx, tk); err != nil {
			t.Fatal(err)
		}
	})
}
