package hub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// router joins the hub's features: a node's snapshot holds every feature's
// items, and each report goes to the feature that owns its uid, if that
// feature assigned the uid to the reporting node. Reports no feature owns
// are dropped and counted; so are reports of work the sending node was
// not given (foreign), which are logged too, once per node and uid.
type router struct {
	features []Feature
	unrouted prometheus.Counter
	foreign  *prometheus.CounterVec // by feature
	warned   *onceSet
	log      *slog.Logger
}

// warnedMax bounds the (node, uid) pairs the router remembers having
// warned of: a node forging reports for ever new uids costs bounded memory
// (and, past it, a log line per report, as any flood of bad reports does).
const warnedMax = 4096

// newRouter checks the features: none nil, names set and unique.
func newRouter(features []Feature, unrouted prometheus.Counter, foreign *prometheus.CounterVec, log *slog.Logger) (*router, error) {
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
		foreign.WithLabelValues(name) // a series at 0 for every feature: an alert can tell "none" from "not exported"
	}
	return &router{features: features, unrouted: unrouted, foreign: foreign, warned: newOnceSet(warnedMax), log: log}, nil
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

// route returns the index of the feature that takes st from node, or -1
// when the report is dropped: no feature owns its uid, or the owner did
// not assign the uid to node.
func (r *router) route(ctx context.Context, node string, st *agentv1.WorkStatus) int {
	uid := st.GetUid()
	i := r.owner(uid)
	if i < 0 {
		r.unrouted.Inc()
		r.log.Debug("dropped a report no feature owns", "node", node, "uid", uid, "phase", st.GetPhase())
		return -1
	}
	f := r.features[i]
	if !f.Assigned(ctx, node, uid) {
		r.foreign.WithLabelValues(f.Name()).Inc()
		if r.warned.first(callKey{node, uid}) {
			r.log.Warn("dropped a report of work this node was not given: a node reports on its own work only",
				"node", node, "uid", uid, "phase", st.GetPhase(), "feature", f.Name())
		}
		return -1
	}
	return i
}

// WorkStatus hands st to the feature owning its uid, and reports whether
// it did.
func (r *router) WorkStatus(ctx context.Context, node string, st *agentv1.WorkStatus) bool {
	i := r.route(ctx, node, st)
	if i < 0 {
		return false
	}
	r.features[i].WorkStatus(ctx, node, st)
	return true
}

// NodeState hands every feature the part of node's state it owns and
// assigned to node, even an empty part: the state replaces what the
// feature knew of the node. It returns the entries it handed on.
func (r *router) NodeState(ctx context.Context, node string, work []*agentv1.WorkStatus) []*agentv1.WorkStatus {
	parts := make([][]*agentv1.WorkStatus, len(r.features))
	taken := make([]*agentv1.WorkStatus, 0, len(work))
	for _, st := range work {
		i := r.route(ctx, node, st)
		if i < 0 {
			continue
		}
		parts[i] = append(parts[i], st)
		taken = append(taken, st)
	}
	for i, f := range r.features {
		f.NodeState(ctx, node, parts[i])
	}
	return taken
}

// workStatus delivers one report of node: to its feature, then to a Call
// waiting for it (which thus returns only once the feature has seen it). A
// report the router dropped satisfies no Call either.
func (h *Hub) workStatus(ctx context.Context, node string, st *agentv1.WorkStatus) {
	if h.router.WorkStatus(ctx, node, st) {
		h.calls.offer(node, st)
	}
}

// nodeState delivers the agent's whole state: each part to its feature, and
// every entry the features took to the Calls waiting for it (after a
// revision gap a NodeState is all that says how an item went).
func (h *Hub) nodeState(ctx context.Context, node string, work []*agentv1.WorkStatus) {
	for _, st := range h.router.NodeState(ctx, node, work) {
		h.calls.offer(node, st)
	}
}

// onceSet remembers up to n keys, forgetting the oldest first.
type onceSet struct {
	mu    sync.Mutex
	seen  map[callKey]struct{}
	order []callKey // a ring of the keys in seen, oldest at next
	next  int
}

func newOnceSet(n int) *onceSet {
	n = max(n, 1)
	return &onceSet{seen: make(map[callKey]struct{}, n), order: make([]callKey, 0, n)}
}

// first reports whether k is new, and remembers it.
func (s *onceSet) first(k callKey) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.seen[k]; ok {
		return false
	}
	if len(s.order) < cap(s.order) {
		s.order = append(s.order, k)
	} else {
		delete(s.seen, s.order[s.next])
		s.order[s.next] = k
		s.next = (s.next + 1) % len(s.order)
	}
	s.seen[k] = struct{}{}
	return true
}
