package fleetnode

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
)

// Change is what a setter did to a node.
type Change struct {
	// Changed is true when the status must be written.
	Changed bool
	// Event announces the change; its zero value announces nothing.
	Event Event
}

// Event is an Event to record on the node once the change is written.
type Event struct {
	// Type is corev1.EventTypeNormal or corev1.EventTypeWarning.
	Type string
	// Reason is the condition reason the change set (Connected, Revoked, …).
	Reason string
	// Note is the Event's message.
	Note string
}

// IsZero reports that there is nothing to announce.
func (e Event) IsZero() bool { return e.Reason == "" }

// changed is a Change without an Event.
var changed = Change{Changed: true}

func normal(reason, note string) Change {
	return Change{Changed: true, Event: Event{Type: corev1.EventTypeNormal, Reason: reason, Note: note}}
}

func warning(reason, note string) Change {
	return Change{Changed: true, Event: Event{Type: corev1.EventTypeWarning, Reason: reason, Note: note}}
}

// setCondition sets condition typ on n; LastTransitionTime moves to now
// only when the status changes.
func setCondition(n *fleetv1.FleetNode, typ string, status metav1.ConditionStatus, reason, msg string, now time.Time) {
	meta.SetStatusCondition(&n.Status.Conditions, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: msg,
		ObservedGeneration: n.Generation, LastTransitionTime: metav1.NewTime(now),
	})
}

// ready is n's Ready condition, or nil.
func ready(n *fleetv1.FleetNode) *metav1.Condition {
	return meta.FindStatusCondition(n.Status.Conditions, fleetv1.ReadyCondition)
}

// stamp is t as the API keeps a coarse time: to the second.
func stamp(t time.Time) *metav1.Time {
	mt := metav1.NewTime(t.Truncate(time.Second))
	return &mt
}

// rfc3339 formats t for a message.
func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339) }
