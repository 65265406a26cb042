package fleetnodectl

import (
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
)

// Decision is what one reconcile concluded, for the caller to write and announce.
type Decision struct {
	// Changed is true when status must be written.
	Changed bool
	// Event is a reason for an Event to record, or "".
	Event, EventNote string
	// RecheckAfter is when the node must be looked at again (0 = on change only).
	RecheckAfter time.Duration
}

// firstStatusGrace is how long a just-registered node is left to its hub's
// first status write.
const firstStatusGrace = 30 * time.Second

// Decide updates n's status in place from its spec, its hub's Lease (nil when
// absent) and the time. It is pure, so it is table-tested without an API.
func Decide(n *fleetv1.FleetNode, lease *coordinationv1.Lease, now time.Time, offlineTimeout time.Duration) Decision {
	var d Decision
	if n.Spec.Revoked {
		if n.Status.Phase != fleetv1.FleetNodeRevoked {
			n.Status.Phase = fleetv1.FleetNodeRevoked
			meta.SetStatusCondition(&n.Status.Conditions, metav1.Condition{
				Type: fleetv1.ReadyCondition, Status: metav1.ConditionFalse, Reason: fleetv1.ReasonRevoked,
				Message: "the node's identity was revoked; hubs refuse it", ObservedGeneration: n.Generation, LastTransitionTime: metav1.NewTime(now),
			})
			d.Changed, d.Event, d.EventNote = true, fleetv1.ReasonRevoked, "node revoked; hubs will refuse its connections"
		}
		return d
	}
	if wait := n.CreationTimestamp.Add(firstStatusGrace).Sub(now); n.Status.Phase == "" && n.Annotations[fleetv1.AnnotationBootstrapToken] != "" && wait > 0 {
		// Registered a moment ago: the hub's first status write (Approved,
		// AutoApproved when the token approves) is on its way; deciding
		// now would race it and call an auto-approval an operator's. If it
		// never comes (the hub died), the manager decides after the grace.
		d.RecheckAfter = wait
		return d
	}
	if n.Spec.Approved {
		c := meta.FindStatusCondition(n.Status.Conditions, fleetv1.ApprovedCondition)
		if c == nil || c.Status != metav1.ConditionTrue {
			meta.SetStatusCondition(&n.Status.Conditions, metav1.Condition{
				Type: fleetv1.ApprovedCondition, Status: metav1.ConditionTrue, Reason: fleetv1.ReasonApproved,
				Message: "approved by an operator", ObservedGeneration: n.Generation, LastTransitionTime: metav1.NewTime(now),
			})
			d.Changed, d.Event, d.EventNote = true, fleetv1.ReasonApproved, "node approved; it may now obtain a certificate"
		}
	}
	if n.Status.Phase == "" {
		n.Status.Phase = fleetv1.FleetNodePending
		d.Changed = true
	}
	if n.Status.Phase == fleetv1.FleetNodeRevoked {
		// Un-revoked: it must connect again to be Online.
		n.Status.Phase = fleetv1.FleetNodeOffline
		d.Changed = true
	}
	if n.Status.Phase != fleetv1.FleetNodeOnline || n.Status.Hub == "" {
		return d
	}
	// The hub's liveness decides for live hubs. For a lost hub, the node is
	// Offline once the Lease has been expired for the offline timeout: time
	// enough for its agents to reach another hub, which then claims them.
	deadline := leaseExpiry(lease, n).Add(offlineTimeout)
	if now.Before(deadline) {
		d.RecheckAfter = deadline.Sub(now) + time.Second
		return d
	}
	n.Status.Phase = fleetv1.FleetNodeOffline
	meta.SetStatusCondition(&n.Status.Conditions, metav1.Condition{
		Type: fleetv1.ReadyCondition, Status: metav1.ConditionFalse, Reason: fleetv1.ReasonHubLost,
		Message:            "hub " + n.Status.Hub + " stopped renewing its Lease and no other hub took the node over",
		ObservedGeneration: n.Generation, LastTransitionTime: metav1.NewTime(now),
	})
	d.Changed, d.Event, d.EventNote = true, fleetv1.ReasonHubLost, "node offline: hub "+n.Status.Hub+" is gone"
	return d
}

// leaseExpiry is when the hub's Lease lapses; with no Lease, the node's own
// last sign of life stands in.
func leaseExpiry(l *coordinationv1.Lease, n *fleetv1.FleetNode) time.Time {
	if l != nil && l.Spec.RenewTime != nil {
		dur := time.Duration(0)
		if l.Spec.LeaseDurationSeconds != nil {
			dur = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
		}
		return l.Spec.RenewTime.Add(dur)
	}
	if n.Status.LastHeartbeatTime != nil {
		return n.Status.LastHeartbeatTime.Time
	}
	return n.CreationTimestamp.Time
}
