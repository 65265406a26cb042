package taskctl

import (
	"context"
	"fmt"
	"sort"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
)

// ConditionComplete on TaskGroups and FleetJobs: True once every task
// Completed; False with the phase as the reason otherwise (TasksFailed when
// every task is final and some failed).
const ConditionComplete = "Complete"

// ConditionFailed on TaskGroups and FleetJobs: True once every task is
// final and some failed (as batch/v1 Jobs, so that `kubectl wait
// --for=condition=Failed` ends); False if that changes again.
const ConditionFailed = "Failed"

// ConditionScheduled on Tasks: True while an attempt is placed on a node;
// its lastTransitionTime is when the attempt was placed, which bounds how
// long the hub may take to start it.
const ConditionScheduled = "Scheduled"

// ConditionCreateFailed on TaskGroups and FleetJobs: True while the API
// refuses to create some of a group's Tasks or a job's TaskGroups (the
// tenancy admission webhook's Forbidden, a schema's Invalid), with the
// API's answer as the message; removed once everything could be made. A
// job also shows its groups' refusals. (ReplicaSets' ReplicaFailure.)
const ConditionCreateFailed = "CreateFailed"

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
	// ReasonFailedCreate: the API refused a dependent object (the
	// CreateFailed condition's reason and the Event's; kube's word).
	ReasonFailedCreate = "FailedCreate"
)

// refusal is a create (or update) the API refused for what it asked.
type refusal struct {
	kind, name string
	err        error
}

// createFailedMessage says what was refused: the first by name, in the
// API's words, and how many more.
func createFailedMessage(rs []refusal) string {
	sort.Slice(rs, func(i, j int) bool { return rs[i].name < rs[j].name })
	msg := fmt.Sprintf("the API refused %s %s", rs[0].kind, rs[0].name)
	if len(rs) > 1 {
		msg += fmt.Sprintf(" (and %d more)", len(rs)-1)
	}
	msg += ": " + rs[0].err.Error()
	if len(msg) > maxConditionMessage {
		msg = msg[:maxConditionMessage-3] + "..."
	}
	return msg
}

// maxConditionMessage bounds a message quoted from elsewhere (the API
// allows 32768 bytes; a describe should stay readable).
const maxConditionMessage = 4096

// setCreateFailed sets the CreateFailed condition from message ("" when
// nothing was refused: the condition goes) and reports whether it is new
// or says something new, which deserves an Event.
func setCreateFailed(conds *[]metav1.Condition, message string, generation int64, now time.Time) bool {
	if message == "" {
		meta.RemoveStatusCondition(conds, ConditionCreateFailed)
		return false
	}
	old := meta.FindStatusCondition(*conds, ConditionCreateFailed)
	if old != nil && old.Status == metav1.ConditionTrue && old.Message == message {
		if old.ObservedGeneration != generation {
			old.ObservedGeneration = generation
		}
		return false
	}
	meta.SetStatusCondition(conds, metav1.Condition{Type: ConditionCreateFailed, Status: metav1.ConditionTrue, Reason: ReasonFailedCreate,
		Message: message, ObservedGeneration: generation, LastTransitionTime: metav1.NewTime(now)})
	return true
}

// countedState is the state task t counts as: a Failed attempt that the
// manager will restart counts as Pending, so that its group does not look
// Failed (and then Running again) for the moment before the restart.
func countedState(t *batchv1.Task) batchv1.TaskState {
	if willRestart(t) {
		return batchv1.TaskPending
	}
	return t.Status.State
}

// addState counts one task in state s.
func addState(c *batchv1.TaskCounts, s batchv1.TaskState) {
	c.Total++
	switch s {
	case batchv1.TaskScheduled:
		c.Scheduled++
		c.Active++
	case batchv1.TaskDispatching:
		c.Dispatching++
		c.Active++
	case batchv1.TaskRunning:
		c.Running++
		c.Active++
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
	c.Active += o.Scheduled + o.Dispatching + o.Running
}

// phaseOf is the phase of tasks counted c out of want: final only when all
// want tasks are counted and final; Running once any task is placed on a
// node (Scheduled, as a Pod bound to a node counts as started for its
// Job; and then not Pending again, though a restarted task is Pending once
// more). waitForSome: none wanted is not done but waiting (a perNode
// group before any node matches).
func phaseOf(c batchv1.TaskCounts, want int32, prev batchv1.GroupPhase, waitForSome bool) batchv1.GroupPhase {
	if c.Total == want && c.Completed+c.Failed == c.Total && (want > 0 || !waitForSome) {
		if c.Failed > 0 {
			return batchv1.GroupFailed
		}
		return batchv1.GroupCompleted
	}
	if c.Scheduled+c.Dispatching+c.Running+c.Completed+c.Failed > 0 || prev != "" && prev != batchv1.GroupPending {
		return batchv1.GroupRunning
	}
	return batchv1.GroupPending
}

// completeCondition is the Complete condition for phase and counts; unit
// is what the counts count ("tasks", or "instances" of a multi-task group).
func completeCondition(phase batchv1.GroupPhase, c batchv1.TaskCounts, want int32, generation int64, unit string) metav1.Condition {
	cond := metav1.Condition{Type: ConditionComplete, Status: metav1.ConditionFalse, Reason: string(phase), ObservedGeneration: generation}
	switch phase {
	case batchv1.GroupCompleted:
		cond.Status = metav1.ConditionTrue
		cond.Message = fmt.Sprintf("%d/%d %s completed", c.Completed, want, unit)
	case batchv1.GroupFailed:
		cond.Reason = ReasonTasksFailed
		cond.Message = fmt.Sprintf("%d/%d %s failed, %d completed", c.Failed, want, unit, c.Completed)
	default:
		cond.Message = fmt.Sprintf("%d/%d %s completed, %d running, %d failed, %d pending", c.Completed, want, unit, c.Running+c.Dispatching+c.Scheduled, c.Failed, want-c.Completed-c.Failed-c.Running-c.Dispatching-c.Scheduled)
	}
	return cond
}

// failedCondition is the Failed condition for phase, or nil when there is
// none to write: it appears when the phase first becomes Failed.
func failedCondition(phase batchv1.GroupPhase, complete metav1.Condition, conds []metav1.Condition) *metav1.Condition {
	if phase == batchv1.GroupFailed {
		c := complete
		c.Type, c.Status = ConditionFailed, metav1.ConditionTrue
		return &c
	}
	if meta.FindStatusCondition(conds, ConditionFailed) == nil {
		return nil
	}
	return &metav1.Condition{Type: ConditionFailed, Status: metav1.ConditionFalse, Reason: string(phase), Message: complete.Message, ObservedGeneration: complete.ObservedGeneration}
}

// setPhaseConditions sets Complete and, where it applies, Failed; a
// condition that changes status gets now as its transition time.
func setPhaseConditions(conds *[]metav1.Condition, phase batchv1.GroupPhase, complete metav1.Condition, now time.Time) {
	complete.LastTransitionTime = metav1.NewTime(now)
	setComplete(conds, complete)
	if f := failedCondition(phase, complete, *conds); f != nil {
		setComplete(conds, *f)
	}
}

// setComplete sets condition c and reports whether conditions changed
// (ignoring the transition time that SetStatusCondition keeps).
func setComplete(conds *[]metav1.Condition, c metav1.Condition) bool {
	old := meta.FindStatusCondition(*conds, c.Type)
	if old != nil && old.Status == c.Status && old.Reason == c.Reason && old.Message == c.Message && old.ObservedGeneration == c.ObservedGeneration {
		return false
	}
	meta.SetStatusCondition(conds, c)
	return true
}

// settled reports whether a group or job with phase and observed
// generation is done for good: final, and its spec unchanged since. Its
// status then stays as it is, and tasks deleted afterwards are not made
// again (a finished batch/v1 Job does not re-create its Pods either).
func settled(phase batchv1.GroupPhase, observed, generation int64) bool {
	return phase.Final() && observed == generation
}

// controllerOf returns obj's controller owner reference, or nil.
func controllerOf(obj metav1.Object) *metav1.OwnerReference {
	return metav1.GetControllerOf(obj)
}

// deleteDependent deletes obj, which the cache shows as controlled by the
// owner with uid, unless the apiserver says otherwise: an orphaning delete
// of the owner (`kubectl delete --cascade=orphan`) has the garbage
// collector remove the owner reference, and the cache may not show that
// yet. The delete is conditional on what was read. reader nil: the cache's
// copy is trusted. It reports whether obj was deleted.
func deleteDependent(ctx context.Context, c client.Client, reader client.Reader, obj client.Object, owner types.UID) (bool, error) {
	if reader != nil {
		fresh := obj.DeepCopyObject().(client.Object)
		if err := reader.Get(ctx, client.ObjectKeyFromObject(obj), fresh); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		if ref := controllerOf(fresh); ref == nil || ref.UID != owner || fresh.GetDeletionTimestamp() != nil {
			return false, nil // orphaned meanwhile, or already going
		}
		uid, rv := fresh.GetUID(), fresh.GetResourceVersion()
		err := c.Delete(ctx, fresh, client.Preconditions{UID: &uid, ResourceVersion: &rv})
		if apierrors.IsConflict(err) {
			// Changed since read: its update event brings the owner back.
			return false, nil
		}
		return err == nil, client.IgnoreNotFound(err)
	}
	err := c.Delete(ctx, obj)
	return err == nil, client.IgnoreNotFound(err)
}
