package agentupdater

import (
	"fmt"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
)

// Reasons on the task's Ready condition.
const (
	ReasonUpgrading  = "Upgrading"
	ReasonUpgraded   = "Upgraded"
	ReasonAborting   = "Aborting"
	ReasonAborted    = "Aborted"
	ReasonNotStarted = "AbortedBeforeStart"
	ReasonFailed     = "UpgradeFailed"
	ReasonNoNode     = "NoNode"
)

// Decision is what the updater does with a task.
type Decision struct {
	Status          updatev1.UpdateStatus
	Reason, Message string
	// CreateJob: the task has no job yet and must get one.
	CreateJob bool
	// AbortJob: set the job's spec.abort.
	AbortJob bool
}

// Decide maps a task's phase and its job (nil: none yet) to the task's
// status. The contract's words: updated only when the node runs the new
// version; aborted only when it is as before or as after, never between
// (an aborted job lets a node that started finish or roll back, so its
// end decides); failed when retrying cannot help (the job failed and the
// node rolled back: the same binary fails again).
func Decide(phase updatev1.UpdatePhase, node string, job *opsv1.NodeUpgradeJob) Decision {
	aborting := phase == updatev1.PhaseAborting
	switch {
	case node == "":
		return Decision{Status: updatev1.StatusFailed, Reason: ReasonNoNode, Message: "the task has no update.drover.io/node-name label: Drover's node controller makes these tasks"}
	case job == nil && aborting:
		return Decision{Status: updatev1.StatusAborted, Reason: ReasonNotStarted, Message: "aborted before the upgrade started; the node is unchanged"}
	case job == nil:
		return Decision{Status: updatev1.StatusUpdating, Reason: ReasonUpgrading, Message: "creating the node upgrade job", CreateJob: true}
	}
	st := job.Status
	final := st.Phase == opsv1.JobPhaseCompleted || st.Phase == opsv1.JobPhaseFailure
	switch {
	case final && st.Counts.Successful > 0:
		return Decision{Status: updatev1.StatusUpdated, Reason: ReasonUpgraded, Message: fmt.Sprintf("node %s runs %s", node, job.Spec.Version)}
	case final && (aborting || job.Spec.Abort):
		return Decision{Status: updatev1.StatusAborted, Reason: ReasonAborted, Message: fmt.Sprintf("upgrade aborted; node %s keeps its version", node)}
	case final:
		why := "the node upgrade job failed"
		for _, f := range st.Failures {
			if f.NodeName == node {
				why = fmt.Sprintf("%s at %s: %s", f.Phase, orDash(f.Action), f.Reason)
				break
			}
		}
		return Decision{Status: updatev1.StatusFailed, Reason: ReasonFailed, Message: fmt.Sprintf("node %s: %s (NodeUpgradeJob %s)", node, why, job.Name)}
	case aborting:
		return Decision{Status: updatev1.StatusAborting, Reason: ReasonAborting, Message: fmt.Sprintf("waiting for NodeUpgradeJob %s to stop", job.Name), AbortJob: !job.Spec.Abort}
	}
	return Decision{Status: updatev1.StatusUpdating, Reason: ReasonUpgrading, Message: fmt.Sprintf("NodeUpgradeJob %s: %s", job.Name, orDash(string(st.Phase)))}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
