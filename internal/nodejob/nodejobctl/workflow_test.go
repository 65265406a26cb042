package nodejobctl_test

import (
	"testing"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobctl"
	"github.com/drover-fleet/drover/pkg/ctrlkit"
)

// TestWorkflowShape pins the optimized workflow of each phase, so that a
// change to the workflow shows here. The optimizer resolves the phase's
// ExitIf and IfElse and splices the nested sequences.
func TestWorkflowShape(t *testing.T) {
	tests := []struct {
		phase opsv1.JobPhase
		want  string
	}{
		{"", "JoinOrdered(Sequential(DeleteStaleSlices, ResolveNodes, CreateSlices, UpdateStatus), RequeueForTimeouts)"},
		{opsv1.JobPhaseInit, "JoinOrdered(Sequential(DeleteStaleSlices, LoadSlices, StepNodes, UpdateStatus), RequeueForTimeouts)"},
		{opsv1.JobPhaseInProgress, "JoinOrdered(Sequential(DeleteStaleSlices, LoadSlices, StepNodes, UpdateStatus), RequeueForTimeouts)"},
		{opsv1.JobPhaseCompleted, "JoinOrdered(Sequential(DeleteStaleSlices, ExitIf(true), LoadSlices, StepNodes, UpdateStatus), RequeueForTimeouts)"},
	}
	for _, tt := range tests {
		t.Run("phase="+string(tt.phase), func(t *testing.T) {
			up := &opsv1.NodeUpgradeJob{}
			up.Status.Phase = tt.phase
			pp := &opsv1.ImagePrePullJob{}
			pp.Status.Phase = tt.phase
			managers := map[string]nodejobctl.Actions{
				"NodeUpgradeJob":  nodejobctl.NewNodeUpgradeJobManager(nodejobctl.NewNodeUpgradeJobManagerState(nil, up), nil),
				"ImagePrePullJob": nodejobctl.NewImagePrePullJobManager(nodejobctl.NewImagePrePullJobManagerState(nil, pp), nil),
			}
			jobs := map[string]opsv1.NodeJob{"NodeUpgradeJob": up, "ImagePrePullJob": pp}
			for kind, m := range managers {
				if got := ctrlkit.Optimize(nodejobctl.Workflow(m, jobs[kind])).Description(); got != tt.want {
					t.Errorf("%s workflow =\n  %s\nwant\n  %s", kind, got, tt.want)
				}
			}
		})
	}
}
