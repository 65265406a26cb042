package fleetnodectl

import (
	"maps"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
)

var now = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

func online(hub string) *fleetv1.FleetNode {
	return &fleetv1.FleetNode{
		ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Spec:       fleetv1.FleetNodeSpec{Approved: true},
		Status: fleetv1.FleetNodeStatus{Phase: fleetv1.FleetNodeOnline, Hub: hub, Conditions: []metav1.Condition{
			{Type: fleetv1.ApprovedCondition, Status: metav1.ConditionTrue, Reason: fleetv1.ReasonApproved},
			{Type: fleetv1.ReadyCondition, Status: metav1.ConditionTrue, Reason: fleetv1.ReasonConnected},
			{Type: fleetv1.LabelsApprovedCondition, Status: metav1.ConditionTrue, Reason: fleetv1.ReasonAsApproved},
			{Type: fleetv1.CapacityApprovedCondition, Status: metav1.ConditionTrue, Reason: fleetv1.ReasonAsApproved}}},
	}
}

// reporting is an Online node whose agent reports pool=gpu and 4 gpus,
// approved with neither.
func reporting() *fleetv1.FleetNode {
	n := online("hub-a")
	n.Spec.ApprovedLabels = map[string]string{"site": "berlin"}
	n.Spec.ApprovedCapacity = corev1.ResourceList{"cpu": resource.MustParse("2")}
	n.Status.ReportedLabels = map[string]string{"site": "berlin", "pool": "gpu"}
	n.Status.ReportedCapacity = corev1.ResourceList{"cpu": resource.MustParse("2"), "gpu": resource.MustParse("4")}
	return n
}

// registered is a node a hub just created with a token; autoApprove says
// whether the token approved it.
func registered(autoApprove bool) *fleetv1.FleetNode {
	n := &fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{fleetv1.AnnotationBootstrapToken: "abcdef"}}}
	if autoApprove {
		n.Spec.Approved = true
		n.Annotations[fleetv1.AnnotationAutoApprovedBy] = "abcdef"
	}
	return n
}

func TestDecide(t *testing.T) {
	tests := []struct {
		name         string
		node         *fleetv1.FleetNode
		wantPhase    fleetv1.FleetNodePhase
		wantApproved string // reason of the Approved condition
		wantEvents   []string
		wantChanged  bool
	}{
		{"a node a token auto-approved is Pending and AutoApproved, unannounced", registered(true), fleetv1.FleetNodePending, fleetv1.ReasonAutoApproved, nil, true},
		{"a node waiting for an operator is Pending and AwaitingApproval", registered(false), fleetv1.FleetNodePending, fleetv1.ReasonAwaitingApproval, nil, true},
		{"an operator's approval is announced", func() *fleetv1.FleetNode { n := registered(false); Decide(n, now); n.Spec.Approved = true; return n }(),
			fleetv1.FleetNodePending, fleetv1.ReasonApproved, []string{fleetv1.ReasonApproved}, true},
		{"a node a hub already made Online keeps its phase", func() *fleetv1.FleetNode {
			n := registered(true)
			n.Status.Phase, n.Status.Hub = fleetv1.FleetNodeOnline, "hub-a"
			return n
		}(), fleetv1.FleetNodeOnline, fleetv1.ReasonAutoApproved, nil, true},
		{"an Online approved node is left to its hub", online("hub-a"), fleetv1.FleetNodeOnline, fleetv1.ReasonApproved, nil, false},
		{"a revoked node is Revoked, not approved, announced", func() *fleetv1.FleetNode { n := online("hub-a"); n.Spec.Revoked = true; return n }(),
			fleetv1.FleetNodeRevoked, fleetv1.ReasonRevoked, []string{fleetv1.ReasonRevoked}, true},
		{"a node no longer revoked is Offline and approved again", func() *fleetv1.FleetNode {
			n := online("hub-a")
			n.Spec.Revoked = true
			Decide(n, now)
			n.Spec.Revoked = false
			return n
		}(), fleetv1.FleetNodeOffline, fleetv1.ReasonApproved, []string{fleetv1.ReasonApproved}, true},
		{"labels and capacity beyond the approval are announced", reporting(), fleetv1.FleetNodeOnline, fleetv1.ReasonApproved,
			[]string{fleetv1.ReasonLabelChangePending, fleetv1.ReasonCapacityOverApproved}, true},
		{"a withdrawn approval awaits approval again", func() *fleetv1.FleetNode { n := online("hub-a"); n.Spec.Approved = false; return n }(),
			fleetv1.FleetNodeOnline, fleetv1.ReasonAwaitingApproval, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ready := meta.FindStatusCondition(tt.node.Status.Conditions, fleetv1.ReadyCondition).DeepCopy()
			d := Decide(tt.node, now)
			if tt.node.Status.Phase != tt.wantPhase {
				t.Errorf("Decide() phase = %s, want %s", tt.node.Status.Phase, tt.wantPhase)
			}
			if c := meta.FindStatusCondition(tt.node.Status.Conditions, fleetv1.ApprovedCondition); c == nil || c.Reason != tt.wantApproved {
				t.Errorf("Decide() Approved = %+v, want reason %s", c, tt.wantApproved)
			}
			var events []string
			for _, e := range d.Events {
				events = append(events, e.Reason)
			}
			if !slices.Equal(events, tt.wantEvents) {
				t.Errorf("Decide() events = %q, want %q", events, tt.wantEvents)
			}
			if d.Changed != tt.wantChanged {
				t.Errorf("Decide() changed = %v, want %v", d.Changed, tt.wantChanged)
			}
			// Ready is the hubs': the manager never writes it.
			if got := meta.FindStatusCondition(tt.node.Status.Conditions, fleetv1.ReadyCondition); (got == nil) != (ready == nil) || (got != nil && *got != *ready) {
				t.Errorf("Decide() changed Ready from %+v to %+v", ready, got)
			}
		})
	}
}

// TestDecideNode: the node carries the approved labels, never the reported
// ones, and the capacity the scheduler reads is capped at the approval.
func TestDecideNode(t *testing.T) {
	n := reporting()
	n.Labels = map[string]string{"team": "ops"}
	if !DecideNode(n) {
		t.Fatal("DecideNode() = false, want the approved labels written")
	}
	if want := map[string]string{"team": "ops", "site": "berlin"}; !maps.Equal(n.Labels, want) {
		t.Errorf("labels %v, want %v", n.Labels, want)
	}
	Decide(n, now)
	if _, ok := n.Status.Capacity["gpu"]; ok || n.Status.Capacity.Cpu().String() != "2" {
		t.Errorf("capacity %v, want cpu 2 and no gpu", n.Status.Capacity)
	}
	if DecideNode(n) {
		t.Error("DecideNode() a second time = true, want no change")
	}
	// Approved by hand (kubectl patch spec.approved): the reports as they are.
	n = registered(false)
	n.Status.ReportedLabels = map[string]string{"site": "berlin"}
	n.Spec.Approved = true
	if !DecideNode(n) || n.Labels["site"] != "berlin" || n.Spec.ApprovedLabels["site"] != "berlin" {
		t.Errorf("a node approved by hand: labels %v, approved %v; want site=berlin", n.Labels, n.Spec.ApprovedLabels)
	}
}
