package v1alpha1

import (
	"fmt"
	"regexp"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Condition types a Task, a TaskGroup and a FleetJob end with, as a
// batch/v1 Job does: `kubectl wait --for=condition=Complete task/NAME`.
const (
	// ConditionComplete is True once every task completed (a Task: its
	// attempt exited 0).
	ConditionComplete = "Complete"
	// ConditionFailed is True once it failed for good: no attempt follows.
	ConditionFailed = "Failed"
)

// conditionReason is what metav1.Condition's schema allows a reason to be.
var conditionReason = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)

// DefaultMaxAttempts is maxAttempts when unset (the API defaults it).
const DefaultMaxAttempts = 3

// Restartable reports whether a failed attempt of t is followed by another:
// restartPolicy OnFailure with attempts left. The manager restarts it; a
// failure is final otherwise.
func (t *Task) Restartable() bool {
	limit := t.Spec.MaxAttempts
	if limit <= 0 {
		limit = DefaultMaxAttempts
	}
	return t.Spec.RestartPolicy == RestartOnFailure && t.Status.Attempt < limit
}

// SetEndConditions makes t's Complete and Failed conditions say what its
// state says: Complete True once Completed, Failed True once Failed and not
// Restartable (or final whatever the policy, when final is set: the manager
// gave up); neither while it may still run. It reports whether they changed.
func SetEndConditions(t *Task, final bool, now time.Time) bool {
	st := &t.Status
	complete, failed := st.State == TaskCompleted, st.State == TaskFailed && (final || !t.Restartable())
	changed := false
	set := func(typ string, on bool) {
		if !on {
			changed = meta.RemoveStatusCondition(&st.Conditions, typ) || changed
			return
		}
		c := metav1.Condition{Type: typ, Status: metav1.ConditionTrue, Reason: st.Reason, Message: st.Message,
			LastTransitionTime: metav1.NewTime(now)}
		if !conditionReason.MatchString(c.Reason) {
			c.Reason = string(st.State)
		}
		if old := meta.FindStatusCondition(st.Conditions, typ); old != nil && old.Status == c.Status && old.Reason == c.Reason && old.Message == c.Message {
			return
		}
		meta.SetStatusCondition(&st.Conditions, c)
		changed = true
	}
	set(ConditionComplete, complete)
	set(ConditionFailed, failed)
	return changed
}

// AttemptNode is the node attempt n of t ran on (0: the current attempt),
// from its status and history, or an error that says why there is none.
func AttemptNode(t *Task, n int32) (string, error) {
	st := &t.Status
	if n == 0 || n == st.Attempt {
		if st.NodeName == "" || st.Attempt < 1 {
			return "", fmt.Errorf("task %s/%s: attempt %d has not been scheduled to a node yet (state %s)", t.Namespace, t.Name, max(st.Attempt, 1), orNone(string(st.State)))
		}
		return st.NodeName, nil
	}
	if n < 0 || n > st.Attempt {
		return "", fmt.Errorf("task %s/%s has no attempt %d (it is at attempt %d)", t.Namespace, t.Name, n, st.Attempt)
	}
	for _, a := range st.History {
		if a.Attempt == n {
			if a.Node == "" {
				return "", fmt.Errorf("task %s/%s: attempt %d never reached a node (%s)", t.Namespace, t.Name, n, orNone(a.Reason))
			}
			return a.Node, nil
		}
	}
	return "", fmt.Errorf("task %s/%s: attempt %d is not in its history (which keeps the last attempts only)", t.Namespace, t.Name, n)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
