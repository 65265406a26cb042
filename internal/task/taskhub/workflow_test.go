package taskhub_test

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	"github.com/drover-fleet/drover/internal/task/taskhub"
	"github.com/drover-fleet/drover/pkg/ctrlkit"
)

// TestWorkflowShape pins the dispatcher's optimized workflow for each kind
// of Task, so that a change to it shows here.
func TestWorkflowShape(t *testing.T) {
	now := metav1.Now()
	tests := []struct {
		name string
		task func(*batchv1.Task)
		want string
	}{
		{"scheduled", func(t *batchv1.Task) { t.Status.State = batchv1.TaskScheduled },
			"Sequential(AwaitHub, CancelSuperseded, Dispatch)"},
		{"ended, finalizer still on", func(t *batchv1.Task) {
			t.Status.State = batchv1.TaskCompleted
			t.Finalizers = []string{taskhub.FinalizerCleanup}
		}, "Sequential(ReleaseEnded, AwaitHub, CancelSuperseded, Dispatch)"},
		{"deleted", func(t *batchv1.Task) {
			t.DeletionTimestamp = &now
			t.Finalizers = []string{taskhub.FinalizerCleanup}
		}, "Cleanup"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			task := &batchv1.Task{}
			tt.task(task)
			m := taskhub.NewTaskDispatcher(taskhub.NewTaskDispatcherState(nil, task), nil)
			if got := ctrlkit.Optimize(taskhub.Workflow(m, task)).Description(); got != tt.want {
				t.Errorf("workflow = %s, want %s", got, tt.want)
			}
		})
	}
}
