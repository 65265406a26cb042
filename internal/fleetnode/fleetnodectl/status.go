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
// the Approved condition, the phases Pending and Revoked, and what of the
// agent's reports is approved (LabelsApproved, CapacityApproved and the
// capped capacity the scheduler reads). It is pure, so it is table-tested
// without an API.
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
	d.add(fleetnode.SetLabelsApproval(n, now))
	d.add(fleetnode.SetCapacity(n, now))
	return d
}

// DecideNode updates what the manager writes outside a node's status: it
// approves the reports of a node approved by hand (spec), and carries the
// approved labels into metadata.labels. It reports whether n changed. A
// revoked node is left as it is.
func DecideNode(n *fleetv1.FleetNode) bool {
	if n.Spec.Revoked {
		return false
	}
	adopted := fleetnode.AdoptReported(n)
	return fleetnode.ApplyApprovedLabels(n) || adopted
}
