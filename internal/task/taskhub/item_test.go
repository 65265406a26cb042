package taskhub

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	"github.com/drover-fleet/drover/internal/task/taskwire"
)

// A task's memory and cpu travel in its work item, for agents that enforce
// them as cgroup limits.
func TestItemResources(t *testing.T) {
	task := &batchv1.Task{Spec: batchv1.TaskSpec{Command: []string{"true"}, Resources: corev1.ResourceList{
		corev1.ResourceMemory: resource.MustParse("256Mi"), corev1.ResourceCPU: resource.MustParse("1500m"),
		"gpu": resource.MustParse("1")}}}
	item, err := Item(task)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := taskwire.DecodeSpec(item.Spec)
	if err != nil {
		t.Fatal(err)
	}
	if spec.MemoryBytes != 256<<20 || spec.CPUMillis != 1500 {
		t.Errorf("spec memory %d, cpu %dm; want %d, 1500m", spec.MemoryBytes, spec.CPUMillis, 256<<20)
	}
}

// A task's securityContext and relative workingDir reach the agent.
func TestItemRunAs(t *testing.T) {
	uid, gid := int64(1234), int64(4321)
	task := &batchv1.Task{Spec: batchv1.TaskSpec{Command: []string{"true"}, WorkingDir: "build/out",
		SecurityContext: &batchv1.TaskSecurityContext{RunAsUser: &uid, RunAsGroup: &gid}}}
	item, err := Item(task)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := taskwire.DecodeSpec(item.Spec)
	if err != nil {
		t.Fatal(err)
	}
	if spec.RunAsUser == nil || *spec.RunAsUser != uid || spec.RunAsGroup == nil || *spec.RunAsGroup != gid || spec.WorkingDir != "build/out" {
		t.Errorf("spec runAs %v:%v, workingDir %q; want 1234:4321, build/out", spec.RunAsUser, spec.RunAsGroup, spec.WorkingDir)
	}
	task.Spec.SecurityContext = nil
	if item, err = Item(task); err != nil {
		t.Fatal(err)
	}
	if spec, err = taskwire.DecodeSpec(item.Spec); err != nil || spec.RunsAs() {
		t.Errorf("without a securityContext: %+v, %v; want no runAs", spec, err)
	}
}
