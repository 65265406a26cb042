package fleetnode

import (
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
)

// The setters in this file belong to the hubs: the Ready condition, the
// Online and Offline phases and status.hub. hub is always the name of the
// hub that writes.

// setReady sets Ready True and the node Online, or Ready False and the node
// Offline.
func setReady(n *fleetv1.FleetNode, isReady bool, reason, msg string, now time.Time) {
	st := metav1.ConditionFalse
	n.Status.Phase = fleetv1.FleetNodeOffline
	if isReady {
		st = metav1.ConditionTrue
		n.Status.Phase = fleetv1.FleetNodeOnline
	}
	setCondition(n, fleetv1.ReadyCondition, st, reason, msg, now)
}

// setRevokedReady sets Ready False, reason Revoked, on a revoked node whose
// stream hub ended or never came back; the phase is the manager's. It is
// not announced: the manager announced the revocation.
func setRevokedReady(n *fleetv1.FleetNode, hub string, now time.Time) Change {
	if c := ready(n); c != nil && c.Status == metav1.ConditionFalse && c.Reason == fleetv1.ReasonRevoked {
		return Change{}
	}
	setCondition(n, fleetv1.ReadyCondition, metav1.ConditionFalse, fleetv1.ReasonRevoked,
		"the node's identity was revoked; hub "+hub+" closed its stream and hubs refuse it", now)
	return changed
}

// SetRegistered fills the status of a node the hub just created: Ready
// False (the agent has not connected yet) and what the agent reported.
// Pending is the manager's to set.
func SetRegistered(n *fleetv1.FleetNode, now time.Time, info *Info) Change {
	c := Change{Changed: SetReported(n, info)}
	if ready(n) == nil {
		setCondition(n, fleetv1.ReadyCondition, metav1.ConditionFalse, fleetv1.ReasonNotConnected, "the agent has not opened a stream yet", now)
		c.Changed = true
	}
	return c
}

// SetConnected claims n for hub, whose stream from the agent just opened:
// Ready True and Online. Moving from another hub while Online is a
// hand-over (MovedHub), not a flap. It is announced when the node was not
// Ready at hub: a first connect, a return, a move. A revoked node is
// refused before it gets here and is left alone.
func SetConnected(n *fleetv1.FleetNode, hub string, now time.Time, info *Info) Change {
	if n.Spec.Revoked {
		return Change{}
	}
	prev := ready(n)
	announce := n.Status.Hub != hub || prev == nil || prev.Status != metav1.ConditionTrue
	reason, msg := fleetv1.ReasonConnected, "connected to hub "+hub
	if from := n.Status.Hub; n.Status.Phase == fleetv1.FleetNodeOnline && from != "" && from != hub {
		reason, msg = fleetv1.ReasonMovedHub, fmt.Sprintf("moved from hub %s to hub %s", from, hub)
		if prev != nil && prev.Reason == fleetv1.ReasonHubLost {
			msg += fmt.Sprintf(" (hub %s had taken the node over from a lost hub)", from)
		}
	}
	setReady(n, true, reason, msg, now)
	n.Status.Hub = hub
	n.Status.ConnectedTime = stamp(now)
	n.Status.LastHeartbeatTime = stamp(now)
	n.Status.ObservedGeneration = n.Generation
	SetReported(n, info)
	if !announce {
		return changed
	}
	return normal(reason, msg)
}

// SetDisconnected says that the agent's stream to hub ended: Ready Unknown,
// reason Disconnected, the node still Online (hub's liveness makes it
// Offline after offlineTimeout unless it reconnects). Nothing changes once
// the node is at another hub, not Online, or already Ready Unknown. A
// revoked node's Ready goes False, reason Revoked.
func SetDisconnected(n *fleetv1.FleetNode, hub string, now time.Time, offlineTimeout time.Duration) Change {
	if n.Status.Hub != hub {
		return Change{}
	}
	if n.Spec.Revoked {
		return setRevokedReady(n, hub, now)
	}
	if n.Status.Phase != fleetv1.FleetNodeOnline || readyUnknown(n) {
		return Change{}
	}
	msg := fmt.Sprintf("the agent's stream to hub %s ended at %s; Offline after %s unless it reconnects", hub, rfc3339(now), offlineTimeout)
	setCondition(n, fleetv1.ReadyCondition, metav1.ConditionUnknown, fleetv1.ReasonDisconnected, msg, now)
	return normal(fleetv1.ReasonDisconnected, msg)
}

// SetUnconnected marks a node hub adopted when it restarted at since, and
// that has not connected since, Disconnected: the scheduler places nothing
// new on it while it may still come back. A node already Ready Unknown
// (Disconnected, HubLost) keeps its reason.
func SetUnconnected(n *fleetv1.FleetNode, hub string, since, now time.Time, offlineTimeout time.Duration) Change {
	if n.Status.Hub != hub {
		return Change{}
	}
	if n.Spec.Revoked {
		return setRevokedReady(n, hub, now)
	}
	if n.Status.Phase != fleetv1.FleetNodeOnline || readyUnknown(n) {
		return Change{}
	}
	msg := fmt.Sprintf("not connected since hub %s restarted at %s; Offline after %s unless it reconnects", hub, rfc3339(since), offlineTimeout)
	setCondition(n, fleetv1.ReadyCondition, metav1.ConditionUnknown, fleetv1.ReasonDisconnected, msg, now)
	return normal(fleetv1.ReasonDisconnected, msg)
}

// SetNotResponding marks a node connected to hub but silent since since
// Ready Unknown, reason NotResponding: no new work until it is heard from
// (SetResponding). Only a Ready node changes; the caller keeps its Ready
// condition from before to restore it.
func SetNotResponding(n *fleetv1.FleetNode, hub string, since, now time.Time, offlineTimeout time.Duration) Change {
	if n.Status.Hub != hub || n.Spec.Revoked || n.Status.Phase != fleetv1.FleetNodeOnline {
		return Change{}
	}
	if c := ready(n); c == nil || c.Status != metav1.ConditionTrue {
		return Change{}
	}
	msg := fmt.Sprintf("nothing from the agent since %s though its stream to hub %s is open; Offline after %s unless it is heard from",
		rfc3339(since), hub, offlineTimeout)
	setCondition(n, fleetv1.ReadyCondition, metav1.ConditionUnknown, fleetv1.ReasonNotResponding, msg, now)
	return warning(fleetv1.ReasonNotResponding, msg)
}

// heardAgain ends the message of a Ready condition restored by
// SetResponding.
const heardAgain = " (heard from again after a silence)"

// SetResponding undoes SetNotResponding: the node was heard from. prev is
// the Ready condition it had before (nil: not known, e.g. the hub
// restarted); its reason comes back, so that a MovedHub stays MovedHub.
// Nothing changes unless the node is NotResponding at hub.
func SetResponding(n *fleetv1.FleetNode, hub string, prev *metav1.Condition, now time.Time) Change {
	c := ready(n)
	if n.Status.Hub != hub || n.Status.Phase != fleetv1.FleetNodeOnline || c == nil || c.Reason != fleetv1.ReasonNotResponding {
		return Change{}
	}
	reason, msg := fleetv1.ReasonConnected, "connected to hub "+hub
	if prev != nil {
		reason, msg = prev.Reason, prev.Message
	}
	msg = strings.TrimSuffix(msg, heardAgain) + heardAgain
	setReady(n, true, reason, msg, now)
	return normal(fleetv1.ReasonConnected, msg)
}

// SetHeartbeat refreshes the coarse lastHeartbeatTime of a node at hub
// with seen, its last heartbeat.
func SetHeartbeat(n *fleetv1.FleetNode, hub string, seen time.Time) Change {
	t := stamp(seen)
	if n.Status.Hub != hub || n.Status.LastHeartbeatTime.Equal(t) {
		return Change{}
	}
	n.Status.LastHeartbeatTime = t
	return changed
}

// SetHeartbeatTimeout makes a node at hub that has been silent since
// lastSeen for the offline timeout Offline, reason HeartbeatTimeout. adopted
// says hub never heard from it (it adopted the node after a restart, or
// claimed it from a lost hub): lastSeen is when, and the lastHeartbeatTime
// on record, older than that, is kept. A revoked node's Ready goes False,
// reason Revoked, and its phase stays the manager's.
func SetHeartbeatTimeout(n *fleetv1.FleetNode, hub string, lastSeen time.Time, adopted bool, now time.Time) Change {
	if n.Status.Hub != hub {
		return Change{}
	}
	if n.Spec.Revoked {
		return setRevokedReady(n, hub, now)
	}
	if n.Status.Phase != fleetv1.FleetNodeOnline {
		return Change{}
	}
	var msg string
	switch c := ready(n); {
	case adopted && c != nil && c.Reason == fleetv1.ReasonHubLost:
		msg = fmt.Sprintf("not connected since hub %s took it over from a lost hub at %s (last heartbeat on record: %s)",
			hub, rfc3339(lastSeen), heartbeatOnRecord(n))
	case adopted:
		msg = fmt.Sprintf("not connected since hub %s restarted at %s (last heartbeat on record: %s)",
			hub, rfc3339(lastSeen), heartbeatOnRecord(n))
	default:
		msg = "no heartbeat since " + rfc3339(lastSeen)
		n.Status.LastHeartbeatTime = stamp(lastSeen)
	}
	setReady(n, false, fleetv1.ReasonHeartbeatTimeout, msg, now)
	return warning(fleetv1.ReasonHeartbeatTimeout, msg)
}

// SetHubLost claims for hub a node still Online at lost, a hub whose Lease
// expired, and whose agent has not connected anywhere since: status.hub
// becomes hub, Ready Unknown, reason HubLost. hub then tracks the node as
// one it adopted: Offline after offlineTimeout unless the agent connects.
// Two hubs claiming at once are settled by the optimistic lock: the second
// reads the node at the first and changes nothing.
func SetHubLost(n *fleetv1.FleetNode, hub, lost string, now time.Time, offlineTimeout time.Duration) Change {
	if lost == "" || lost == hub || n.Status.Hub != lost || n.Spec.Revoked || n.Status.Phase != fleetv1.FleetNodeOnline {
		return Change{}
	}
	msg := fmt.Sprintf("hub %s stopped renewing its Lease and the agent has not reconnected; hub %s took the node over at %s: Offline after %s unless it connects",
		lost, hub, rfc3339(now), offlineTimeout)
	n.Status.Hub = hub
	setCondition(n, fleetv1.ReadyCondition, metav1.ConditionUnknown, fleetv1.ReasonHubLost, msg, now)
	return warning(fleetv1.ReasonHubLost, msg)
}

// readyUnknown reports whether n's Ready condition is Unknown.
func readyUnknown(n *fleetv1.FleetNode) bool {
	c := ready(n)
	return c != nil && c.Status == metav1.ConditionUnknown
}

func heartbeatOnRecord(n *fleetv1.FleetNode) string {
	if n.Status.LastHeartbeatTime == nil {
		return "none"
	}
	return rfc3339(n.Status.LastHeartbeatTime.Time)
}
