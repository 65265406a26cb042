package taskctl

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
)

var t0 = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

func ptr[T any](v T) *T { return &v }

func at(d time.Duration) *metav1.Time { t := metav1.NewTime(t0.Add(d)); return &t }

// failed is attempt n, failed on node-a with exit code 1 at t0.
func failed(n int32, mutate func(*batchv1.Task)) *batchv1.Task {
	t := &batchv1.Task{Spec: batchv1.TaskSpec{RestartPolicy: batchv1.RestartOnFailure, ReschedulePolicy: batchv1.RescheduleOnNodeLost, MaxAttempts: 3, Backoff: &metav1.Duration{Duration: 10 * time.Second}},
		Status: batchv1.TaskStatus{State: batchv1.TaskFailed, Attempt: n, NodeName: "node-a", Reason: "ExitCode", Message: "exit code 1",
			ExitCode: ptr(int32(1)), StartTime: at(-time.Minute), FinishTime: at(0), OutputTail: "boom"}}
	if mutate != nil {
		mutate(t)
	}
	return t
}

// holding is attempt n in state s on node-a, scheduled at t0.
func holding(n int32, s batchv1.TaskState, mutate func(*batchv1.Task)) *batchv1.Task {
	t := &batchv1.Task{Spec: batchv1.TaskSpec{ReschedulePolicy: batchv1.RescheduleOnNodeLost, MaxAttempts: 3},
		Status: batchv1.TaskStatus{State: s, Attempt: n, NodeName: "node-a",
			Conditions: []metav1.Condition{{Type: ConditionScheduled, Status: metav1.ConditionTrue, Reason: "Scheduled", LastTransitionTime: *at(0)}}}}
	if s == batchv1.TaskRunning {
		t.Status.StartTime = at(time.Second)
	}
	if mutate != nil {
		mutate(t)
	}
	return t
}

func TestStep(t *testing.T) {
	online := nodeView{exists: true, phase: fleetv1.FleetNodeOnline}
	offline := nodeView{exists: true, phase: fleetv1.FleetNodeOffline}
	tests := []struct {
		name    string
		task    *batchv1.Task
		node    nodeView
		now     time.Duration // after t0
		want    string        // "state reason attempt next", or "" for no change
		recheck time.Duration
		history string // "attempt node state reason" of the last entry
	}{
		{name: "first failure restarts after the backoff", task: failed(1, nil), now: time.Second,
			want: "Pending BackOff 2 10s", history: "1 node-a Failed ExitCode exit=1"},
		{name: "second failure waits twice as long", task: failed(2, func(t *batchv1.Task) { t.Spec.MaxAttempts = 5 }),
			want: "Pending BackOff 3 20s", history: "2 node-a Failed ExitCode exit=1"},
		{name: "backoff is capped at five minutes", task: failed(9, func(t *batchv1.Task) { t.Spec.MaxAttempts = 20; t.Spec.Backoff.Duration = time.Minute }),
			want: "Pending BackOff 10 5m0s"},
		{name: "no finish time: backoff from now", task: failed(1, func(t *batchv1.Task) { t.Status.FinishTime = nil }), now: time.Minute,
			want: "Pending BackOff 2 1m10s"},
		{name: "finish time ahead of the clock: backoff from now", task: failed(1, func(t *batchv1.Task) { t.Status.FinishTime = at(time.Hour) }), now: time.Minute,
			want: "Pending BackOff 2 1m10s"},
		{name: "last attempt failed", task: failed(3, nil), want: "Failed AttemptsExhausted 3 -"},
		{name: "restartPolicy Never keeps the hub's failure", task: failed(1, func(t *batchv1.Task) { t.Spec.RestartPolicy = batchv1.RestartNever })},
		{name: "a final failure stays", task: failed(3, func(t *batchv1.Task) { t.Status.Reason = batchv1.ReasonAttemptsSpent })},
		{name: "a failure the manager made stays", task: failed(1, func(t *batchv1.Task) { t.Status.Reason = batchv1.ReasonNodeLost })},
		{name: "completed stays", task: holding(1, batchv1.TaskCompleted, nil), node: offline},
		{name: "node Offline: rescheduled", task: holding(1, batchv1.TaskRunning, nil), node: offline, now: time.Minute,
			want: "Pending NodeLost 2 -", history: "1 node-a Failed NodeLost exit=nil"},
		{name: "node deleted: rescheduled", task: holding(2, batchv1.TaskScheduled, nil), node: nodeView{},
			want: "Pending NodeLost 3 -", history: "2 node-a Failed NodeLost exit=nil"},
		{name: "node Revoked, reschedulePolicy Never: failed", task: holding(1, batchv1.TaskRunning, func(t *batchv1.Task) { t.Spec.ReschedulePolicy = batchv1.RescheduleNever }),
			node: nodeView{exists: true, phase: fleetv1.FleetNodeRevoked}, want: "Failed NodeLost 1 -", history: "1 node-a Failed NodeLost exit=nil"},
		{name: "node lost on the last attempt: failed", task: holding(3, batchv1.TaskDispatching, nil), node: offline, want: "Failed NodeLost 3 -"},
		{name: "running on an Online node", task: holding(1, batchv1.TaskRunning, nil), node: online, now: time.Hour},
		{name: "dispatching within the timeout", task: holding(1, batchv1.TaskDispatching, nil), node: online, now: time.Minute, recheck: 4 * time.Minute},
		{name: "dispatching past the timeout", task: holding(1, batchv1.TaskDispatching, nil), node: online, now: 5 * time.Minute,
			want: "Pending DispatchTimeout 2 -", history: "1 node-a Failed DispatchTimeout exit=nil"},
		{name: "scheduled past the timeout", task: holding(1, batchv1.TaskScheduled, nil), node: online, now: 6 * time.Minute,
			want: "Pending DispatchTimeout 2 -"},
		{name: "pending node: wait", task: holding(1, batchv1.TaskScheduled, nil), node: nodeView{exists: true, phase: fleetv1.FleetNodePending}, now: time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, recheck := step(tt.task, tt.node, t0.Add(tt.now), 5*time.Minute)
			if recheck != tt.recheck {
				t.Errorf("recheck = %v, want %v", recheck, tt.recheck)
			}
			if c == nil {
				if tt.want != "" {
					t.Fatalf("no change, want %s", tt.want)
				}
				return
			}
			st := c.status
			next := "-"
			if st.NextAttemptTime != nil {
				next = st.NextAttemptTime.Sub(t0).String()
			}
			if got := fmt.Sprintf("%s %s %d %s", st.State, st.Reason, st.Attempt, next); got != tt.want {
				t.Fatalf("status = %q, want %q (message %q)", got, tt.want, st.Message)
			}
			if st.State == batchv1.TaskPending && (st.NodeName != "" || st.ExitCode != nil || st.StartTime != nil || st.FinishTime != nil || st.OutputTail != "") {
				t.Errorf("new attempt keeps the old one's details: %+v", st)
			}
			if tt.history != "" {
				if len(st.History) == 0 {
					t.Fatal("no history")
				}
				h := st.History[len(st.History)-1]
				exit := "nil"
				if h.ExitCode != nil {
					exit = fmt.Sprint(*h.ExitCode)
				}
				if got := fmt.Sprintf("%d %s %s %s exit=%s", h.Attempt, h.Node, h.State, h.Reason, exit); got != tt.history {
					t.Errorf("history = %q, want %q", got, tt.history)
				}
				if h.FinishTime == nil {
					t.Error("history entry without finish time")
				}
			}
			if tt.task.Status.State == batchv1.TaskFailed && c.status.State == batchv1.TaskFailed && !strings.Contains(st.Message, "exit code 1") {
				t.Errorf("message %q lost the hub's cause", st.Message)
			}
		})
	}
}

func TestHistoryKeepsTheLast20(t *testing.T) {
	task := failed(30, func(t *batchv1.Task) { t.Spec.MaxAttempts = 100 })
	for i := range 20 {
		task.Status.History = append(task.Status.History, batchv1.TaskAttempt{Attempt: int32(i + 10)})
	}
	c, _ := step(task, nodeView{}, t0, time.Minute)
	h := c.status.History
	if len(h) != 20 || h[0].Attempt != 11 || h[19].Attempt != 30 {
		t.Errorf("history: %d entries, first %d, last %d", len(h), h[0].Attempt, h[len(h)-1].Attempt)
	}
}

func TestPhaseOf(t *testing.T) {
	tests := []struct {
		c       batchv1.TaskCounts
		want    int32
		prev    batchv1.GroupPhase
		out     batchv1.GroupPhase
		perNode bool
	}{
		{c: batchv1.TaskCounts{}, want: 3, out: batchv1.GroupPending},
		// Placed on a node is running, as its condition says ("1 running").
		{c: batchv1.TaskCounts{Total: 3, Pending: 2, Scheduled: 1}, want: 3, out: batchv1.GroupRunning},
		{c: batchv1.TaskCounts{Total: 1, Dispatching: 1}, want: 1, out: batchv1.GroupRunning},
		// A perNode group with no node yet waits; a counted one of 0 is done.
		{c: batchv1.TaskCounts{}, want: 0, out: batchv1.GroupPending, perNode: true},
		{c: batchv1.TaskCounts{}, want: 0, prev: batchv1.GroupRunning, out: batchv1.GroupRunning, perNode: true},
		{c: batchv1.TaskCounts{Total: 2, Completed: 2}, want: 2, prev: batchv1.GroupRunning, out: batchv1.GroupCompleted, perNode: true},
		{c: batchv1.TaskCounts{Total: 3, Pending: 2, Running: 1}, want: 3, out: batchv1.GroupRunning},
		{c: batchv1.TaskCounts{Total: 3, Pending: 3}, want: 3, prev: batchv1.GroupRunning, out: batchv1.GroupRunning},
		{c: batchv1.TaskCounts{Total: 2, Completed: 2}, want: 3, out: batchv1.GroupRunning},
		{c: batchv1.TaskCounts{Total: 3, Completed: 3}, want: 3, prev: batchv1.GroupRunning, out: batchv1.GroupCompleted},
		{c: batchv1.TaskCounts{Total: 3, Completed: 2, Failed: 1}, want: 3, prev: batchv1.GroupRunning, out: batchv1.GroupFailed},
		{c: batchv1.TaskCounts{}, want: 0, out: batchv1.GroupCompleted},
	}
	for _, tt := range tests {
		if got := phaseOf(tt.c, tt.want, tt.prev, tt.perNode); got != tt.out {
			t.Errorf("phaseOf(%+v, %d, %q, perNode %v) = %s, want %s", tt.c, tt.want, tt.prev, tt.perNode, got, tt.out)
		}
	}
}

func TestDesiredSpecFillsInTheJobsSettings(t *testing.T) {
	job := &batchv1.FleetJob{Spec: batchv1.FleetJobSpec{
		NodeSelector:     &metav1.LabelSelector{MatchLabels: map[string]string{"site": "a"}},
		Priority:         7,
		RestartPolicy:    batchv1.RestartOnFailure,
		ReschedulePolicy: batchv1.RescheduleNever,
	}}
	plain := desiredSpec(job, batchv1.TaskGroupTemplate{Name: "g", Count: 2, Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{
		Command: []string{"true"}}}})
	ts := plain.Template.Spec
	if ts.NodeSelector.MatchLabels["site"] != "a" || ts.Priority != 7 || ts.RestartPolicy != batchv1.RestartOnFailure || ts.ReschedulePolicy != batchv1.RescheduleNever || plain.Count != 2 {
		t.Errorf("filled in: %+v", ts)
	}
	own := desiredSpec(job, batchv1.TaskGroupTemplate{Name: "g", Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{
		NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"site": "b"}}, Priority: 1,
		RestartPolicy: batchv1.RestartNever, ReschedulePolicy: batchv1.RescheduleOnNodeLost}}})
	if own.Template.Spec.NodeSelector.MatchLabels["site"] != "b" || own.Template.Spec.Priority != 1 ||
		own.Template.Spec.RestartPolicy != batchv1.RestartNever || own.Template.Spec.ReschedulePolicy != batchv1.RescheduleOnNodeLost {
		t.Errorf("the template's own settings were overridden: %+v", own.Template.Spec)
	}
	if job.Spec.NodeSelector.MatchLabels["site"] != "a" {
		t.Error("job modified")
	}
}

// A failed attempt the manager will restart counts as Pending, so that a
// group with OnFailure does not show Failed between two attempts.
func TestCountedState(t *testing.T) {
	tests := []struct {
		name string
		task *batchv1.Task
		want batchv1.TaskState
	}{
		{"restarts: attempts left", failed(1, nil), batchv1.TaskPending},
		{"last attempt", failed(3, nil), batchv1.TaskFailed},
		{"restartPolicy Never", failed(1, func(t *batchv1.Task) { t.Spec.RestartPolicy = batchv1.RestartNever }), batchv1.TaskFailed},
		{"unset policy is Never", failed(1, func(t *batchv1.Task) { t.Spec.RestartPolicy = "" }), batchv1.TaskFailed},
		{"manager's own final reason", failed(1, func(t *batchv1.Task) { t.Status.Reason = batchv1.ReasonNodeLost }), batchv1.TaskFailed},
		{"running", holding(1, batchv1.TaskRunning, nil), batchv1.TaskRunning},
	}
	for _, tt := range tests {
		if got := countedState(tt.task); got != tt.want {
			t.Errorf("%s: countedState = %s, want %s", tt.name, got, tt.want)
		}
	}
}

func TestPhaseConditions(t *testing.T) {
	var conds []metav1.Condition
	c := batchv1.TaskCounts{Total: 2, Running: 1, Pending: 1, Active: 1}
	setPhaseConditions(&conds, batchv1.GroupRunning, completeCondition(batchv1.GroupRunning, c, 2, 1, "tasks"), time.Now())
	if meta.FindStatusCondition(conds, ConditionFailed) != nil {
		t.Errorf("a running group has a Failed condition: %+v", conds)
	}
	c = batchv1.TaskCounts{Total: 2, Completed: 1, Failed: 1}
	setPhaseConditions(&conds, batchv1.GroupFailed, completeCondition(batchv1.GroupFailed, c, 2, 1, "tasks"), time.Now())
	if f := meta.FindStatusCondition(conds, ConditionFailed); f == nil || f.Status != metav1.ConditionTrue || f.Reason != ReasonTasksFailed || f.Message != "1/2 tasks failed, 1 completed" {
		t.Errorf("Failed condition = %+v", f)
	}
	if !meta.IsStatusConditionFalse(conds, ConditionComplete) {
		t.Errorf("Complete condition of a failed group: %+v", conds)
	}
	// Scaled up afterwards: no longer Failed.
	c = batchv1.TaskCounts{Total: 3, Completed: 1, Failed: 1, Pending: 1}
	setPhaseConditions(&conds, batchv1.GroupRunning, completeCondition(batchv1.GroupRunning, c, 3, 2, "tasks"), time.Now())
	if f := meta.FindStatusCondition(conds, ConditionFailed); f == nil || f.Status != metav1.ConditionFalse || f.Reason != string(batchv1.GroupRunning) {
		t.Errorf("Failed condition after a scale-up = %+v", f)
	}
	if !settled(batchv1.GroupFailed, 3, 3) || settled(batchv1.GroupFailed, 2, 3) || settled(batchv1.GroupRunning, 3, 3) {
		t.Error("settled: final with an unchanged spec only")
	}
}

// The attempt just recorded keeps its output tail, and only it.
func TestHistoryKeepsTheLastOutput(t *testing.T) {
	task := failed(2, func(t *batchv1.Task) {
		t.Status.History = []batchv1.TaskAttempt{{Attempt: 1, OutputTail: "attempt 1 said this"}}
	})
	c, _ := step(task, nodeView{}, t0, time.Minute)
	h := c.status.History
	if len(h) != 2 || h[0].OutputTail != "" || h[1].OutputTail != "boom" || c.status.OutputTail != "" {
		t.Errorf("history %+v, current tail %q; want only attempt 2's tail kept, in history", h, c.status.OutputTail)
	}
}
