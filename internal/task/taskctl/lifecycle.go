package taskctl

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
)

const (
	// maxHistory is how many earlier attempts a task keeps (the API's limit).
	maxHistory = 20
	// maxBackoff caps the restart backoff.
	maxBackoff = 5 * time.Minute
	// defaultBackoff, defaultMaxAttempts: the API's defaults, for objects
	// written without them.
	defaultBackoff     = 10 * time.Second
	defaultMaxAttempts = 3
)

// managerFinal are the reasons of failures the manager itself made final;
// a Failed task with another reason was written by a hub and may restart.
var managerFinal = map[string]bool{
	batchv1.ReasonNodeLost:      true,
	ReasonDispatchTimeout:       true,
	batchv1.ReasonAttemptsSpent: true,
}

// nodeView is what the lifecycle needs of a task's node.
type nodeView struct {
	exists bool
	phase  fleetv1.FleetNodePhase
}

// change is one decision of the lifecycle: the status to write, and what to
// tell people about it.
type change struct {
	status    batchv1.TaskStatus
	eventType string
	reason    string
	note      string
	// metric names what happened: restart, reschedule, fail.
	metric string
}

// step decides what the manager does with task t now: restart a failed
// attempt, take an attempt off a lost node, give up. It returns nil when
// nothing changes, and when to look again (0: on the next change).
func step(t *batchv1.Task, node nodeView, now time.Time, dispatchTimeout time.Duration) (*change, time.Duration) {
	st := &t.Status
	switch {
	case st.State == batchv1.TaskFailed && !managerFinal[st.Reason]:
		return afterFailure(t, now), 0
	case st.State.Holds() && st.NodeName != "":
		if !node.exists || node.phase == fleetv1.FleetNodeOffline || node.phase == fleetv1.FleetNodeRevoked {
			why := "was deleted"
			if node.exists {
				why = "is " + string(node.phase)
			}
			return lose(t, now, batchv1.ReasonNodeLost, fmt.Sprintf("node %s %s", st.NodeName, why)), 0
		}
		if st.State == batchv1.TaskRunning || node.phase != fleetv1.FleetNodeOnline {
			return nil, 0
		}
		c := meta.FindStatusCondition(st.Conditions, ConditionScheduled)
		if c == nil || c.Status != metav1.ConditionTrue {
			return nil, 0
		}
		deadline := c.LastTransitionTime.Add(dispatchTimeout)
		if now.Before(deadline) {
			return nil, deadline.Sub(now)
		}
		return lose(t, now, ReasonDispatchTimeout, fmt.Sprintf("not started on node %s within %s although the node is Online", st.NodeName, dispatchTimeout)), 0
	}
	return nil, 0
}

func maxAttempts(t *batchv1.Task) int32 {
	if t.Spec.MaxAttempts > 0 {
		return t.Spec.MaxAttempts
	}
	return defaultMaxAttempts
}

// backoff is the wait after failed attempt n: backoff·2^(n-1), at most
// maxBackoff.
func backoff(t *batchv1.Task, n int32) time.Duration {
	d := defaultBackoff
	if t.Spec.Backoff != nil {
		d = t.Spec.Backoff.Duration
	}
	for i := int32(1); i < n && d < maxBackoff; i++ {
		d *= 2
	}
	return min(d, maxBackoff)
}

// record appends the current attempt to the history, keeping the last
// maxHistory. Only the new entry keeps its output tail: one tail is what a
// user asks for (the attempt before this one), and twenty would bloat the
// object.
func record(st *batchv1.TaskStatus, state batchv1.TaskState, reason string, finish *metav1.Time) {
	a := batchv1.TaskAttempt{Attempt: st.Attempt, Node: st.NodeName, State: state, Reason: reason, ExitCode: st.ExitCode, StartTime: st.StartTime, FinishTime: finish,
		OutputTail: st.OutputTail}
	for i := range st.History {
		st.History[i].OutputTail = ""
	}
	st.History = append(st.History, a)
	if len(st.History) > maxHistory {
		st.History = append([]batchv1.TaskAttempt(nil), st.History[len(st.History)-maxHistory:]...)
	}
}

// nextAttempt turns st into attempt n+1, Pending, with the current
// attempt's details cleared.
func nextAttempt(st *batchv1.TaskStatus, now time.Time, reason, message string) {
	st.Attempt++
	st.State = batchv1.TaskPending
	st.Reason, st.Message = reason, message
	st.NodeName = ""
	st.ExitCode, st.StartTime, st.FinishTime, st.NextAttemptTime = nil, nil, nil, nil
	st.OutputTail = ""
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: ConditionScheduled, Status: metav1.ConditionFalse, Reason: reason, Message: message, LastTransitionTime: metav1.NewTime(now)})
	// A hub may have written Failed True on the attempt that ended.
	meta.RemoveStatusCondition(&st.Conditions, batchv1.ConditionFailed)
	meta.RemoveStatusCondition(&st.Conditions, batchv1.ConditionComplete)
}

// endConditions sets the Complete and Failed conditions of st, a final
// status the manager made for t.
func endConditions(t *batchv1.Task, st *batchv1.TaskStatus, now time.Time) {
	c := t.DeepCopy()
	c.Status = *st
	batchv1.SetEndConditions(c, true, now)
	st.Conditions = c.Status.Conditions
}

// willRestart reports whether t is a Failed attempt that afterFailure will
// turn into a new one.
func willRestart(t *batchv1.Task) bool {
	return t.Status.State == batchv1.TaskFailed && !managerFinal[t.Status.Reason] &&
		t.Spec.RestartPolicy == batchv1.RestartOnFailure && t.Status.Attempt < maxAttempts(t)
}

func afterFailure(t *batchv1.Task, now time.Time) *change {
	st := t.Status.DeepCopy()
	n := st.Attempt
	cause := st.Reason
	if st.Message != "" {
		cause += ": " + st.Message
	}
	if t.Spec.RestartPolicy != batchv1.RestartOnFailure {
		return nil // Never: the hub's Failed is final as written
	}
	if n >= maxAttempts(t) {
		st.Reason = batchv1.ReasonAttemptsSpent
		st.Message = fmt.Sprintf("attempt %d of %d failed (%s)", n, maxAttempts(t), cause)
		endConditions(t, st, now)
		return &change{status: *st, eventType: corev1.EventTypeWarning, reason: batchv1.ReasonAttemptsSpent, note: st.Message, metric: "fail"}
	}
	// The backoff runs from the attempt's end; a finish time ahead of the
	// manager's clock (a node's clock running fast) is not waited for.
	finish := now
	if st.FinishTime != nil && st.FinishTime.Time.Before(now) {
		finish = st.FinishTime.Time
	}
	wait := backoff(t, n)
	next := metav1.NewTime(finish.Add(wait))
	record(st, batchv1.TaskFailed, st.Reason, st.FinishTime)
	nextAttempt(st, now, batchv1.ReasonBackoff, fmt.Sprintf("attempt %d failed (%s); attempt %d after %s", n, cause, n+1, wait))
	st.NextAttemptTime = &next
	return &change{status: *st, eventType: corev1.EventTypeWarning, reason: batchv1.ReasonBackoff, note: st.Message, metric: "restart"}
}

// lose ends the current attempt, lost with its node (or never started):
// a new attempt if the policy and the attempts left allow, else Failed.
func lose(t *batchv1.Task, now time.Time, reason, why string) *change {
	st := t.Status.DeepCopy()
	n := st.Attempt
	finish := metav1.NewTime(now)
	// Recorded Failed: whatever state it was last seen in, the attempt is
	// over (its process, if any, is stopped when the node comes back).
	record(st, batchv1.TaskFailed, reason, &finish)
	if t.Spec.ReschedulePolicy != batchv1.RescheduleNever && n < maxAttempts(t) {
		nextAttempt(st, now, reason, fmt.Sprintf("attempt %d lost: %s; attempt %d is rescheduled", n, why, n+1))
		return &change{status: *st, eventType: corev1.EventTypeWarning, reason: reason, note: st.Message, metric: "reschedule"}
	}
	st.State = batchv1.TaskFailed
	st.Reason = reason
	if t.Spec.ReschedulePolicy == batchv1.RescheduleNever {
		st.Message = fmt.Sprintf("attempt %d lost: %s; reschedulePolicy is Never", n, why)
	} else {
		st.Message = fmt.Sprintf("attempt %d of %d lost: %s", n, maxAttempts(t), why)
	}
	st.FinishTime = &finish
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: ConditionScheduled, Status: metav1.ConditionFalse, Reason: reason, Message: st.Message, LastTransitionTime: metav1.NewTime(now)})
	endConditions(t, st, now)
	return &change{status: *st, eventType: corev1.EventTypeWarning, reason: reason, note: st.Message, metric: "fail"}
}
