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
}

type entry struct {
	lastSeen    time.Time // last heartbeat or connect
	lastWritten time.Time // last time the API got a lastHeartbeatTime
	connected   bool
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
	return &Tracker{opts: opts, nodes: map[string]*entry{}}
}

// Connected records that node opened a stream at now; the caller writes the
// Online transition, so this counts as a write of lastHeartbeatTime.
func (t *Tracker) Connected(node string, now time.Time) {
	t.nodes[node] = &entry{lastSeen: now, lastWritten: now, connected: true}
}

// Disconnected records that node's stream ended. The node stays live until
// its heartbeats time out, so a reconnect (here or at another hub) within the
// timeout never shows Offline.
func (t *Tracker) Disconnected(node string) {
	if e, ok := t.nodes[node]; ok {
		e.connected = false
	}
}

// Heartbeat records a heartbeat. It reports false for a node the tracker does
// not know (it must open a stream first).
func (t *Tracker) Heartbeat(node string, now time.Time) bool {
	e, ok := t.nodes[node]
	if !ok {
		return false
	}
	if now.After(e.lastSeen) {
		e.lastSeen = now
	}
	return true
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
}

// Silent names a node and when it was last heard from.
type Silent struct {
	Node     string
	LastSeen time.Time
}

// Tick returns what is due at now. Results are sorted by node name so that
// callers and tests see a stable order.
func (t *Tracker) Tick(now time.Time) Due {
	var d Due
	for name, e := range t.nodes {
		switch {
		case now.Sub(e.lastSeen) > t.opts.OfflineTimeout:
			d.Offline = append(d.Offline, Silent{Node: name, LastSeen: e.lastSeen})
			delete(t.nodes, name)
		case now.Sub(e.lastWritten) >= t.opts.RefreshInterval:
			e.lastWritten = now
			d.Refresh = append(d.Refresh, Silent{Node: name, LastSeen: e.lastSeen})
		}
	}
	sort.Slice(d.Offline, func(i, j int) bool { return d.Offline[i].Node < d.Offline[j].Node })
	sort.Slice(d.Refresh, func(i, j int) bool { return d.Refresh[i].Node < d.Refresh[j].Node })
	return d
}
