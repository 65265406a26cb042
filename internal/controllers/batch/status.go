package batch

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
)

// ConditionComplete on TaskGroups and FleetJobs: True once every task
// Completed; False with the phase as the reason otherwise (TasksFailed when
// every task is final and some failed).
const ConditionComplete = "Complete"

// ConditionScheduled on Tasks: True while an attempt is placed on a node;
// its lastTransitionTime is when the attempt was placed, which bounds how
// long the hub may take to start it.
const ConditionScheduled = "Scheduled"

// Reasons the manager writes, beside those of the batch API.
const (
	// ReasonDispatchTimeout: the attempt was not started within the dispatch
	// timeout although its node was Online.
	ReasonDispatchTimeout = "DispatchTimeout"
	// ReasonTasksFailed: every task is final and at least one Failed.
	ReasonTasksFailed = "TasksFailed"
	// ReasonFailedScheduling is the Event reason for an unschedulable task
	// (kube-scheduler's word).
	ReasonFailedScheduling = "FailedScheduling"
)

// addState counts one task in state s.
func addState(c *batchv1.TaskCounts, s batchv1.TaskState) {
	c.Total++
	switch s {
	case batchv1.TaskScheduled:
		c.Scheduled++
	case batchv1.TaskDispatching:
		c.Dispatching++
	case batchv1.TaskRunning:
		c.Running++
	case batchv1.TaskCompleted:
		c.Completed++
	case batchv1.TaskFailed:
		c.Failed++
	default: // "" is a task the scheduler has not looked at yet
		c.Pending++
	}
}

func addCounts(c *batchv1.TaskCounts, o batchv1.TaskCounts) {
	c.Total += o.Total
	c.Pending += o.Pending
	c.Scheduled += o.Scheduled
	c.Dispatching += o.Dispatching
	c.Running += o.Running
	c.Completed += o.Completed
	c.Failed += o.Failed
}

// phaseOf is the phase of tasks counted c out of want: final only when all
// want tasks are counted and final; Running once any task started (and
// then not Pending again, though a restarted task is Pending once more).
func phaseOf(c batchv1.TaskCounts, want int32, prev batchv1.GroupPhase) batchv1.GroupPhase {
	if c.Total == want && c.Completed+c.Failed == c.Total {
		if c.Failed > 0 {
			return batchv1.GroupFailed
		}
		return batchv1.GroupCompleted
	}
	if c.Dispatching+c.Running+c.Completed+c.Failed > 0 || prev != "" && prev != batchv1.GroupPending {
		return batchv1.GroupRunning
	}
	return batchv1.GroupPending
}

// completeCondition is the Complete condition for phase and counts.
func completeCondition(phase batchv1.GroupPhase, c batchv1.TaskCounts, want int32, generation int64) metav1.Condition {
	cond := metav1.Condition{Type: ConditionComplete, Status: metav1.ConditionFalse, Reason: string(phase), ObservedGeneration: generation}
	switch phase {
	case batchv1.GroupCompleted:
		cond.Status = metav1.ConditionTrue
		cond.Message = fmt.Sprintf("%d/%d tasks completed", c.Completed, want)
	case batchv1.GroupFailed:
		cond.Reason = ReasonTasksFailed
		cond.Message = fmt.Sprintf("%d/%d tasks failed, %d completed", c.Failed, want, c.Completed)
	default:
		cond.Message = fmt.Sprintf("%d/%d tasks completed, %d running, %d failed, %d pending", c.Completed, want, c.Running+c.Dispatching+c.Scheduled, c.Failed, want-c.Completed-c.Failed-c.Running-c.Dispatching-c.Scheduled)
	}
	return cond
}

// setComplete sets the Complete condition and reports whether conditions
// changed (ignoring the transition time that SetStatusCondition keeps).
func setComplete(conds *[]metav1.Condition, c metav1.Condition) bool {
	old := meta.FindStatusCondition(*conds, c.Type)
	if old != nil && old.Status == c.Status && old.Reason == c.Reason && old.Message == c.Message && old.ObservedGeneration == c.ObservedGeneration {
		return false
	}
	meta.SetStatusCondition(conds, c)
	return true
}

// controllerOf returns obj's controller owner reference, or nil.
func controllerOf(obj metav1.Object) *metav1.OwnerReference {
	return metav1.GetControllerOf(obj)
}
