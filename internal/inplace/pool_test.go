package inplace

import (
	"reflect"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"

	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
)

func ready(names ...string) []NodeView {
	var out []NodeView
	for _, n := range names {
		out = append(out, NodeView{Name: n, Ready: true})
	}
	return out
}

func TestStepPool(t *testing.T) {
	pct := intstr.FromString("50%")
	two := intstr.FromInt32(2)
	maxU := func(v *intstr.IntOrString) updatev1.UpdateStrategy {
		return updatev1.UpdateStrategy{Type: updatev1.StrategyMaxUnavailable, MaxUnavailable: v}
	}
	updating := func(n NodeView) NodeView {
		n.Plan, n.UpdatePhase, n.UpdateStatus = "p", updatev1.PhaseUpdating, updatev1.StatusUpdating
		return n
	}
	done := func(n NodeView) NodeView {
		n.Plan, n.UpdatePhase, n.UpdateStatus, n.AtRevision = "p", updatev1.PhaseUpdating, updatev1.StatusUpdated, true
		return n
	}
	tests := []struct {
		name        string
		in          PoolInput
		wantStart   []string
		wantAbort   []string
		wantStatus  updatev1.UpdateStatus
		wantBlocked string
	}{
		{"one at a time picks the first node", PoolInput{Plan: "p", Phase: updatev1.PhaseUpdating, Nodes: ready("b", "a"), Budget: -1},
			[]string{"a"}, nil, updatev1.StatusUpdating, ""},
		{"one at a time waits while a node updates", PoolInput{Plan: "p", Phase: updatev1.PhaseUpdating, Nodes: []NodeView{updating(NodeView{Name: "a"}), {Name: "b", Ready: true}}, Budget: -1},
			nil, nil, updatev1.StatusUpdating, ""},
		{"preflight: a node not Ready blocks picks", PoolInput{Plan: "p", Phase: updatev1.PhaseUpdating, Nodes: []NodeView{{Name: "a", Ready: true}, {Name: "b"}}, Budget: -1},
			nil, nil, updatev1.StatusUpdating, updatev1.ReasonNodeNotReady},
		{"preflight: a failing health check blocks picks", PoolInput{Plan: "p", Phase: updatev1.PhaseUpdating, Nodes: []NodeView{{Name: "a", Ready: true}, {Name: "b", Ready: true, Unhealthy: true}}, Budget: -1},
			nil, nil, updatev1.StatusUpdating, updatev1.ReasonNodeUnhealthy},
		{"preflight: another plan's update blocks picks", PoolInput{Plan: "p", Phase: updatev1.PhaseUpdating, Nodes: []NodeView{{Name: "a", Ready: true}, {Name: "b", Ready: true, Plan: "q", UpdatePhase: updatev1.PhaseUpdating, UpdateStatus: updatev1.StatusUpdating}}, Budget: -1},
			nil, nil, updatev1.StatusUpdating, updatev1.ReasonOtherUpdate},
		{"maxUnavailable 50% of 5 rounds down to 2", PoolInput{Plan: "p", Phase: updatev1.PhaseUpdating, Strategy: maxU(&pct), Nodes: ready("a", "b", "c", "d", "e"), Budget: -1},
			[]string{"a", "b"}, nil, updatev1.StatusUpdating, ""},
		{"maxUnavailable 2 with one updating picks one more", PoolInput{Plan: "p", Phase: updatev1.PhaseUpdating, Strategy: maxU(&two), Nodes: append([]NodeView{updating(NodeView{Name: "a", Ready: true})}, ready("b", "c")...), Budget: -1},
			[]string{"b"}, nil, updatev1.StatusUpdating, ""},
		{"the plan's maxInFlight budget caps picks", PoolInput{Plan: "p", Phase: updatev1.PhaseUpdating, Strategy: maxU(&two), Nodes: ready("a", "b", "c"), Budget: 1},
			[]string{"a"}, nil, updatev1.StatusUpdating, ""},
		{"all nodes at the revision: updated at once", PoolInput{Plan: "p", Phase: updatev1.PhaseUpdating, Nodes: []NodeView{{Name: "a", Ready: true, AtRevision: true}, done(NodeView{Name: "b"})}, Budget: -1},
			nil, nil, updatev1.StatusUpdated, ""},
		{"some updated, some not: only the rest are picked", PoolInput{Plan: "p", Phase: updatev1.PhaseUpdating, Nodes: []NodeView{{Name: "a", Ready: true, AtRevision: true}, {Name: "b", Ready: true}}, Budget: -1},
			[]string{"b"}, nil, updatev1.StatusUpdating, ""},
		{"a terminal failure stops new picks", PoolInput{Plan: "p", Phase: updatev1.PhaseUpdating, Nodes: []NodeView{{Name: "a", Ready: true, Plan: "p", UpdatePhase: updatev1.PhaseUpdating, UpdateStatus: updatev1.StatusFailed, FailedUpdater: "files", FailedReason: "DiskFull"}, {Name: "b", Ready: true}}, Budget: -1},
			nil, nil, updatev1.StatusFailed, ""},
		{"re-run after remediation: the remediated node is picked again", PoolInput{Plan: "p", Phase: updatev1.PhaseUpdating, Nodes: []NodeView{{Name: "a", Ready: true, Plan: "p", UpdatePhase: updatev1.PhaseUpdating, UpdateStatus: updatev1.StatusFailed, Remediated: true}}, Budget: -1},
			[]string{"a"}, nil, updatev1.StatusUpdating, ""},
		{"aborting propagates to updating nodes", PoolInput{Plan: "p", Phase: updatev1.PhaseAborting, Nodes: []NodeView{updating(NodeView{Name: "a"}), done(NodeView{Name: "b"}), {Name: "c", Ready: true}}, Budget: -1},
			nil, []string{"a"}, updatev1.StatusAborting, ""},
		{"aborted once no node is in flight", PoolInput{Plan: "p", Phase: updatev1.PhaseAborting, Nodes: []NodeView{{Name: "a", Plan: "p", UpdatePhase: updatev1.PhaseAborting, UpdateStatus: updatev1.StatusAborted}, done(NodeView{Name: "b"})}, Budget: -1},
			nil, nil, updatev1.StatusAborted, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := StepPool(tt.in)
			if !reflect.DeepEqual(d.Start, tt.wantStart) || !reflect.DeepEqual(d.Abort, tt.wantAbort) || d.Status != tt.wantStatus || d.Blocked != tt.wantBlocked {
				t.Errorf("StepPool() = start %v abort %v status %q blocked %q (%s), want %v %v %q %q",
					d.Start, d.Abort, d.Status, d.Blocked, d.Message, tt.wantStart, tt.wantAbort, tt.wantStatus, tt.wantBlocked)
			}
			if tt.wantBlocked != "" && d.RequeueAfter != PreflightRequeue {
				t.Errorf("blocked preflight requeues after %v, want %v", d.RequeueAfter, PreflightRequeue)
			}
		})
	}
}

func TestStepPoolWithoutPlanReleasesEndedNodes(t *testing.T) {
	d := StepPool(PoolInput{Nodes: []NodeView{
		{Name: "a", Plan: "p", UpdatePhase: updatev1.PhaseUpdating, UpdateStatus: updatev1.StatusUpdated},
		{Name: "b"},
	}})
	if !reflect.DeepEqual(d.Release, []string{"a"}) || d.Status != "" {
		t.Errorf("StepPool() = release %v status %q, want [a] and the status kept", d.Release, d.Status)
	}
}

func TestStepPoolUncordonsOnlyWhatItCordoned(t *testing.T) {
	nodes := []NodeView{
		{Name: "updated", Plan: "p", UpdatePhase: updatev1.PhaseUpdating, UpdateStatus: updatev1.StatusUpdated, AtRevision: true, CordonedByUpdate: true},
		{Name: "aborted", Plan: "p", UpdatePhase: updatev1.PhaseAborting, UpdateStatus: updatev1.StatusAborted, CordonedByUpdate: true},
		{Name: "failed", Plan: "p", UpdatePhase: updatev1.PhaseUpdating, UpdateStatus: updatev1.StatusFailed, CordonedByUpdate: true},
		{Name: "running", Plan: "p", UpdatePhase: updatev1.PhaseUpdating, UpdateStatus: updatev1.StatusUpdating, CordonedByUpdate: true},
		{Name: "operator", Plan: "p", UpdatePhase: updatev1.PhaseUpdating, UpdateStatus: updatev1.StatusUpdated, AtRevision: true},
	}
	tests := []struct {
		name  string
		phase updatev1.UpdatePhase
		want  []string
	}{
		{"while the plan runs: updated and aborted nodes; a failed one stays cordoned", updatev1.PhaseUpdating, []string{"aborted", "updated"}},
		{"released: every ended node it cordoned", "", []string{"aborted", "failed", "updated"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := StepPool(PoolInput{Plan: "p", Phase: tt.phase, Nodes: nodes, Budget: -1})
			if !reflect.DeepEqual(d.Uncordon, tt.want) {
				t.Errorf("StepPool().Uncordon = %v, want %v", d.Uncordon, tt.want)
			}
		})
	}
}

func TestStepPoolWindowsAndRollout(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	closed := &WindowState{Next: now.Add(14 * time.Hour)}
	open := &WindowState{Open: true, Until: now.Add(time.Hour)}
	started := func(n NodeView, ago time.Duration, st updatev1.UpdateStatus) NodeView {
		n.Plan, n.UpdatePhase, n.UpdateStatus, n.Started = "p", updatev1.PhaseUpdating, st, now.Add(-ago)
		n.AtRevision = st == updatev1.StatusUpdated
		return n
	}
	failedNode := func(name string) NodeView {
		n := started(NodeView{Name: name, Ready: true}, time.Hour, updatev1.StatusFailed)
		n.FailedUpdater, n.FailedReason = "agent", "boom"
		return n
	}
	hundred := intstr.FromString("100%")
	all := updatev1.UpdateStrategy{Type: updatev1.StrategyMaxUnavailable, MaxUnavailable: &hundred}
	rate2 := &updatev1.Rollout{BaseRatePerMinute: 2, SucceededPerIncrease: 2}
	tolerant := &updatev1.Rollout{BaseRatePerMinute: 100, AbortThresholdPercent: 50, MinEndedForAbort: 2}
	tests := []struct {
		name        string
		in          PoolInput
		wantStart   []string
		wantStatus  updatev1.UpdateStatus
		wantReason  string
		wantBlocked string
		wantAfter   time.Duration
	}{
		{"outside every window: nothing starts until the next opens",
			PoolInput{Window: closed, Nodes: ready("a", "b")},
			nil, updatev1.StatusUpdating, updatev1.ReasonUpdating, updatev1.ReasonOutsideWindow, 14 * time.Hour},
		{"inside a window: starts",
			PoolInput{Window: open, Nodes: ready("a", "b")},
			[]string{"a"}, updatev1.StatusUpdating, updatev1.ReasonUpdating, "", 0},
		{"a window closing does not stop a running node, and the pool still ends",
			PoolInput{Window: closed, Nodes: []NodeView{started(NodeView{Name: "a", Ready: true}, time.Hour, updatev1.StatusUpdated)}},
			nil, updatev1.StatusUpdated, updatev1.ReasonUpdated, "", 0},
		{"rollout: base rate 2 caps a 100% strategy",
			PoolInput{Strategy: all, Rollout: rate2, Nodes: ready("a", "b", "c", "d", "e")},
			[]string{"a", "b"}, updatev1.StatusUpdating, updatev1.ReasonUpdating, "", 0},
		{"rollout: the rate is used up this minute",
			PoolInput{Strategy: all, Rollout: rate2, Nodes: append([]NodeView{
				started(NodeView{Name: "a", Ready: true}, 20*time.Second, updatev1.StatusUpdating),
				started(NodeView{Name: "b", Ready: true}, 50*time.Second, updatev1.StatusUpdating)}, ready("c", "d")...)},
			nil, updatev1.StatusUpdating, updatev1.ReasonUpdating, updatev1.ReasonRolloutRate, 10 * time.Second},
		{"rollout: two successes double the rate",
			PoolInput{Strategy: all, Rollout: rate2, Nodes: append([]NodeView{
				started(NodeView{Name: "a", Ready: true}, 20*time.Second, updatev1.StatusUpdated),
				started(NodeView{Name: "b", Ready: true}, 50*time.Second, updatev1.StatusUpdated)}, ready("c", "d", "e", "f")...)},
			[]string{"c", "d"}, updatev1.StatusUpdating, updatev1.ReasonUpdating, "", 0},
		{"rollout: a failure under the threshold does not stop picks",
			PoolInput{Strategy: all, Rollout: tolerant, Nodes: append([]NodeView{
				failedNode("a"), started(NodeView{Name: "b", Ready: true}, time.Hour, updatev1.StatusUpdated),
				started(NodeView{Name: "c", Ready: true}, time.Hour, updatev1.StatusUpdated)}, ready("d")...)},
			[]string{"d"}, updatev1.StatusUpdating, updatev1.ReasonUpdating, "", 0},
		{"rollout: at the threshold, picks stop",
			PoolInput{Strategy: all, Rollout: tolerant, Nodes: append([]NodeView{
				failedNode("a"), started(NodeView{Name: "b", Ready: true}, time.Hour, updatev1.StatusUpdated)}, ready("d")...)},
			nil, updatev1.StatusFailed, updatev1.ReasonAbortThreshold, "", 0},
		{"rollout: every node ended with failures under the threshold: updated",
			PoolInput{Strategy: all, Rollout: tolerant, Nodes: []NodeView{
				failedNode("a"), started(NodeView{Name: "b", Ready: true}, time.Hour, updatev1.StatusUpdated),
				started(NodeView{Name: "c", Ready: true}, time.Hour, updatev1.StatusUpdated)}},
			nil, updatev1.StatusUpdated, updatev1.ReasonUpdated, "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.in
			in.Plan, in.Phase, in.Budget, in.Now = "p", updatev1.PhaseUpdating, -1, now
			d := StepPool(in)
			if !reflect.DeepEqual(d.Start, tt.wantStart) || d.Status != tt.wantStatus || d.Reason != tt.wantReason || d.Blocked != tt.wantBlocked {
				t.Fatalf("StepPool() start %v status %s reason %s blocked %s (%s); want %v %s %s %s",
					d.Start, d.Status, d.Reason, d.Blocked, d.BlockedWhy, tt.wantStart, tt.wantStatus, tt.wantReason, tt.wantBlocked)
			}
			if tt.wantBlocked != "" && d.RequeueAfter != tt.wantAfter {
				t.Errorf("RequeueAfter = %s, want %s", d.RequeueAfter, tt.wantAfter)
			}
		})
	}
}
