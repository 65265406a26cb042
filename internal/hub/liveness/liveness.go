package liveness

import (
	"sort"
	"time"
)

// Options configure a Tracker.
type Options struct {
	// OfflineTimeout is how long a node may go without a heartbeat before it
	// is reported Offline. Zero means 5 minutes.
	OfflineTimeout time.Duration
	// RefreshInterval is how often the coarse lastHeartbeatTime of a live node
	// is written to the API. Zero means 10 minutes, i.e. 0.1 writes per idle
	// node per minute.
	RefreshInterval time.Duration
	// AdoptGrace is how long an adopted node may take to connect before it
	// is reported Disconnected (Due.Unconnected). Zero means 1 minute.
	AdoptGrace time.Duration
	// LateAfter is how long a connected node may go without a heartbeat
	// before it is reported Late (Due.Late), well before OfflineTimeout: a
	// stream that looks open may be dead, and new work should go
	// elsewhere meanwhile. Zero: never.
	LateAfter time.Duration
}

type entry struct {
	lastSeen    time.Time // last heartbeat or connect
	lastWritten time.Time // last time the API got a lastHeartbeatTime
	connected   bool
	// adopted is set from Adopt until the node connects; reported says
	// that Tick has listed it in Due.Unconnected.
	adopted, reported bool
	// late is set once Tick has listed the node in Due.Late, until it is
	// heard from again.
	late bool
}

// Tracker tracks the nodes one hub has heard from.
type Tracker struct {
	opts  Options
	nodes map[string]*entry
}

// New returns an empty Tracker.
func New(opts Options) *Tracker {
	if opts.OfflineTimeout <= 0 {
		opts.OfflineTimeout = 5 * time.Minute
	}
	if opts.RefreshInterval <= 0 {
		opts.RefreshInterval = 10 * time.Minute
	}
	if opts.AdoptGrace <= 0 {
		opts.AdoptGrace = time.Minute
	}
	return &Tracker{opts: opts, nodes: map[string]*entry{}}
}

// Connected records that node opened a stream at now; the caller writes the
// Online transition, so this counts as a write of lastHeartbeatTime.
func (t *Tracker) Connected(node string, now time.Time) {
	t.nodes[node] = &entry{lastSeen: now, lastWritten: now, connected: true}
}

// Adopt tracks a node that the API shows Online at this hub but that has
// not connected to this process: the hub restarted, and the node may never
// come back. Counted from now, it is reported Unconnected after AdoptGrace
// and Offline after OfflineTimeout unless it connects. It reports false,
// and changes nothing, for a node the tracker already holds.
func (t *Tracker) Adopt(node string, now time.Time) bool {
	if _, ok := t.nodes[node]; ok {
		return false
	}
	t.nodes[node] = &entry{lastSeen: now, lastWritten: now, adopted: true}
	return true
}

// Disconnected records that node's stream ended. The node stays live until
// its heartbeats time out, so a reconnect (here or at another hub) within the
// timeout never shows Offline.
func (t *Tracker) Disconnected(node string) {
	if e, ok := t.nodes[node]; ok {
		e.connected = false
	}
}

// Heartbeat records a heartbeat (any message from the node counts). known
// is false for a node the tracker does not know (it must open a stream
// first); back is true while the node is reported Late: the caller undoes
// that in the API, then calls Responding.
func (t *Tracker) Heartbeat(node string, now time.Time) (known, back bool) {
	e, ok := t.nodes[node]
	if !ok {
		return false, false
	}
	if now.After(e.lastSeen) {
		e.lastSeen = now
	}
	return true, e.late
}

// Responding ends a node's Late report, once the API says it is back.
func (t *Tracker) Responding(node string) {
	if e, ok := t.nodes[node]; ok {
		e.late = false
	}
}

// Late reports whether node is reported Late now (not heard from since).
func (t *Tracker) Late(node string) bool {
	e, ok := t.nodes[node]
	return ok && e.late
}

// Forget drops a node without reporting it (revoked, deleted, or taken over
// by another hub).
func (t *Tracker) Forget(node string) { delete(t.nodes, node) }

// Known reports whether the tracker holds node.
func (t *Tracker) Known(node string) bool { _, ok := t.nodes[node]; return ok }

// Len is the number of nodes tracked.
func (t *Tracker) Len() int { return len(t.nodes) }

// Due is what the API must be told at one instant.
type Due struct {
	// Offline lists nodes silent for longer than OfflineTimeout, with the time
	// each was last heard from. They are forgotten by the tracker.
	Offline []Silent
	// Refresh lists live nodes whose lastHeartbeatTime should be written, with
	// the time to write. Their write time is advanced by the call.
	Refresh []Silent
	// Unconnected lists adopted nodes that have not connected within
	// AdoptGrace, once each, with the time they were adopted.
	Unconnected []Silent
	// Late lists connected nodes silent for longer than LateAfter, once
	// each until they are heard from again.
	Late []Silent
}

// Silent names a node and when it was last heard from.
type Silent struct {
	Node     string
	LastSeen time.Time
	// Adopted says that this hub never heard from the node: LastSeen is
	// when the hub adopted it.
	Adopted bool
}

// Tick returns what is due at now. Results are sorted by node name so that
// callers and tests see a stable order.
func (t *Tracker) Tick(now time.Time) Due {
	var d Due
	for name, e := range t.nodes {
		switch {
		case now.Sub(e.lastSeen) > t.opts.OfflineTimeout:
			d.Offline = append(d.Offline, Silent{Node: name, LastSeen: e.lastSeen, Adopted: e.adopted})
			delete(t.nodes, name)
		case e.adopted && !e.reported && now.Sub(e.lastSeen) >= t.opts.AdoptGrace:
			e.reported = true
			d.Unconnected = append(d.Unconnected, Silent{Node: name, LastSeen: e.lastSeen, Adopted: true})
		case e.connected && !e.late && t.opts.LateAfter > 0 && now.Sub(e.lastSeen) > t.opts.LateAfter:
			e.late = true
			d.Late = append(d.Late, Silent{Node: name, LastSeen: e.lastSeen})
		// An adopted node was never heard from: there is nothing to refresh.
		case !e.adopted && now.Sub(e.lastWritten) >= t.opts.RefreshInterval:
			e.lastWritten = now
			d.Refresh = append(d.Refresh, Silent{Node: name, LastSeen: e.lastSeen})
		}
	}
	sort.Slice(d.Offline, func(i, j int) bool { return d.Offline[i].Node < d.Offline[j].Node })
	sort.Slice(d.Refresh, func(i, j int) bool { return d.Refresh[i].Node < d.Refresh[j].Node })
	sort.Slice(d.Unconnected, func(i, j int) bool { return d.Unconnected[i].Node < d.Unconnected[j].Node })
	sort.Slice(d.Late, func(i, j int) bool { return d.Late[i].Node < d.Late[j].Node })
	return d
}
