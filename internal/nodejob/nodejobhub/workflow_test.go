package nodejobhub_test

import (
	"testing"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobhub"
	"github.com/drover-fleet/drover/pkg/ctrlkit"
)

// TestWorkflowShape pins the executor's optimized workflow, so that a
// change to it shows here: nothing is sent before the executor has loaded
// every slice.
func TestWorkflowShape(t *testing.T) {
	tests := []struct {
		synced bool
		want   string
	}{
		{false, "IndexSlice"},
		{true, "Sequential(IndexSlice, SendWork)"},
	}
	for _, tt := range tests {
		m := nodejobhub.NewNodeJobExecutor(nodejobhub.NewNodeJobExecutorState(nil, &opsv1.NodeTaskSlice{}), nil)
		if got := ctrlkit.Optimize(nodejobhub.Workflow(m, tt.synced)).Description(); got != tt.want {
			t.Errorf("synced=%v: workflow = %s, want %s", tt.synced, got, tt.want)
		}
	}
}
