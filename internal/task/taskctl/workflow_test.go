package taskctl_test

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	"github.com/drover-fleet/drover/internal/task/taskctl"
	"github.com/drover-fleet/drover/pkg/ctrlkit"
)

// TestWorkflowShape pins the optimized workflows of the Task, TaskGroup
// and FleetJob controllers for each kind of object, so that a change to
// them shows here.
func TestWorkflowShape(t *testing.T) {
	now := metav1.Now()
	deleted := metav1.ObjectMeta{DeletionTimestamp: &now, Finalizers: []string{"x"}}
	t.Run("Task", func(t *testing.T) {
		for _, tt := range []struct {
			name string
			task batchv1.Task
			want string
		}{
			{"running", batchv1.Task{Status: batchv1.TaskStatus{State: batchv1.TaskRunning}}, "Sequential(ReadNode, Step)"},
			{"failed: may restart", batchv1.Task{Status: batchv1.TaskStatus{State: batchv1.TaskFailed}}, "Sequential(ReadNode, Step)"},
			{"completed", batchv1.Task{Status: batchv1.TaskStatus{State: batchv1.TaskCompleted}}, "Nop"},
			{"being deleted", batchv1.Task{ObjectMeta: deleted}, "Nop"},
		} {
			m := taskctl.NewTaskLifecycle(taskctl.NewTaskLifecycleState(nil, &tt.task), nil)
			if got := ctrlkit.Optimize(taskctl.TaskWorkflow(m, &tt.task)).Description(); got != tt.want {
				t.Errorf("%s: workflow = %s, want %s", tt.name, got, tt.want)
			}
		}
	})
	t.Run("TaskGroup", func(t *testing.T) {
		done := batchv1.TaskGroup{ObjectMeta: metav1.ObjectMeta{Generation: 1}, Status: batchv1.TaskGroupStatus{Phase: batchv1.GroupCompleted, ObservedGeneration: 1}}
		for _, tt := range []struct {
			name  string
			group *batchv1.TaskGroup
			want  string
		}{
			{"gone", nil, "Sequential(LoadTasks, DeleteTasks)"},
			{"running", &batchv1.TaskGroup{}, "Sequential(Nodes, LoadTasks, DeleteTasks, Deadline, CreateTasks, UpdateStatus)"},
			{"done", &done, "Sequential(LoadTasks, DeleteTasks)"},
			{"being deleted", &batchv1.TaskGroup{ObjectMeta: deleted}, "Nop"},
		} {
			target := tt.group
			if target == nil {
				target = &batchv1.TaskGroup{}
			}
			m := taskctl.NewGroupManager(taskctl.NewGroupManagerState(nil, target), nil)
			if got := ctrlkit.Optimize(taskctl.GroupWorkflow(m, tt.group)).Description(); got != tt.want {
				t.Errorf("%s: workflow = %s, want %s", tt.name, got, tt.want)
			}
		}
	})
	t.Run("FleetJob", func(t *testing.T) {
		done := batchv1.FleetJob{ObjectMeta: metav1.ObjectMeta{Generation: 2}, Status: batchv1.FleetJobStatus{Phase: batchv1.GroupFailed, ObservedGeneration: 2}}
		for _, tt := range []struct {
			name string
			job  *batchv1.FleetJob
			want string
		}{
			{"gone", nil, "Sequential(LoadGroups, DeleteGroups)"},
			{"running", &batchv1.FleetJob{}, "Sequential(LoadGroups, DeleteGroups, SyncGroups, UpdateStatus)"},
			{"done", &done, "Nop"},
			{"being deleted", &batchv1.FleetJob{ObjectMeta: deleted}, "Nop"},
		} {
			target := tt.job
			if target == nil {
				target = &batchv1.FleetJob{}
			}
			m := taskctl.NewJobManager(taskctl.NewJobManagerState(nil, target), nil)
			if got := ctrlkit.Optimize(taskctl.JobWorkflow(m, tt.job)).Description(); got != tt.want {
				t.Errorf("%s: workflow = %s, want %s", tt.name, got, tt.want)
			}
		}
	})
}
