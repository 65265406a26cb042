package inplace

import (
	"reflect"
	"testing"

	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
)

func TestStepPlan(t *testing.T) {
	pool := func(name string, seq int32, plan string, phase updatev1.UpdatePhase, st updatev1.UpdateStatus) PoolState {
		return PoolState{Name: name, Sequence: seq, Exists: true, Plan: plan, Phase: phase, UpdateStatus: st, Observed: true}
	}
	const U, A = updatev1.PhaseUpdating, updatev1.PhaseAborting
	tests := []struct {
		name        string
		in          PlanInput
		wantLabel   []string
		wantPhase   map[string]updatev1.UpdatePhase
		wantRelease []string
		wantAbort   []string
		wantStatus  updatev1.UpdateStatus
		wantCurrent int32
		wantWaiting string
	}{
		{"labels its pools and starts sequence 1 (the control plane)", PlanInput{Name: "p", Phase: U, Pools: []PoolState{pool("md1", 2, "", "", ""), pool("cp", 1, "", "", "")}},
			[]string{"cp", "md1"}, map[string]updatev1.UpdatePhase{"cp": U}, nil, nil, updatev1.StatusUpdating, 1, ""},
		{"sequence 2 starts its pools together once sequence 1 is updated", PlanInput{Name: "p", Phase: U, Pools: []PoolState{pool("cp", 1, "p", U, updatev1.StatusUpdated), pool("md1", 2, "p", "", ""), pool("md2", 2, "p", "", "")}},
			nil, map[string]updatev1.UpdatePhase{"md1": U, "md2": U}, nil, nil, updatev1.StatusUpdating, 2, ""},
		{"a pool status not observed for its spec is not trusted", PlanInput{Name: "p", Phase: U, Pools: []PoolState{{Name: "cp", Sequence: 1, Exists: true, Plan: "p", Phase: U, UpdateStatus: updatev1.StatusUpdated}}},
			nil, map[string]updatev1.UpdatePhase{}, nil, nil, updatev1.StatusUpdating, 1, ""},
		{"every sequence updated: updated, pools released", PlanInput{Name: "p", Phase: U, Pools: []PoolState{pool("cp", 1, "p", U, updatev1.StatusUpdated), pool("md1", 2, "p", U, updatev1.StatusUpdated)}},
			nil, map[string]updatev1.UpdatePhase{}, []string{"cp", "md1"}, nil, updatev1.StatusUpdated, 0, ""},
		{"waits while another plan runs on its pools", PlanInput{Name: "p", Phase: U, Holders: map[string]bool{"old": false}, Pools: []PoolState{pool("cp", 1, "old", U, updatev1.StatusUpdating)}},
			nil, map[string]updatev1.UpdatePhase{}, nil, nil, "", 0, "old"},
		{"a newer change aborts the running plan and waits for it", PlanInput{Name: "p", Phase: U, Newer: true, Holders: map[string]bool{"old": false}, Pools: []PoolState{pool("cp", 1, "old", U, updatev1.StatusUpdating)}},
			nil, map[string]updatev1.UpdatePhase{}, nil, []string{"old"}, "", 0, "old"},
		{"an ended holder does not block", PlanInput{Name: "p", Phase: U, Holders: map[string]bool{"old": true}, Pools: []PoolState{pool("cp", 1, "old", "", updatev1.StatusAborted)}},
			[]string{"cp"}, map[string]updatev1.UpdatePhase{"cp": U}, nil, nil, updatev1.StatusUpdating, 1, ""},
		{"aborting moves updating pools to aborting", PlanInput{Name: "p", Phase: A, Pools: []PoolState{pool("cp", 1, "p", U, updatev1.StatusUpdated), pool("md1", 2, "p", U, updatev1.StatusUpdating), pool("md2", 3, "p", "", "")}},
			nil, map[string]updatev1.UpdatePhase{"cp": A, "md1": A}, nil, nil, updatev1.StatusAborting, 0, ""},
		{"aborted once its pools ended; labels removed", PlanInput{Name: "p", Phase: A, Pools: []PoolState{pool("cp", 1, "p", A, updatev1.StatusAborted), pool("md1", 2, "p", "", "")}},
			nil, map[string]updatev1.UpdatePhase{}, []string{"cp", "md1"}, nil, updatev1.StatusAborted, 0, ""},
		{"a failed pool fails the plan", PlanInput{Name: "p", Phase: U, Pools: []PoolState{{Name: "cp", Sequence: 1, Exists: true, Plan: "p", Phase: U, UpdateStatus: updatev1.StatusFailed, Observed: true, Message: "node n1: updater files failed: DiskFull"}, pool("md1", 2, "p", "", "")}},
			nil, map[string]updatev1.UpdatePhase{}, []string{"cp", "md1"}, nil, updatev1.StatusFailed, 1, ""},
		{"a missing pool fails the plan", PlanInput{Name: "p", Phase: U, Pools: []PoolState{{Name: "gone", Sequence: 1}}},
			nil, map[string]updatev1.UpdatePhase{}, nil, nil, updatev1.StatusFailed, 1, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := StepPlan(tt.in)
			if !reflect.DeepEqual(d.Label, tt.wantLabel) || !reflect.DeepEqual(d.SetPhase, tt.wantPhase) || !reflect.DeepEqual(d.Release, tt.wantRelease) ||
				!reflect.DeepEqual(d.AbortPlans, tt.wantAbort) || d.Status != tt.wantStatus || d.Current != tt.wantCurrent || d.Waiting != tt.wantWaiting {
				t.Errorf("StepPlan() = label %v phase %v release %v abort %v status %q current %d waiting %q failure %q,\nwant %v %v %v %v %q %d %q",
					d.Label, d.SetPhase, d.Release, d.AbortPlans, d.Status, d.Current, d.Waiting, d.Failure,
					tt.wantLabel, tt.wantPhase, tt.wantRelease, tt.wantAbort, tt.wantStatus, tt.wantCurrent, tt.wantWaiting)
			}
		})
	}
}

func TestStepPlanFailureNamesNodeUpdaterAndReason(t *testing.T) {
	d := StepPlan(PlanInput{Name: "p", Phase: updatev1.PhaseUpdating, Pools: []PoolState{{Name: "cp", Sequence: 1, Exists: true, Plan: "p", Phase: updatev1.PhaseUpdating, UpdateStatus: updatev1.StatusFailed, Observed: true, Message: "node n1: updater files failed: DiskFull"}}})
	if want := "pool cp: node n1: updater files failed: DiskFull"; d.Failure != want {
		t.Errorf("Failure = %q, want %q", d.Failure, want)
	}
}
