package session

import (
	"errors"
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"

	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

const (
	// DefaultQueueLimit bounds the envelopes waiting for one agent's
	// stream. When it is full, Dispatches and Cancels are no longer queued:
	// the stream resyncs with a snapshot, which carries them, once the
	// queue has drained.
	DefaultQueueLimit = 256
	// DefaultQueueBytesLimit bounds the same queue in bytes (encoded
	// envelopes): 256 envelopes of up to protocol.MaxEnvelopeBytes each
	// would let one node hold a quarter of a GiB of a hub's memory. A
	// queue holds at least one envelope, whatever its size.
	DefaultQueueBytesLimit = 8 << 20
	// DefaultSeenLimit bounds how many agent envelope ids are remembered
	// to spot re-sends.
	DefaultSeenLimit = 512
)

var (
	// ErrClosed is wrapped by every refusal of a closed Machine; the
	// message names the reason it was closed.
	ErrClosed = errors.New("stream closed")
	// ErrQueueFull is wrapped when an envelope cannot be queued.
	ErrQueueFull = errors.New("the node's send queue is full")
)

// Config starts a Machine.
type Config struct {
	// Node the stream belongs to; every envelope names it.
	Node string
	// HubRevision is the last hub->agent revision the agent applied: the
	// stream's revisions continue from it.
	HubRevision uint64
	// AgentRevision is the last agent->hub revision the hub acknowledged.
	AgentRevision uint64
	// Batching is set when the agent named protocol.FeatureDispatchBatch:
	// Next then joins queued Dispatches into one envelope.
	Batching bool
	// QueueLimit bounds the queue. Default: DefaultQueueLimit.
	QueueLimit int
	// QueueBytesLimit bounds the queue's encoded size. Default:
	// DefaultQueueBytesLimit.
	QueueBytesLimit int
	// SeenLimit bounds the remembered agent envelope ids. Default:
	// DefaultSeenLimit.
	SeenLimit int
	// NewID names each envelope the Machine builds. Default:
	// protocol.NewID. Tests pass a counter, for traces that read the same
	// on every run.
	NewID func() string
}

// Outcome is what became of a Dispatch or a Cancel that was accepted.
type Outcome int

const (
	// Queued: it is on the queue and pending until acked.
	Queued Outcome = iota + 1
	// Deferred: the queue was full; the resync snapshot carries it.
	Deferred
)

func (o Outcome) String() string {
	switch o {
	case Queued:
		return "queued"
	case Deferred:
		return "deferred"
	default:
		return fmt.Sprintf("Outcome(%d)", int(o))
	}
}

// Action is what the stream does next (see Next).
type Action int

const (
	// Idle: nothing to send; wait until an event queues something.
	Idle Action = iota
	// Send the envelope Next returned.
	Send
	// Resync: the queue was full and has drained; build a snapshot
	// (BeginSnapshot, EndSnapshot with agentHas 0) before anything else.
	Resync
	// Closed: the stream ends; Reason says why.
	Closed
)

func (a Action) String() string {
	switch a {
	case Idle:
		return "idle"
	case Send:
		return "send"
	case Resync:
		return "resync"
	case Closed:
		return "closed"
	default:
		return fmt.Sprintf("Action(%d)", int(a))
	}
}

// Machine is one agent stream's state. It is not safe for concurrent use:
// its owner serialises events (the hub with a mutex).
type Machine struct {
	node       string
	batching   bool
	queueLimit int
	queueBytes int // limit
	newID      func() string

	reason string // why it was closed; "" while open
	rev    uint64 // last hub->agent revision taken
	queue  []*agentv1.Envelope
	// sizes are the encoded sizes of queue's envelopes, as they were
	// queued; queued is their sum.
	sizes  []int
	queued int
	// snap is a snapshot that met a full queue: Next sends it before what
	// is queued, which it supersedes (the agent acks those as stale).
	snap *agentv1.Envelope
	// pending are the envelopes sent or queued and not acked yet, by id.
	pending map[string]*agentv1.Envelope
	// batches maps the id of a Dispatch that Next sent with more items
	// (the id of the first envelope it joined) to the ids of the others it
	// joined: the agent acks the sent envelope only, which settles them all.
	batches map[string][]string

	seen  seen
	agent protocol.Tracker // agent->hub report revisions

	// builds counts the snapshots being built, and the resync owed: while
	// it is above zero, recent keeps the Dispatch and Cancel envelopes
	// taken meanwhile, so that a snapshot ending after them shows them.
	builds int
	recent []*agentv1.Envelope
	// first is set until the stream's first snapshot begins: events may
	// come as soon as the Machine exists, before that snapshot (which
	// follows them on the stream), and it must show them. firstMark is the
	// revision the stream started from.
	first     bool
	firstMark uint64
	// resync is set while the queue was full: what was not queued since
	// revision resyncMark (kept in recent) goes out in the next snapshot.
	resync     bool
	resyncMark uint64
}

// New returns the Machine of a stream that just opened.
func New(cfg Config) *Machine {
	if cfg.QueueLimit <= 0 {
		cfg.QueueLimit = DefaultQueueLimit
	}
	if cfg.QueueBytesLimit <= 0 {
		cfg.QueueBytesLimit = DefaultQueueBytesLimit
	}
	if cfg.SeenLimit <= 0 {
		cfg.SeenLimit = DefaultSeenLimit
	}
	if cfg.NewID == nil {
		cfg.NewID = protocol.NewID
	}
	return &Machine{
		node:       cfg.Node,
		batching:   cfg.Batching,
		queueLimit: cfg.QueueLimit,
		queueBytes: cfg.QueueBytesLimit,
		newID:      cfg.NewID,
		rev:        cfg.HubRevision,
		seen:       seen{limit: cfg.SeenLimit},
		agent:      *protocol.NewTracker(cfg.AgentRevision),
		// Counted as building from the start, so that what is queued
		// before the first snapshot is remembered for it.
		builds:    1,
		first:     true,
		firstMark: cfg.HubRevision,
	}
}

// Batching reports whether Next joins queued Dispatches.
func (m *Machine) Batching() bool { return m.batching }

// Revision is the last hub->agent revision taken.
func (m *Machine) Revision() uint64 { return m.rev }

// Pending is how many envelopes the agent has not acked yet.
func (m *Machine) Pending() int { return len(m.pending) }

// Queued is how many envelopes wait for the stream.
func (m *Machine) Queued() int { return len(m.queue) }

// QueuedBytes is the encoded size of the envelopes waiting for the stream.
func (m *Machine) QueuedBytes() int { return m.queued }

// full says whether an envelope of n bytes finds no room on the queue: by
// count, or by bytes unless the queue is empty (a queue always takes one).
func (m *Machine) full(n int) bool {
	return len(m.queue) >= m.queueLimit || (len(m.queue) > 0 && m.queued+n > m.queueBytes)
}

// Reason is why the Machine was closed, "" while it is open.
func (m *Machine) Reason() string { return m.reason }

// Close ends the stream with reason. It reports whether this call closed
// it (a second Close keeps the first reason).
func (m *Machine) Close(reason string) bool {
	if m.reason != "" {
		return false
	}
	m.reason = reason
	return true
}

func (m *Machine) closedErr() error {
	return fmt.Errorf("%w: %s", ErrClosed, m.reason)
}

// Dispatch takes the next revision for item.
func (m *Machine) Dispatch(item *agentv1.WorkItem) (*agentv1.Envelope, Outcome, error) {
	return m.take(0, func(rev uint64) *agentv1.Envelope {
		return &agentv1.Envelope{Revision: rev, Payload: &agentv1.Envelope_Dispatch{Dispatch: &agentv1.Dispatch{Item: item}}}
	})
}

// Cancel takes the next revision for the cancellation of work item uid.
func (m *Machine) Cancel(uid string) (*agentv1.Envelope, Outcome, error) {
	return m.take(0, func(rev uint64) *agentv1.Envelope {
		return &agentv1.Envelope{Revision: rev, Payload: &agentv1.Envelope_Cancel{Cancel: &agentv1.Cancel{Uid: uid}}}
	})
}

// take builds the envelope at the next revision past floor and queues it.
// A Dispatch or Cancel meeting a full queue switches to resync instead.
func (m *Machine) take(floor uint64, build func(rev uint64) *agentv1.Envelope) (*agentv1.Envelope, Outcome, error) {
	if m.reason != "" {
		return nil, 0, m.closedErr()
	}
	rev := max(m.rev, floor) + 1
	env := m.seal(build(rev))
	// The agent ignores (and never acks) a malformed envelope, and its
	// stream breaks on an oversized one: refuse them here, where the
	// caller learns why, before the revision is used up.
	n, err := check(env)
	if err != nil {
		return nil, 0, err
	}
	m.rev = rev
	if env.GetKind() == agentv1.Kind_KIND_SNAPSHOT {
		return env, Queued, m.pushSnapshot(env, n)
	}
	if !m.resync && m.full(n) {
		// Counted as building until the resync snapshot begins, so that
		// recent keeps what it must carry.
		m.resync, m.resyncMark = true, rev-1
		m.builds++
	}
	if m.resync {
		m.recent = append(m.recent, env)
		return env, Deferred, nil
	}
	m.enqueue(env, n)
	if m.builds > 0 {
		m.recent = append(m.recent, env)
	}
	return env, Queued, nil
}

// check validates env and returns its encoded size.
func check(env *agentv1.Envelope) (int, error) {
	if err := protocol.Validate(env); err != nil {
		return 0, err
	}
	n := proto.Size(env)
	if n > protocol.MaxEnvelopeBytes {
		return 0, fmt.Errorf("%s is %d bytes, more than the protocol's %d: %w", env.GetKind(), n, protocol.MaxEnvelopeBytes, protocol.ErrTooLarge)
	}
	return n, nil
}

func (m *Machine) seal(env *agentv1.Envelope) *agentv1.Envelope {
	env.Id, env.Node, env.Kind = m.newID(), m.node, protocol.KindOf(env)
	return env
}

// enqueue puts env, of n bytes, on the queue, pending until acked. There
// is room.
func (m *Machine) enqueue(env *agentv1.Envelope, n int) {
	m.queue, m.sizes = append(m.queue, env), append(m.sizes, n)
	m.queued += n
	m.track(env)
}

func (m *Machine) track(env *agentv1.Envelope) {
	if m.pending == nil {
		m.pending = map[string]*agentv1.Envelope{}
	}
	m.pending[env.GetId()] = env
}

// pushSnapshot queues a snapshot. One that meets a full queue carries the
// node's whole state at a later revision than anything queued, so it waits
// in the snapshot slot and goes first; a second one closes the stream.
func (m *Machine) pushSnapshot(env *agentv1.Envelope, n int) error {
	if !m.full(n) {
		m.enqueue(env, n)
		return nil
	}
	if m.snap != nil {
		m.Close("send queue full")
		return fmt.Errorf("%w; the agent will resync on reconnect", ErrQueueFull)
	}
	m.snap = env
	m.track(env)
	return nil
}

// Send queues env, which carries no revision and is not acked (a log
// request), without tracking it as pending. It is refused when the queue
// is full: the caller may retry.
func (m *Machine) Send(env *agentv1.Envelope) error {
	n, err := check(env)
	if err != nil {
		return err
	}
	if m.reason != "" {
		return m.closedErr()
	}
	if m.full(n) {
		return fmt.Errorf("%w; try again", ErrQueueFull)
	}
	m.queue, m.sizes = append(m.queue, env), append(m.sizes, n)
	m.queued += n
	return nil
}

// Push queues env exactly as built and tracks it as pending; the
// Machine's revision moves up to env's. It is for envelopes the Machine
// did not build: tests that fake a gap, a duplicate or a stale revision.
// A full queue closes the stream.
func (m *Machine) Push(env *agentv1.Envelope) error {
	if m.reason != "" {
		return m.closedErr()
	}
	n := proto.Size(env)
	if m.full(n) {
		m.Close("send queue full")
		return fmt.Errorf("%w; the agent will resync on reconnect", ErrQueueFull)
	}
	m.rev = max(m.rev, env.GetRevision())
	m.enqueue(env, n)
	return nil
}

// Next says what the stream does next, in this order: nothing once
// closed; the snapshot that met a full queue; the resync snapshot once the
// queue that was full has drained; the head of the queue (with the
// Dispatches behind it joined when batching).
func (m *Machine) Next() (Action, *agentv1.Envelope) {
	switch {
	case m.reason != "":
		return Closed, nil
	case m.snap != nil:
		env := m.snap
		m.snap = nil
		return Send, env
	case len(m.queue) == 0 && m.resync:
		return Resync, nil
	case len(m.queue) == 0:
		return Idle, nil
	}
	env := m.pop()
	if m.batching {
		env = m.gather(env)
	}
	return Send, env
}

func (m *Machine) pop() *agentv1.Envelope {
	env := m.queue[0]
	m.queue[0] = nil
	m.queue = m.queue[1:]
	m.queued -= m.sizes[0]
	m.sizes = m.sizes[1:]
	if len(m.queue) == 0 {
		m.queue, m.sizes = nil, nil // an idle stream holds no queue
	}
	return env
}

// gather joins first, a Dispatch taken from the queue, and the Dispatches
// queued right behind it at the revisions that follow into one Dispatch
// envelope (item and more), within MaxDispatchBatch items and
// MaxEnvelopeBytes. Anything else ends the batch and stays at the head of
// the queue. The joined envelopes stay pending under their own ids until
// the agent acks the one sent, which carries first's id. Only what is
// already queued is joined: a lone Dispatch goes at once.
func (m *Machine) gather(first *agentv1.Envelope) *agentv1.Envelope {
	d := first.GetDispatch()
	if d == nil || len(d.GetMore()) > 0 {
		return first
	}
	items := []*agentv1.WorkItem{d.GetItem()}
	var joined []string
	// Each envelope joined adds less than its own encoding (its item
	// without the envelope's id, node and revision), so the sum bounds the
	// batch's size.
	size := proto.Size(first)
	for len(items) < protocol.MaxDispatchBatch && len(m.queue) > 0 {
		e := m.queue[0]
		ed := e.GetDispatch()
		if ed == nil || len(ed.GetMore()) > 0 || e.GetRevision() != first.GetRevision()+uint64(len(items)) {
			break
		}
		n := proto.Size(e)
		if size+n > protocol.MaxEnvelopeBytes {
			break
		}
		m.pop()
		size += n
		items = append(items, ed.GetItem())
		joined = append(joined, e.GetId())
	}
	if len(joined) == 0 {
		return first
	}
	send := &agentv1.Envelope{Id: first.GetId(), Node: m.node, Revision: first.GetRevision(), Kind: agentv1.Kind_KIND_DISPATCH,
		Payload: &agentv1.Envelope_Dispatch{Dispatch: &agentv1.Dispatch{Item: items[0], More: items[1:]}}}
	if m.batches == nil {
		m.batches = map[string][]string{}
	}
	m.batches[send.GetId()] = joined
	return send
}

// Ack settles the envelopes the agent acked: id and more. An acked batch
// settles every envelope it joined; an acked snapshot also settles every
// envelope sent before it, since it carried the node's whole state and the
// agent never acks what a gap made it skip. Acks of unknown ids (repeats,
// ids a snapshot settled) change nothing.
func (m *Machine) Ack(id string, more ...string) {
	m.ack(id)
	for _, id := range more {
		m.ack(id)
	}
	// An idle stream holds no maps: they do not shrink by themselves.
	if len(m.pending) == 0 {
		m.pending = nil
	}
	if len(m.batches) == 0 {
		m.batches = nil
	}
}

func (m *Machine) ack(id string) {
	for _, joined := range m.batches[id] {
		delete(m.pending, joined)
	}
	delete(m.batches, id)
	env, ok := m.pending[id]
	if !ok {
		return
	}
	delete(m.pending, id)
	if env.GetKind() != agentv1.Kind_KIND_SNAPSHOT {
		return
	}
	for pid, p := range m.pending {
		if p.GetRevision() < env.GetRevision() {
			delete(m.pending, pid)
		}
	}
	// A batch whose first envelope the snapshot settled was sent before
	// it, and so were the others it joined.
	for bid := range m.batches {
		if _, ok := m.pending[bid]; !ok {
			delete(m.batches, bid)
		}
	}
}

// Build is a snapshot being built: BeginSnapshot starts it, and exactly
// one of EndSnapshot or AbortSnapshot ends it.
type Build struct {
	// mark is the revision after which Dispatches and Cancels change the
	// list the hub builds.
	mark uint64
	// Resync is set when this snapshot carries what a full queue did not
	// take.
	Resync bool
}

// BeginSnapshot starts building a snapshot. The hub lists the node's work
// after it, outside its lock; the Dispatches and Cancels taken from now on
// are reflected in that list by EndSnapshot.
func (m *Machine) BeginSnapshot() Build {
	b := Build{mark: m.rev}
	if m.first {
		// Counted since New; everything taken since is recent.
		m.first, b.mark = false, m.firstMark
	} else {
		m.builds++
	}
	if m.resync {
		// This snapshot carries what the full queue did not take: its
		// count moves to this build.
		m.resync, b.mark, b.Resync = false, min(b.mark, m.resyncMark), true
		m.builds--
	}
	return b
}

// EndSnapshot queues the snapshot of items, the node's work as listed
// since b began, changed by the Dispatches and Cancels taken since; items
// itself is not changed. Its revision is past every revision taken and
// past agentHas, the revision the agent says it holds. A snapshot that
// breaks the protocol (too large) is refused and uses up no revision.
func (m *Machine) EndSnapshot(b Build, items []*agentv1.WorkItem, agentHas uint64) (*agentv1.Envelope, error) {
	defer m.release()
	env, _, err := m.take(agentHas, func(rev uint64) *agentv1.Envelope {
		items = m.withRecent(items, b.mark)
		return &agentv1.Envelope{Revision: rev, Payload: &agentv1.Envelope_Snapshot{Snapshot: &agentv1.Snapshot{Items: items}}}
	})
	return env, err
}

// AbortSnapshot ends b without a snapshot (listing the work failed).
func (m *Machine) AbortSnapshot(Build) { m.release() }

func (m *Machine) release() {
	if m.builds--; m.builds == 0 {
		m.recent = nil
	}
}

// withRecent is items as changed by the Dispatch and Cancel envelopes taken
// after revision mark.
func (m *Machine) withRecent(items []*agentv1.WorkItem, mark uint64) []*agentv1.WorkItem {
	out := slices.Clone(items)
	for _, env := range m.recent {
		if env.GetRevision() <= mark {
			continue
		}
		switch p := env.GetPayload().(type) {
		case *agentv1.Envelope_Dispatch:
			uid := p.Dispatch.GetItem().GetUid()
			if !slices.ContainsFunc(out, func(it *agentv1.WorkItem) bool { return it.GetUid() == uid }) {
				out = append(out, p.Dispatch.GetItem())
			}
		case *agentv1.Envelope_Cancel:
			uid := p.Cancel.GetUid()
			out = slices.DeleteFunc(out, func(it *agentv1.WorkItem) bool { return it.GetUid() == uid })
		}
	}
	return out
}

// Received records the id of an envelope from the agent and reports
// whether it is new; false means a re-send, to be answered as a
// duplicate. Only the last SeenLimit ids are remembered.
func (m *Machine) Received(id string) bool { return m.seen.add(id) }

// Status is the verdict for an agent Status report at rev: Apply at the
// next revision (which it becomes), Duplicate or Stale before it, Gap
// after it (the agent must send its NodeState).
func (m *Machine) Status(rev uint64) protocol.Verdict { return m.agent.Step(rev) }

// NodeState is the verdict for an agent NodeState at rev, the agent's
// whole state: any newer one is applied.
func (m *Machine) NodeState(rev uint64) protocol.Verdict { return m.agent.Reset(rev) }

// AgentRevision is the last agent->hub revision applied.
func (m *Machine) AgentRevision() uint64 { return m.agent.Last() }
