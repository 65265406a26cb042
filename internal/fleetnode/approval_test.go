package fleetnode

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
)

func TestManagerSetters(t *testing.T) {
	awaiting := approvedC(isFalse, fleetv1.ReasonAwaitingApproval, "waiting for `drover approve n1`")
	byOperator := approvedC(isTrue, fleetv1.ReasonApproved, "approved by an operator")
	revokedC := approvedC(isFalse, fleetv1.ReasonRevoked, "the node's identity was revoked; hubs refuse it")
	runSetterTests(t, []setterTest{
		{name: "a just registered node is Pending",
			node: node("", ""), set: func(n *fleetv1.FleetNode) Change { return SetPending(n) }, wantPhase: pending},
		{name: "a node a hub saw connect first stays Online",
			node: connectedAt("hub-a"), set: func(n *fleetv1.FleetNode) Change { return SetPending(n) },
			wantPhase: online, wantHub: "hub-a", wantConds: []metav1.Condition{readyC(isTrue, fleetv1.ReasonConnected, "connected to hub hub-a")}, wantUnchanged: true},

		{name: "an unapproved node awaits approval, unannounced",
			node: node(pending, ""), set: func(n *fleetv1.FleetNode) Change { return SetAwaitingApproval(n, now) },
			wantPhase: pending, wantConds: []metav1.Condition{awaiting}},
		{name: "awaiting approval twice is no change",
			node: node(pending, "", awaiting), set: func(n *fleetv1.FleetNode) Change { return SetAwaitingApproval(n, now) },
			wantPhase: pending, wantConds: []metav1.Condition{awaiting}, wantUnchanged: true},
		{name: "a withdrawn approval awaits approval again",
			node: node(online, "hub-a", byOperator), set: func(n *fleetv1.FleetNode) Change { return SetAwaitingApproval(n, now) },
			wantPhase: online, wantHub: "hub-a", wantConds: []metav1.Condition{awaiting}},

		{name: "an operator's approval is announced",
			node: node(pending, "", awaiting), set: func(n *fleetv1.FleetNode) Change { return SetApproved(n, "", now) },
			wantPhase: pending, wantConds: []metav1.Condition{byOperator}, wantEvent: fleetv1.ReasonApproved, wantType: normalT},
		{name: "a token's approval is AutoApproved and not announced",
			node: node(pending, ""), set: func(n *fleetv1.FleetNode) Change { return SetApproved(n, "abcdef", now) },
			wantPhase: pending, wantConds: []metav1.Condition{approvedC(isTrue, fleetv1.ReasonAutoApproved, "approved by bootstrap token abcdef")}},
		{name: "an approved node is not approved again",
			node: node(online, "hub-a", approvedC(isTrue, fleetv1.ReasonAutoApproved, "x")), set: func(n *fleetv1.FleetNode) Change { return SetApproved(n, "", now) },
			wantPhase: online, wantHub: "hub-a", wantConds: []metav1.Condition{approvedC(isTrue, fleetv1.ReasonAutoApproved, "x")}, wantUnchanged: true},

		{name: "a revoked node is Revoked and no longer approved, announced",
			node: revoked(node(online, "hub-a", byOperator)), set: func(n *fleetv1.FleetNode) Change { return SetRevoked(n, now) },
			wantPhase: fleetv1.FleetNodeRevoked, wantHub: "hub-a", wantConds: []metav1.Condition{revokedC}, wantEvent: fleetv1.ReasonRevoked, wantType: warnT},
		{name: "a Revoked node is not announced again",
			node: revoked(node(fleetv1.FleetNodeRevoked, "hub-a", revokedC)), set: func(n *fleetv1.FleetNode) Change { return SetRevoked(n, now) },
			wantPhase: fleetv1.FleetNodeRevoked, wantHub: "hub-a", wantConds: []metav1.Condition{revokedC}, wantUnchanged: true},
		{name: "a node no longer revoked is Offline until it connects",
			node: node(fleetv1.FleetNodeRevoked, "hub-a", revokedC), set: func(n *fleetv1.FleetNode) Change { return SetUnrevoked(n) },
			wantPhase: offline, wantHub: "hub-a", wantConds: []metav1.Condition{revokedC}},
		{name: "a node still revoked stays Revoked",
			node: revoked(node(fleetv1.FleetNodeRevoked, "hub-a", revokedC)), set: func(n *fleetv1.FleetNode) Change { return SetUnrevoked(n) },
			wantPhase: fleetv1.FleetNodeRevoked, wantHub: "hub-a", wantConds: []metav1.Condition{revokedC}, wantUnchanged: true},
	})
}

func TestApprovedBy(t *testing.T) {
	auto := func(conds ...metav1.Condition) *fleetv1.FleetNode {
		n := node(pending, "", conds...)
		n.Annotations = map[string]string{fleetv1.AnnotationAutoApprovedBy: "abcdef", fleetv1.AnnotationBootstrapToken: "abcdef"}
		return n
	}
	manual := node(pending, "")
	manual.Annotations = map[string]string{fleetv1.AnnotationBootstrapToken: "abcdef"}
	for _, tt := range []struct {
		name string
		node *fleetv1.FleetNode
		want string
	}{
		{"a node a token auto-approved is credited to the token", auto(), "abcdef"},
		{"a node registered with a token that does not approve is not", manual, ""},
		{"a later approval (after a withdrawal or a revocation) is an operator's", auto(approvedC(isFalse, fleetv1.ReasonAwaitingApproval, "x")), ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := ApprovedBy(tt.node); got != tt.want {
				t.Errorf("ApprovedBy() = %q, want %q", got, tt.want)
			}
		})
	}
}
