package fleetnode

import (
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
)

// The setters in this file belong to the manager: the Approved condition
// and the Pending and Revoked phases, which follow the node's spec.

// SetPending gives a node that has no phase yet (it was just registered)
// the phase Pending. A hub that saw the agent connect first made it Online,
// and that stays.
func SetPending(n *fleetv1.FleetNode) Change {
	if n.Status.Phase != "" {
		return Change{}
	}
	n.Status.Phase = fleetv1.FleetNodePending
	return changed
}

// SetApproved sets Approved True. byToken names the bootstrap token whose
// auto-approve policy approved the node (reason AutoApproved, not
// announced: it is part of registering); "" means an operator did (reason
// ApprovedByOperator, announced).
func SetApproved(n *fleetv1.FleetNode, byToken string, now time.Time) Change {
	if meta.IsStatusConditionTrue(n.Status.Conditions, fleetv1.ApprovedCondition) {
		return Change{}
	}
	if byToken != "" {
		setCondition(n, fleetv1.ApprovedCondition, metav1.ConditionTrue, fleetv1.ReasonAutoApproved, "approved by bootstrap token "+byToken, now)
		return changed
	}
	setCondition(n, fleetv1.ApprovedCondition, metav1.ConditionTrue, fleetv1.ReasonApproved, "approved by an operator", now)
	return normal(fleetv1.ReasonApproved, "node approved; it may now obtain a certificate")
}

// SetAwaitingApproval sets Approved False, reason AwaitingApproval: the node
// is not approved (yet, or any more), and hubs refuse its streams.
func SetAwaitingApproval(n *fleetv1.FleetNode, now time.Time) Change {
	if c := meta.FindStatusCondition(n.Status.Conditions, fleetv1.ApprovedCondition); c != nil &&
		c.Status == metav1.ConditionFalse && c.Reason == fleetv1.ReasonAwaitingApproval {
		return Change{}
	}
	setCondition(n, fleetv1.ApprovedCondition, metav1.ConditionFalse, fleetv1.ReasonAwaitingApproval, "waiting for `drover approve "+n.Name+"`", now)
	return changed
}

// SetRevoked makes a node whose spec says revoked Revoked, with Approved
// False, reason Revoked. Hubs refuse it and close its streams; they never
// change the phase of a revoked node. Announced once, when the phase
// changes.
func SetRevoked(n *fleetv1.FleetNode, now time.Time) Change {
	var c Change
	if c0 := meta.FindStatusCondition(n.Status.Conditions, fleetv1.ApprovedCondition); c0 == nil ||
		c0.Status != metav1.ConditionFalse || c0.Reason != fleetv1.ReasonRevoked {
		setCondition(n, fleetv1.ApprovedCondition, metav1.ConditionFalse, fleetv1.ReasonRevoked, "the node's identity was revoked; hubs refuse it", now)
		c = changed
	}
	if n.Status.Phase != fleetv1.FleetNodeRevoked {
		n.Status.Phase = fleetv1.FleetNodeRevoked
		c = warning(fleetv1.ReasonRevoked, "node revoked; hubs will refuse its connections")
	}
	return c
}

// SetUnrevoked makes a Revoked node whose spec no longer says revoked
// Offline: it must connect again to be Online. (Its Approved condition
// follows spec.approved: SetApproved or SetAwaitingApproval.)
func SetUnrevoked(n *fleetv1.FleetNode) Change {
	if n.Spec.Revoked || n.Status.Phase != fleetv1.FleetNodeRevoked {
		return Change{}
	}
	n.Status.Phase = fleetv1.FleetNodeOffline
	return changed
}

// ApprovedBy is the bootstrap token to credit with n's approval (the
// byToken of SetApproved): the token named by the annotation the hub set
// when the token's auto-approve policy approved the node, as long as the
// Approved condition was never recorded. Any later approval (after an
// operator withdrew it, or revoked the node) is an operator's.
func ApprovedBy(n *fleetv1.FleetNode) string {
	if meta.FindStatusCondition(n.Status.Conditions, fleetv1.ApprovedCondition) != nil {
		return ""
	}
	return n.Annotations[fleetv1.AnnotationAutoApprovedBy]
}
