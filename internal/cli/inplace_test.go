package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
	"github.com/drover-fleet/drover/internal/inplace/inplacectl"
	"github.com/drover-fleet/drover/internal/manager"
)

func TestGetInPlaceListsWithWhy(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	created := metav1.NewTime(now.Add(-time.Hour))
	pool := &updatev1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: "berlin", CreationTimestamp: created, Labels: map[string]string{updatev1.LabelUpdateTaskName: "p1"}},
		Spec: updatev1.NodePoolSpec{Strategy: updatev1.UpdateStrategy{Type: updatev1.StrategyOneAtATime}},
		Status: updatev1.NodePoolStatus{Nodes: 3, UpdatedNodes: 1, UpdateStatus: updatev1.StatusUpdating, Conditions: []metav1.Condition{
			{Type: updatev1.PreflightBlockedCondition, Status: "True", Reason: updatev1.ReasonNodeNotReady, Message: "not Ready: n3"}}}}
	plan := &updatev1.InPlaceUpdatePlan{ObjectMeta: metav1.ObjectMeta{Name: "p1", CreationTimestamp: created},
		Spec: updatev1.InPlaceUpdatePlanSpec{UpdatePhase: updatev1.PhaseUpdating},
		Status: updatev1.InPlaceUpdatePlanStatus{UpdateStatus: updatev1.StatusFailed, CurrentSequence: 1, Nodes: updatev1.NodeSummary{Total: 3, Updated: 1, Failed: 1},
			Conditions: []metav1.Condition{{Type: updatev1.FailedCondition, Status: "True", Reason: updatev1.ReasonUpdaterFailed, Message: "pool berlin: node n2: updater files failed: DiskFull"}}}}
	c := fake.NewClientBuilder().WithScheme(manager.Scheme()).WithObjects(pool, plan).Build()
	tests := []struct {
		kind  inplaceKind
		names []string
		want  []string
		err   string
	}{
		{kindPools, nil, []string{"NAME", "berlin", "OneAtATime", "p1", "PreflightBlocked: NodeNotReady", "60m"}, ""},
		{kindPlans, nil, []string{"p1", "failed", "node n2: updater files failed: DiskFull"}, ""},
		{kindNHC, nil, nil, ""},
		{kindPlans, []string{"p1", "nope"}, []string{"p1"}, `plan "nope" not found`},
	}
	for _, tt := range tests {
		var out, errw bytes.Buffer
		err := getInPlace(context.Background(), &out, &errw, c, tt.kind, tt.names, now)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("get %s %v: error %v, want %q", tt.kind, tt.names, err, tt.err)
			}
		} else if err != nil {
			t.Errorf("get %s: %v", tt.kind, err)
		}
		for _, w := range tt.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("get %s printed\n%s\nwant it to contain %q", tt.kind, out.String(), w)
			}
		}
		if tt.want == nil && !strings.Contains(errw.String(), "No nodehealthchecks found") {
			t.Errorf("get %s with none: stderr %q", tt.kind, errw.String())
		}
	}
}

func TestAbortPlanAndCordon(t *testing.T) {
	ctx := context.Background()
	running := &updatev1.InPlaceUpdatePlan{ObjectMeta: metav1.ObjectMeta{Name: "running"}, Spec: updatev1.InPlaceUpdatePlanSpec{UpdatePhase: updatev1.PhaseUpdating},
		Status: updatev1.InPlaceUpdatePlanStatus{UpdateStatus: updatev1.StatusUpdating}}
	ended := &updatev1.InPlaceUpdatePlan{ObjectMeta: metav1.ObjectMeta{Name: "ended"}, Status: updatev1.InPlaceUpdatePlanStatus{UpdateStatus: updatev1.StatusUpdated}}
	byUpdate := &fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{inplacectl.AnnotationCordonedBy: "running"}}, Spec: fleetv1.FleetNodeSpec{Unschedulable: true}}
	c := fake.NewClientBuilder().WithScheme(manager.Scheme()).WithObjects(running, ended, byUpdate, &fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: "n2"}}).Build()

	if err := abortPlan(ctx, c, "running"); err != nil {
		t.Fatalf("abortPlan(running) = %v", err)
	}
	var p updatev1.InPlaceUpdatePlan
	if err := c.Get(ctx, client.ObjectKey{Name: "running"}, &p); err != nil || p.Spec.UpdatePhase != updatev1.PhaseAborting {
		t.Errorf("after abort: phase %q (%v), want aborting", p.Spec.UpdatePhase, err)
	}
	if err := abortPlan(ctx, c, "ended"); err == nil || !strings.Contains(err.Error(), "already ended (updated)") {
		t.Errorf("abortPlan(ended) = %v, want it refused", err)
	}
	if !isPlanKind("plan") || !isPlanKind("iup") || isPlanKind("nodeupgradejob") {
		t.Error("isPlanKind")
	}

	var out bytes.Buffer
	if err := setCordon(ctx, &out, c, []string{"n2"}, true); err != nil {
		t.Fatal(err)
	}
	// The operator uncordons a node an update cordoned: the update's mark
	// goes too, so the update will not touch the node's cordon again.
	if err := setCordon(ctx, &out, c, []string{"n1"}, false); err != nil {
		t.Fatal(err)
	}
	var n1, n2 fleetv1.FleetNode
	_ = c.Get(ctx, client.ObjectKey{Name: "n1"}, &n1)
	_ = c.Get(ctx, client.ObjectKey{Name: "n2"}, &n2)
	if n1.Spec.Unschedulable || n1.Annotations[inplacectl.AnnotationCordonedBy] != "" || !n2.Spec.Unschedulable {
		t.Errorf("n1 unschedulable %v annotations %v, n2 unschedulable %v", n1.Spec.Unschedulable, n1.Annotations, n2.Spec.Unschedulable)
	}
	if got := out.String(); got != "node/n2 cordoned\nnode/n1 uncordoned\n" {
		t.Errorf("output %q", got)
	}
	if err := setCordon(ctx, &out, c, []string{"nope"}, true); err == nil || !strings.Contains(err.Error(), "get node nope") {
		t.Errorf("setCordon(nope) = %v", err)
	}
}
