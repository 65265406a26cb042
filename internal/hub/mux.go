package hub

import (
	"context"
	"fmt"

	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// Route is one component that dispatches work through a hub (node jobs,
// tasks): the work items it owns, where they come from and where their
// reports go.
type Route struct {
	// Name is the component's name, for errors.
	Name string
	// Owns reports whether a work uid is this component's. Nil owns every
	// uid that no earlier route owns.
	Owns func(uid string) bool
	// Work lists the component's items for a node. Nil: none.
	Work WorkSource
	// Status receives the reports of the uids it owns. Nil: discarded.
	Status StatusSink
}

// Mux combines several components into one WorkSource and StatusSink: a
// node's snapshot holds every component's items, and each report goes to the
// component whose uid it is.
type Mux struct {
	routes []Route
}

var (
	_ WorkSource = (*Mux)(nil)
	_ StatusSink = (*Mux)(nil)
	_ Readier    = (*Mux)(nil)
)

// NewMux routes reports to the first route that owns their uid.
func NewMux(routes ...Route) *Mux { return &Mux{routes: routes} }

// WorkFor implements WorkSource. One component failing fails the whole
// list: a snapshot without that component's items would make the agent
// cancel them.
func (m *Mux) WorkFor(ctx context.Context, node string) ([]*agentv1.WorkItem, error) {
	var out []*agentv1.WorkItem
	for _, r := range m.routes {
		if r.Work == nil {
			continue
		}
		items, err := r.Work.WorkFor(ctx, node)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r.Name, err)
		}
		out = append(out, items...)
	}
	return out, nil
}

// Ready implements Readier: every route's WorkSource that can tell is ready.
func (m *Mux) Ready() bool {
	for _, r := range m.routes {
		if rd, ok := r.Work.(Readier); ok && !rd.Ready() {
			return false
		}
	}
	return true
}

// route returns the index of the route owning uid, or -1.
func (m *Mux) route(uid string) int {
	for i, r := range m.routes {
		if r.Owns == nil || r.Owns(uid) {
			return i
		}
	}
	return -1
}

// WorkStatus implements StatusSink.
func (m *Mux) WorkStatus(ctx context.Context, node string, st *agentv1.WorkStatus) {
	if i := m.route(st.GetUid()); i >= 0 && m.routes[i].Status != nil {
		m.routes[i].Status.WorkStatus(ctx, node, st)
	}
}

// NodeState implements StatusSink: every route gets the part of the node's
// state it owns, even an empty part (the state replaces what it knew).
func (m *Mux) NodeState(ctx context.Context, node string, work []*agentv1.WorkStatus) {
	parts := make([][]*agentv1.WorkStatus, len(m.routes))
	for _, st := range work {
		if i := m.route(st.GetUid()); i >= 0 {
			parts[i] = append(parts[i], st)
		}
	}
	for i, r := range m.routes {
		if r.Status != nil {
			r.Status.NodeState(ctx, node, parts[i])
		}
	}
}
