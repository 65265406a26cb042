package fleetnodectl

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
)

var now = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

func lease(renewedAgo time.Duration) *coordinationv1.Lease {
	t := metav1.NewMicroTime(now.Add(-renewedAgo))
	return &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{RenewTime: &t, LeaseDurationSeconds: ptr.To(int32(40))}}
}

func online(hub string) *fleetv1.FleetNode {
	return &fleetv1.FleetNode{
		Spec:   fleetv1.FleetNodeSpec{Approved: true},
		Status: fleetv1.FleetNodeStatus{Phase: fleetv1.FleetNodeOnline, Hub: hub, Conditions: []metav1.Condition{{Type: fleetv1.ApprovedCondition, Status: metav1.ConditionTrue, Reason: "x"}}},
	}
}

func TestDecide(t *testing.T) {
	const timeout = 5 * time.Minute
	tests := []struct {
		name      string
		node      *fleetv1.FleetNode
		lease     *coordinationv1.Lease
		wantPhase fleetv1.FleetNodePhase
		wantEvent string
		wantCheck bool
	}{
		{"an online node whose hub renews its lease stays online", online("hub-a"), lease(10 * time.Second), fleetv1.FleetNodeOnline, "", true},
		{"a lost hub's node stays online while its agents may still move", online("hub-a"), lease(40*time.Second + 4*time.Minute), fleetv1.FleetNodeOnline, "", true},
		{"a lost hub's node goes offline after lease expiry plus the timeout", online("hub-a"), lease(40*time.Second + 5*time.Minute + time.Second), fleetv1.FleetNodeOffline, fleetv1.ReasonHubLost, false},
		{"a revoked node is Revoked whatever its hub", func() *fleetv1.FleetNode { n := online("hub-a"); n.Spec.Revoked = true; return n }(), lease(0), fleetv1.FleetNodeRevoked, fleetv1.ReasonRevoked, false},
		{"approving a pending node records the Approved condition", &fleetv1.FleetNode{Spec: fleetv1.FleetNodeSpec{Approved: true}, Status: fleetv1.FleetNodeStatus{Phase: fleetv1.FleetNodePending}}, nil, fleetv1.FleetNodePending, fleetv1.ReasonApproved, false},
		{"a node just registered with an approving token waits for its hub's first status (AutoApproved), not an operator's approval",
			&fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(now.Add(-time.Second)), Annotations: map[string]string{fleetv1.AnnotationBootstrapToken: "abcdef"}},
				Spec: fleetv1.FleetNodeSpec{Approved: true}}, nil, "", "", true},
		{"one whose hub never wrote its first status is decided after the grace",
			&fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(now.Add(-time.Minute)), Annotations: map[string]string{fleetv1.AnnotationBootstrapToken: "abcdef"}},
				Spec: fleetv1.FleetNodeSpec{Approved: true}}, nil, fleetv1.FleetNodePending, fleetv1.ReasonApproved, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Decide(tt.node, tt.lease, now, timeout)
			if tt.node.Status.Phase != tt.wantPhase {
				t.Errorf("Decide() phase = %s, want %s", tt.node.Status.Phase, tt.wantPhase)
			}
			if d.Event != tt.wantEvent {
				t.Errorf("Decide() event = %q, want %q", d.Event, tt.wantEvent)
			}
			if (d.RecheckAfter > 0) != tt.wantCheck {
				t.Errorf("Decide() recheckAfter = %v, want recheck %v", d.RecheckAfter, tt.wantCheck)
			}
			if tt.wantEvent == fleetv1.ReasonApproved && !meta.IsStatusConditionTrue(tt.node.Status.Conditions, fleetv1.ApprovedCondition) {
				t.Error("Decide() did not set Approved=True")
			}
		})
	}
}
