package taskctl

import (
	"slices"
	"testing"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
)

func TestStepInstance(t *testing.T) {
	defs := []batchv1.GroupTask{
		{Name: "fetch", Lifecycle: batchv1.LifecycleInit},
		{Name: "migrate", Lifecycle: batchv1.LifecycleInit},
		{Name: "work"},
		{Name: "log", Lifecycle: batchv1.LifecycleSidecar},
	}
	is := func(s batchv1.TaskState) memberObs { return memberObs{exists: true, state: s} }
	gated := memberObs{exists: true, state: "", gated: true}
	tests := []struct {
		name       string
		obs        map[string]memberObs
		wantCreate map[string]bool
		wantUngate []string
		wantStop   []string
		wantState  batchv1.TaskState
		wantReason string
		wantProg   map[string]progress
	}{
		{"nothing yet: all made, all but the first init gated", nil,
			map[string]bool{"fetch": false, "migrate": true, "work": true, "log": true}, nil, nil, batchv1.TaskPending, "",
			map[string]progress{"fetch": progWaiting, "work": progWaiting}},
		{"first init running: the rest wait",
			map[string]memberObs{"fetch": is(batchv1.TaskRunning), "migrate": gated, "work": gated, "log": gated},
			map[string]bool{}, nil, nil, batchv1.TaskRunning, "", map[string]progress{"fetch": progActive, "migrate": progWaiting}},
		{"first init completed: the second's turn",
			map[string]memberObs{"fetch": is(batchv1.TaskCompleted), "migrate": gated, "work": gated, "log": gated},
			map[string]bool{}, []string{"migrate"}, nil, batchv1.TaskRunning, "", map[string]progress{"fetch": progCompleted}},
		{"inits completed: mains and sidecars start together",
			map[string]memberObs{"fetch": is(batchv1.TaskCompleted), "migrate": is(batchv1.TaskCompleted), "work": gated, "log": gated},
			map[string]bool{}, []string{"work", "log"}, nil, batchv1.TaskRunning, "", nil},
		{"an init failed: the rest are stopped, InitFailed",
			map[string]memberObs{"fetch": is(batchv1.TaskCompleted), "migrate": is(batchv1.TaskFailed), "work": gated, "log": gated},
			map[string]bool{}, nil, []string{"work", "log"}, batchv1.TaskFailed, batchv1.ReasonInitFailed,
			map[string]progress{"migrate": progFailed, "work": progStopped, "log": progStopped}},
		{"an init failed and the rest are gone: not made again",
			map[string]memberObs{"fetch": is(batchv1.TaskFailed)},
			map[string]bool{}, nil, nil, batchv1.TaskFailed, batchv1.ReasonInitFailed, map[string]progress{"migrate": progStopped}},
		{"an init that will be restarted counts as pending, not failed",
			map[string]memberObs{"fetch": is(batchv1.TaskPending), "migrate": gated, "work": gated, "log": gated},
			map[string]bool{}, nil, nil, batchv1.TaskPending, "", nil},
		{"main ended: the sidecar is stopped, the instance still runs",
			map[string]memberObs{"fetch": is(batchv1.TaskCompleted), "migrate": is(batchv1.TaskCompleted), "work": is(batchv1.TaskCompleted), "log": is(batchv1.TaskRunning)},
			map[string]bool{}, nil, []string{"log"}, batchv1.TaskRunning, "", map[string]progress{"log": progStopped, "work": progCompleted}},
		{"sidecar being deleted: not stopped twice, still running",
			map[string]memberObs{"fetch": is(batchv1.TaskCompleted), "migrate": is(batchv1.TaskCompleted), "work": is(batchv1.TaskCompleted),
				"log": {terminating: true}},
			map[string]bool{}, nil, nil, batchv1.TaskRunning, "", nil},
		{"sidecar gone after the mains: Completed, not made again",
			map[string]memberObs{"fetch": is(batchv1.TaskCompleted), "migrate": is(batchv1.TaskCompleted), "work": is(batchv1.TaskCompleted)},
			map[string]bool{}, nil, nil, batchv1.TaskCompleted, "", map[string]progress{"log": progStopped}},
		{"the result follows the mains: a failed main fails it",
			map[string]memberObs{"fetch": is(batchv1.TaskCompleted), "migrate": is(batchv1.TaskCompleted), "work": is(batchv1.TaskFailed), "log": is(batchv1.TaskCompleted)},
			map[string]bool{}, nil, nil, batchv1.TaskFailed, ReasonTasksFailed, nil},
		{"a failed sidecar does not fail the instance",
			map[string]memberObs{"fetch": is(batchv1.TaskCompleted), "migrate": is(batchv1.TaskCompleted), "work": is(batchv1.TaskCompleted), "log": is(batchv1.TaskFailed)},
			map[string]bool{}, nil, nil, batchv1.TaskCompleted, "", map[string]progress{"log": progFailed}},
		{"a main deleted by hand while running is made again, ungated",
			map[string]memberObs{"fetch": is(batchv1.TaskCompleted), "migrate": is(batchv1.TaskCompleted), "log": is(batchv1.TaskRunning)},
			map[string]bool{"work": false}, nil, nil, batchv1.TaskRunning, "", nil},
		{"a main being deleted waits until it is gone",
			map[string]memberObs{"fetch": is(batchv1.TaskCompleted), "migrate": is(batchv1.TaskCompleted), "log": is(batchv1.TaskRunning),
				"work": {terminating: true}},
			map[string]bool{}, nil, nil, batchv1.TaskRunning, "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := stepInstance(defs, tt.obs)
			if len(got.create) != len(tt.wantCreate) {
				t.Errorf("create = %v, want %v", got.create, tt.wantCreate)
			}
			for k, g := range tt.wantCreate {
				if v, ok := got.create[k]; !ok || v != g {
					t.Errorf("create[%s] = %v,%v, want gated=%v", k, v, ok, g)
				}
			}
			if !slices.Equal(got.ungate, tt.wantUngate) {
				t.Errorf("ungate = %v, want %v", got.ungate, tt.wantUngate)
			}
			if !slices.Equal(got.stop, tt.wantStop) {
				t.Errorf("stop = %v, want %v", got.stop, tt.wantStop)
			}
			if got.state != tt.wantState || got.reason != tt.wantReason {
				t.Errorf("state = %s (%s), want %s (%s)", got.state, got.reason, tt.wantState, tt.wantReason)
			}
			for k, p := range tt.wantProg {
				if got.members[k] != p {
					t.Errorf("members[%s] = %d, want %d", k, got.members[k], p)
				}
			}
		})
	}
}

func TestStepInstanceWithoutInits(t *testing.T) {
	defs := []batchv1.GroupTask{{Name: "a"}, {Name: "b", Lifecycle: batchv1.LifecycleSidecar}}
	got := stepInstance(defs, nil)
	if got.create["a"] || got.create["b"] || len(got.create) != 2 {
		t.Errorf("create = %v, want both, ungated", got.create)
	}
}
