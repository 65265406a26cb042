package hub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// router joins the hub's features: a node's snapshot holds every feature's
// items, and each report goes to the feature that owns its uid. Reports no
// feature owns are dropped and counted.
type router struct {
	features []Feature
	unrouted prometheus.Counter
	log      *slog.Logger
}

// newRouter checks the features: none nil, names set and unique.
func newRouter(features []Feature, unrouted prometheus.Counter, log *slog.Logger) (*router, error) {
	seen := map[string]bool{}
	for i, f := range features {
		if f == nil {
			return nil, fmt.Errorf("hub options: Features[%d] is nil", i)
		}
		name := f.Name()
		if name == "" {
			return nil, fmt.Errorf("hub options: Features[%d] (%T) has no name", i, f)
		}
		if seen[name] {
			return nil, fmt.Errorf("hub options: two features are named %q; each feature is registered once", name)
		}
		seen[name] = true
	}
	return &router{features: features, unrouted: unrouted, log: log}, nil
}

// logFinder returns the one feature that finds task logs, nil if none.
func (r *router) logFinder() (LogFinder, error) {
	var found LogFinder
	var by string
	for _, f := range r.features {
		lf, ok := f.(LogFinder)
		if !ok {
			continue
		}
		if found != nil {
			return nil, fmt.Errorf("hub options: features %s and %s both find task logs; TaskLogs needs one", by, f.Name())
		}
		found, by = lf, f.Name()
	}
	return found, nil
}

// ready reports whether every feature that can tell has loaded.
func (r *router) ready() bool {
	for _, f := range r.features {
		if rd, ok := f.(Readier); ok && !rd.Ready() {
			return false
		}
	}
	return true
}

// owner returns the index of the feature owning uid, or -1.
func (r *router) owner(uid string) int {
	for i, f := range r.features {
		if f.Owns(uid) {
			return i
		}
	}
	return -1
}

// WorkFor lists every feature's items for node. One feature failing fails
// the whole list: a snapshot without that feature's items would make the
// agent cancel them.
func (r *router) WorkFor(ctx context.Context, node string) ([]*agentv1.WorkItem, error) {
	var out []*agentv1.WorkItem
	var errs []error
	for _, f := range r.features {
		items, err := f.WorkFor(ctx, node)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f.Name(), err))
			continue
		}
		out = append(out, items...)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// WorkStatus hands st to the feature owning its uid.
func (r *router) WorkStatus(ctx context.Context, node string, st *agentv1.WorkStatus) {
	i := r.owner(st.GetUid())
	if i < 0 {
		r.drop(node, st)
		return
	}
	r.features[i].WorkStatus(ctx, node, st)
}

// NodeState hands every feature the part of node's state it owns, even an
// empty part: the state replaces what the feature knew of the node.
func (r *router) NodeState(ctx context.Context, node string, work []*agentv1.WorkStatus) {
	parts := make([][]*agentv1.WorkStatus, len(r.features))
	for _, st := range work {
		i := r.owner(st.GetUid())
		if i < 0 {
			r.drop(node, st)
			continue
		}
		parts[i] = append(parts[i], st)
	}
	for i, f := range r.features {
		f.NodeState(ctx, node, parts[i])
	}
}

func (r *router) drop(node string, st *agentv1.WorkStatus) {
	r.unrouted.Inc()
	r.log.Debug("dropped a report no feature owns", "node", node, "uid", st.GetUid(), "phase", st.GetPhase())
}

// workStatus delivers one report of node: to its feature, then to a Call
// waiting for it (which thus returns only once the feature has seen it).
func (h *Hub) workStatus(ctx context.Context, node string, st *agentv1.WorkStatus) {
	h.router.WorkStatus(ctx, node, st)
	h.calls.offer(node, st)
}

// nodeState delivers the agent's whole state: each part to its feature, and
// every entry to the Calls waiting for it (after a revision gap a NodeState
// is all that says how an item went).
func (h *Hub) nodeState(ctx context.Context, node string, work []*agentv1.WorkStatus) {
	h.router.NodeState(ctx, node, work)
	for _, st := range work {
		h.calls.offer(node, st)
	}
}
