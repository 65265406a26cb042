package agentupdater

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
)

func TestDecide(t *testing.T) {
	job := func(phase opsv1.JobPhase, ok int32, abort bool, failures ...opsv1.NodeTaskSummary) *opsv1.NodeUpgradeJob {
		j := &opsv1.NodeUpgradeJob{ObjectMeta: metav1.ObjectMeta{Name: "j"}, Spec: opsv1.NodeUpgradeJobSpec{Version: "v2", Abort: abort}}
		j.Status.Phase = phase
		j.Status.Counts = opsv1.NodeTaskCounts{Total: 1, Successful: ok, Failure: 1 - ok}
		j.Status.Failures = failures
		return j
	}
	digest := opsv1.NodeTaskSummary{NodeName: "n1", Phase: "Failure", Action: "Download", Reason: "digest mismatch"}
	tests := []struct {
		name     string
		phase    updatev1.UpdatePhase
		node     string
		job      *opsv1.NodeUpgradeJob
		status   updatev1.UpdateStatus
		reason   string
		create   bool
		abort    bool
		contains string
	}{
		{"no node label", updatev1.PhaseUpdating, "", nil, updatev1.StatusFailed, ReasonNoNode, false, false, "node-name"},
		{"new task makes its job", updatev1.PhaseUpdating, "n1", nil, updatev1.StatusUpdating, ReasonUpgrading, true, false, ""},
		{"aborted before its job: node unchanged", updatev1.PhaseAborting, "n1", nil, updatev1.StatusAborted, ReasonNotStarted, false, false, "unchanged"},
		{"job running", updatev1.PhaseUpdating, "n1", job(opsv1.JobPhaseInProgress, 0, false), updatev1.StatusUpdating, ReasonUpgrading, false, false, "InProgress"},
		{"job done: updated", updatev1.PhaseUpdating, "n1", job(opsv1.JobPhaseCompleted, 1, false), updatev1.StatusUpdated, ReasonUpgraded, false, false, "runs v2"},
		{"job failed: failed, with the node's reason", updatev1.PhaseUpdating, "n1", job(opsv1.JobPhaseFailure, 0, false, digest), updatev1.StatusFailed, ReasonFailed, false, false, "Download: digest mismatch"},
		{"abort asked while running: abort the job once", updatev1.PhaseAborting, "n1", job(opsv1.JobPhaseInProgress, 0, false), updatev1.StatusAborting, ReasonAborting, false, true, ""},
		{"abort already asked: wait", updatev1.PhaseAborting, "n1", job(opsv1.JobPhaseInProgress, 0, true), updatev1.StatusAborting, ReasonAborting, false, false, ""},
		{"aborted job ended without the upgrade: aborted", updatev1.PhaseAborting, "n1", job(opsv1.JobPhaseFailure, 0, true), updatev1.StatusAborted, ReasonAborted, false, false, "keeps its version"},
		// An abort that came too late: the node finished; updated is
		// the truth, and the contract allows it ("as it is after").
		{"aborted job whose node finished: updated", updatev1.PhaseAborting, "n1", job(opsv1.JobPhaseFailure, 1, true), updatev1.StatusUpdated, ReasonUpgraded, false, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Decide(tt.phase, tt.node, tt.job)
			if d.Status != tt.status || d.Reason != tt.reason || d.CreateJob != tt.create || d.AbortJob != tt.abort || !strings.Contains(d.Message, tt.contains) {
				t.Errorf("Decide = %+v, want status %s reason %s create %v abort %v message containing %q", d, tt.status, tt.reason, tt.create, tt.abort, tt.contains)
			}
		})
	}
}
