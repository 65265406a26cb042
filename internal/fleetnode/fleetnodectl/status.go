package fleetnodectl

import (
	"time"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/fleetnode"
)

// Decision is what one reconcile concluded, for the caller to write and announce.
type Decision struct {
	// Changed is true when status must be written.
	Changed bool
	// Events announce the changes, in order.
	Events []fleetnode.Event
}

func (d *Decision) add(c fleetnode.Change) {
	d.Changed = d.Changed || c.Changed
	if !c.Event.IsZero() {
		d.Events = append(d.Events, c.Event)
	}
}

// Decide updates the parts of n's status the manager owns from its spec:
// the Approved condition and the phases Pending and Revoked. It is pure, so
// it is table-tested without an API.
func Decide(n *fleetv1.FleetNode, now time.Time) Decision {
	var d Decision
	if n.Spec.Revoked {
		d.add(fleetnode.SetRevoked(n, now))
		return d
	}
	d.add(fleetnode.SetUnrevoked(n))
	d.add(fleetnode.SetPending(n))
	if n.Spec.Approved {
		d.add(fleetnode.SetApproved(n, fleetnode.ApprovedBy(n), now))
	} else {
		d.add(fleetnode.SetAwaitingApproval(n, now))
	}
	return d
}
