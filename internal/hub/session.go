package hub

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// sendQueue bounds the envelopes waiting for one agent's stream. When it is
// full, Dispatches and Cancels are no longer queued: the stream sends a
// snapshot, which carries them, once the queue has drained (see resync).
const sendQueue = 256

// seenIDs bounds the per-session memory of envelope ids used to spot re-sends.
const seenIDs = 512

// session is one agent's open GetMessage stream on this hub.
type session struct {
	node string
	out  chan *agentv1.Envelope
	done chan struct{}
	// batching is set when the agent named protocol.FeatureDispatchBatch:
	// the stream then joins queued Dispatches into one envelope (gather).
	batching bool

	// mu guards everything below.
	mu      sync.Mutex
	reason  string
	rev     uint64                       // last hub->agent revision sent
	pending map[string]*agentv1.Envelope // sent, not acked yet
	// batches maps the id of a Dispatch that gather sent with more items
	// (the id of the first envelope it joined) to the ids of the other
	// envelopes it joined: the agent acks the sent envelope only, and that
	// settles them all.
	batches  map[string][]string
	seen     map[string]struct{}
	seenRing []string
	agent    *protocol.Tracker // agent->hub report revisions

	// While snapshots are being built (WorkFor runs unlocked), recent holds
	// the Dispatch and Cancel envelopes queued meanwhile, so that a snapshot
	// queued after them includes what they changed.
	snapshotting int
	recent       []*agentv1.Envelope
	// first is set until the session's first snapshot is built: Dispatch
	// and Cancel may queue envelopes as soon as the session exists, before
	// that snapshot (which follows them on the stream) starts, and it must
	// show them too. firstMark is the revision the stream started from.
	first     bool
	firstMark uint64
	// resync is set while the queue was full: what was not queued since
	// revision resyncMark (kept in recent) goes out in the next snapshot,
	// which the stream sends once its queue is empty.
	resync     bool
	resyncMark uint64
	// snap is a snapshot that met a full queue (a burst while it was
	// built): the stream sends it before what is queued, which it
	// supersedes (the agent acks those as stale).
	snap *agentv1.Envelope
}

// newSession starts a stream's bookkeeping. hubRev is the last hub->agent
// revision the agent applied: the stream's revisions continue from it, so
// that nothing sent before the first snapshot looks stale to the agent.
func newSession(node string, hubRev, agentRev uint64) *session {
	return &session{
		node:    node,
		out:     make(chan *agentv1.Envelope, sendQueue),
		done:    make(chan struct{}),
		rev:     hubRev,
		pending: map[string]*agentv1.Envelope{},
		batches: map[string][]string{},
		seen:    map[string]struct{}{},
		agent:   protocol.NewTracker(agentRev),
		// Counted as snapshotting from the start, so that what is queued
		// before the first snapshot is remembered for it.
		snapshotting: 1,
		first:        true,
		firstMark:    hubRev,
	}
}

func (s *session) close(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeLocked(reason)
}

func (s *session) closeLocked(reason string) {
	if s.reason != "" {
		return
	}
	s.reason = reason
	close(s.done)
}

// next queues the envelope that build makes with the session's next
// revision (past floor) and tracks it as pending. Taking the revision and
// queuing are one step under s.mu, so concurrent senders (Dispatch, Cancel,
// snapshots) put revisions on the stream in order: otherwise the agent would
// see gaps that are not there and ask for full syncs.
func (s *session) next(floor uint64, build func(rev uint64) *agentv1.Envelope) (*agentv1.Envelope, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reason != "" {
		return nil, fmt.Errorf("stream closed: %s", s.reason)
	}
	rev := max(s.rev, floor) + 1
	env := build(rev)
	// The agent ignores (and never acks) a malformed envelope, and its stream
	// breaks on an oversized one: refuse them here, where the caller learns why.
	if err := protocol.Validate(env); err != nil {
		return nil, err
	}
	if n := proto.Size(env); n > protocol.MaxEnvelopeBytes {
		return nil, fmt.Errorf("%s is %d bytes, more than the protocol's %d: %w", env.GetKind(), n, protocol.MaxEnvelopeBytes, protocol.ErrTooLarge)
	}
	s.rev = rev
	snapshot := env.GetKind() == agentv1.Kind_KIND_SNAPSHOT
	if !snapshot && !s.resync && len(s.out) == cap(s.out) && s.reason == "" {
		// Counted as snapshotting until the resync snapshot is built, so
		// that recent keeps what it must carry.
		s.resync, s.resyncMark = true, rev-1
		s.snapshotting++
	}
	if !snapshot && s.resync {
		s.recent = append(s.recent, env)
		return env, nil
	}
	if err := s.pushLocked(env); err != nil {
		return nil, err
	}
	if s.snapshotting > 0 && !snapshot {
		s.recent = append(s.recent, env)
	}
	return env, nil
}

// send queues env, which carries no revision and is not acked (a log
// request), without tracking it as pending.
func (s *session) send(env *agentv1.Envelope) error {
	if err := protocol.Validate(env); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reason != "" {
		return fmt.Errorf("stream closed: %s", s.reason)
	}
	select {
	case s.out <- env:
		return nil
	default:
		return errors.New("the node's send queue is full; try again")
	}
}

// withRecentLocked is items as changed by the Dispatch and Cancel envelopes
// queued after revision mark; items itself is not changed. s.mu is held.
func (s *session) withRecentLocked(items []*agentv1.WorkItem, mark uint64) []*agentv1.WorkItem {
	out := slices.Clone(items)
	for _, env := range s.recent {
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

// pushLocked queues env for the stream without blocking and tracks it as
// pending. s.mu is held.
func (s *session) pushLocked(env *agentv1.Envelope) error {
	if s.reason != "" {
		// A closed session's queue is never sent: say so.
		return fmt.Errorf("stream closed: %s", s.reason)
	}
	select {
	case s.out <- env:
		s.pending[env.GetId()] = env
		return nil
	default:
	}
	// Only a snapshot meets a full queue (the rest wait for resync). It
	// carries the node's whole state at a later revision than anything
	// queued, so it may go first.
	if env.GetKind() != agentv1.Kind_KIND_SNAPSHOT || s.snap != nil {
		s.closeLocked("send queue full")
		return errors.New("send queue full; the agent will resync on reconnect")
	}
	s.snap = env
	s.pending[env.GetId()] = env
	return nil
}

// takeSnap returns a snapshot waiting to go ahead of the queue, if any.
func (s *session) takeSnap() *agentv1.Envelope {
	s.mu.Lock()
	defer s.mu.Unlock()
	env := s.snap
	s.snap = nil
	return env
}

// needsResync reports whether the queue was full and has drained since: the
// stream sends a snapshot before anything else.
func (s *session) needsResync() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resync && len(s.out) == 0
}

// ack forgets the acked envelope id. An acked snapshot also settles every
// envelope sent before it: the snapshot carried the node's whole state, and
// the agent never acks what a gap made it skip.
func (s *session) ack(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, joined := range s.batches[id] {
		delete(s.pending, joined)
	}
	delete(s.batches, id)
	env, ok := s.pending[id]
	if !ok {
		return
	}
	delete(s.pending, id)
	if env.GetKind() != agentv1.Kind_KIND_SNAPSHOT {
		return
	}
	for pid, p := range s.pending {
		if p.GetRevision() < env.GetRevision() {
			delete(s.pending, pid)
		}
	}
	// A batch whose first envelope the snapshot settled was sent before
	// it, and so were the others it joined.
	for bid := range s.batches {
		if _, ok := s.pending[bid]; !ok {
			delete(s.batches, bid)
		}
	}
}

// gather joins first, a Dispatch taken from the stream's queue, and the
// Dispatches queued right behind it at the revisions that follow into one
// Dispatch envelope (item and more), within MaxDispatchBatch items and
// MaxEnvelopeBytes. It returns the envelope to send and the one it took
// from the queue but could not join (nil if none), which goes next. The
// joined envelopes stay pending under their own ids until the agent acks
// the one sent, which carries first's id. Only what is already queued is
// joined: a lone Dispatch goes at once, as before.
func (s *session) gather(first *agentv1.Envelope) (send, next *agentv1.Envelope) {
	d := first.GetDispatch()
	if d == nil || len(d.GetMore()) > 0 {
		return first, nil
	}
	items := []*agentv1.WorkItem{d.GetItem()}
	var joined []string
	// Each envelope joined adds less than its own encoding (its item
	// without the envelope's id, node and revision), so the sum bounds the
	// batch's size.
	size := proto.Size(first)
take:
	for len(items) < protocol.MaxDispatchBatch {
		select {
		case e := <-s.out:
			ed := e.GetDispatch()
			if ed == nil || len(ed.GetMore()) > 0 || e.GetRevision() != first.GetRevision()+uint64(len(items)) {
				next = e
				break take
			}
			n := proto.Size(e)
			if size+n > protocol.MaxEnvelopeBytes {
				next = e
				break take
			}
			size += n
			items = append(items, ed.GetItem())
			joined = append(joined, e.GetId())
		default:
			break take
		}
	}
	if len(joined) == 0 {
		return first, next
	}
	send = protocol.NewDispatches(s.node, first.GetRevision(), items)
	send.Id = first.GetId()
	s.mu.Lock()
	s.batches[send.GetId()] = joined
	s.mu.Unlock()
	return send, next
}

// firstSeen records id and reports whether it is new.
func (s *session) firstSeen(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.seen[id]; dup {
		return false
	}
	s.seen[id] = struct{}{}
	s.seenRing = append(s.seenRing, id)
	if len(s.seenRing) > seenIDs {
		delete(s.seen, s.seenRing[0])
		s.seenRing = s.seenRing[1:]
	}
	return true
}

// nodeFromPeer returns the node named by the verified client certificate.
// Only chains rooted at Drover's CA count: the listener also accepts
// certificates from the kube-apiserver's client CA, for operators, and
// whoever can get one of those signed must not pass for a node.
func (h *Hub) nodeFromPeer(ctx context.Context) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", status.Error(codes.Unauthenticated, "no peer information")
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	var chain []*x509.Certificate
	if ok {
		for _, c := range ti.State.VerifiedChains {
			if h.rootedAtDrover(c) {
				chain = c
				break
			}
		}
	}
	if len(chain) == 0 {
		return "", status.Error(codes.Unauthenticated, "a node client certificate signed by Drover's CA is required; register with a bootstrap token first")
	}
	cert := chain[0]
	isNode := false
	for _, o := range cert.Subject.Organization {
		isNode = isNode || o == "drover:nodes"
	}
	if !isNode {
		return "", status.Error(codes.PermissionDenied, "certificate is not a node certificate")
	}
	return cert.Subject.CommonName, nil
}

// GetMessage implements AgentHub: the hub->agent stream.
func (h *Hub) GetMessage(req *agentv1.GetMessageRequest, stream grpc.ServerStreamingServer[agentv1.Envelope]) error {
	ctx := stream.Context()
	node, err := h.nodeFromPeer(ctx)
	if err != nil {
		return err
	}
	return h.ServeSession(ctx, node, req, stream.Send)
}

// ServeSession runs node's session with this hub over any transport: it
// checks the node may connect, marks it Online, and calls send with every
// hub->agent envelope (a NodeConfiguration, a snapshot, then dispatches and
// cancels) until ctx ends, send fails, or the session is closed (a newer
// session of the node replaced it, the hub stops). The caller has
// authenticated node. Errors are gRPC statuses; a refusal that retrying
// cannot fix is Unauthenticated or PermissionDenied.
//
// send is called from this goroutine only, in revision order. Envelopes are
// settled by the agent's acks (HandleMessage); a transport that can lose
// messages re-sends what is not acked (the agent drops duplicates).
func (h *Hub) ServeSession(ctx context.Context, node string, req *agentv1.GetMessageRequest, send func(*agentv1.Envelope) error) error {
	if err := validateInfo(req.GetInfo()); err != nil {
		return status.Errorf(codes.InvalidArgument, "node %s: %v", node, err)
	}
	var fn fleetv1.FleetNode
	if err := h.opts.APIReader.Get(ctx, client.ObjectKey{Name: node}, &fn); err != nil {
		if apierrors.IsNotFound(err) {
			return status.Errorf(codes.Unauthenticated, "node %s is not registered (its FleetNode was deleted); register again with a bootstrap token", node)
		}
		return status.Errorf(codes.Unavailable, "look up node %s: %v", node, err)
	}
	if fn.Spec.Revoked {
		return status.Errorf(codes.PermissionDenied, "node %s is revoked", node)
	}
	if !fn.Spec.Approved {
		return status.Errorf(codes.PermissionDenied, "node %s is not approved: run `drover approve %s`", node, node)
	}

	if !h.router.ready() {
		return status.Errorf(codes.Unavailable, "hub %s is starting: the work it dispatches is still loading; reconnect shortly", h.opts.Name)
	}
	if err := protocol.CheckFeatures(req.GetFeatures()); err != nil {
		return status.Errorf(codes.InvalidArgument, "node %s: %v", node, err)
	}
	s := newSession(node, req.GetLastRevision(), req.GetAgentRevision())
	s.batching = slices.Contains(req.GetFeatures(), protocol.FeatureDispatchBatch)
	now := h.opts.Now()
	h.mu.Lock()
	old := h.sessions[node]
	h.sessions[node] = s
	h.live.Connected(node, now)
	delete(h.wasReady, node)
	h.metrics.sessions.Set(float64(len(h.sessions)))
	h.mu.Unlock()
	if old != nil {
		old.close("replaced by a newer stream from the same node")
	}
	defer func() {
		h.mu.Lock()
		last := h.sessions[node] == s
		if last {
			delete(h.sessions, node)
			h.live.Disconnected(node)
		}
		h.metrics.sessions.Set(float64(len(h.sessions)))
		h.mu.Unlock()
		s.close("stream ended")
		if last && !h.stopping.Load() {
			h.markDisconnected(context.WithoutCancel(ctx), node)
		}
	}()

	h.markOnline(ctx, &fn, req, now)

	if err := send(protocol.NewNodeConfiguration(node, &agentv1.NodeConfiguration{
		HeartbeatSeconds: uint32(h.opts.HeartbeatInterval / time.Second),
		Hub:              h.opts.Name,
	})); err != nil {
		return err
	}
	if err := h.sendSnapshot(ctx, s, req.GetLastRevision()); err != nil {
		return err
	}
	// next is an envelope gather took from the queue but could not join:
	// it goes before anything else.
	var next *agentv1.Envelope
	forward := func(env *agentv1.Envelope) error {
		if s.batching {
			env, next = s.gather(env)
		}
		if d := env.GetDispatch(); d != nil {
			h.metrics.batchItems.Observe(float64(1 + len(d.GetMore())))
		}
		return send(env)
	}
	for {
		if env := next; env != nil {
			next = nil
			if err := forward(env); err != nil {
				return err
			}
			continue
		}
		if snap := s.takeSnap(); snap != nil {
			if err := send(snap); err != nil {
				return err
			}
			continue
		}
		if s.needsResync() {
			h.metrics.resyncs.Inc()
			if err := h.sendSnapshot(ctx, s, 0); err != nil {
				return err
			}
			continue
		}
		select {
		case env := <-s.out:
			if err := forward(env); err != nil {
				return err
			}
		case <-s.done:
			s.mu.Lock()
			reason := s.reason
			s.mu.Unlock()
			return status.Error(codes.Aborted, reason)
		case <-ctx.Done():
			return nil
		}
	}
}

// markOnline claims the node for this hub. Moving from another hub while
// Online is a hand-over, not a flap: the phase stays Online. fn is the node
// as read when the stream opened. Labels the agent reports differently from
// before are written first, in a patch of the node (status writes cannot
// change metadata); that costs a second write only when they changed.
func (h *Hub) markOnline(ctx context.Context, fn *fleetv1.FleetNode, req *agentv1.GetMessageRequest, now time.Time) {
	node := fn.Name
	latest := h.patchLabels(ctx, fn, req.GetInfo())
	var wrote *fleetv1.FleetNode
	announce := false
	if h.writeStatusOn(ctx, node, latest, "connect", func(n *fleetv1.FleetNode) bool {
		wrote = n
		// Announced when it was not Ready here: a first connect, a return,
		// a move from another hub.
		announce = n.Status.Hub != h.opts.Name || !meta.IsStatusConditionTrue(n.Status.Conditions, fleetv1.ReadyCondition)
		reason, msg := fleetv1.ReasonConnected, "connected to hub "+h.opts.Name
		if n.Status.Phase == fleetv1.FleetNodeOnline && n.Status.Hub != "" && n.Status.Hub != h.opts.Name {
			reason, msg = fleetv1.ReasonMovedHub, fmt.Sprintf("moved from hub %s to hub %s", n.Status.Hub, h.opts.Name)
		}
		setReady(n, true, reason, msg, now)
		n.Status.Hub = h.opts.Name
		t := metav1.NewTime(now.Truncate(time.Second))
		n.Status.ConnectedTime = &t
		n.Status.LastHeartbeatTime = &t
		n.Status.ObservedGeneration = n.Generation
		applyInfo(n, req.GetInfo())
		return true
	}) && announce {
		c := meta.FindStatusCondition(wrote.Status.Conditions, fleetv1.ReadyCondition)
		h.nodeEvent(wrote, corev1.EventTypeNormal, c.Reason, c.Message)
	}
}

// markDisconnected says on the FleetNode that its stream to this hub ended:
// Ready Unknown, reason Disconnected, the phase still Online (the liveness
// tracker makes it Offline after the offline timeout). The scheduler places
// nothing new on it meanwhile. Nothing is written if the node has a stream
// again, here or on another hub (the status names that hub): the
// optimistic lock makes a reconnect's write and this one see each other.
func (h *Hub) markDisconnected(ctx context.Context, node string) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	now := h.opts.Now()
	var wrote *fleetv1.FleetNode
	if h.writeStatus(ctx, node, "disconnect", func(n *fleetv1.FleetNode) bool {
		wrote = n
		if h.Connected(node) || n.Status.Hub != h.opts.Name || n.Status.Phase != fleetv1.FleetNodeOnline {
			return false
		}
		c := meta.FindStatusCondition(n.Status.Conditions, fleetv1.ReadyCondition)
		if c != nil && c.Status == metav1.ConditionUnknown {
			return false
		}
		meta.SetStatusCondition(&n.Status.Conditions, metav1.Condition{
			Type: fleetv1.ReadyCondition, Status: metav1.ConditionUnknown, Reason: fleetv1.ReasonDisconnected,
			Message: fmt.Sprintf("the agent's stream to hub %s ended at %s; Offline after %s unless it reconnects",
				h.opts.Name, now.UTC().Format(time.RFC3339), h.opts.OfflineTimeout),
			ObservedGeneration: n.Generation, LastTransitionTime: metav1.NewTime(now),
		})
		return true
	}) {
		h.nodeEvent(wrote, corev1.EventTypeNormal, fleetv1.ReasonDisconnected, readyMessage(wrote))
	}
}

// sendSnapshot sends the node's whole desired state at a revision past what
// the agent holds, so the agent replaces its view.
func (h *Hub) sendSnapshot(ctx context.Context, s *session, agentHas uint64) error {
	// A Dispatch or Cancel may be queued while WorkFor runs, and the
	// WorkSource may not show it yet. The snapshot comes after it on the
	// stream, so it must show it: the agent cancels a dispatched item that
	// the next snapshot leaves out.
	s.mu.Lock()
	mark := s.rev
	if s.first {
		// Counted since newSession; everything queued since is recent.
		s.first, mark = false, s.firstMark
	} else {
		s.snapshotting++
	}
	if s.resync {
		// This snapshot carries what the full queue did not take.
		s.resync, mark = false, min(mark, s.resyncMark)
		s.snapshotting--
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if s.snapshotting--; s.snapshotting == 0 {
			s.recent = nil
		}
		s.mu.Unlock()
	}()
	items, err := h.router.WorkFor(ctx, s.node)
	if err != nil {
		return status.Errorf(codes.Unavailable, "list work for node %s: %v", s.node, err)
	}
	if _, err := s.next(agentHas, func(rev uint64) *agentv1.Envelope {
		items = s.withRecentLocked(items, mark)
		return protocol.NewSnapshot(s.node, rev, items)
	}); err != nil {
		if errors.Is(err, protocol.ErrMalformed) || errors.Is(err, protocol.ErrTooLarge) {
			// The WorkSource's list breaks the protocol: the node cannot be
			// synced until it changes. Retrying is all the agent can do.
			h.log.Error("cannot build a snapshot of the node's work", "node", s.node, "items", len(items), "err", err)
			return status.Errorf(codes.Internal, "hub %s cannot build the snapshot of node %s's work: %v", h.opts.Name, s.node, err)
		}
		return status.Errorf(codes.Aborted, "snapshot for node %s: %v", s.node, err)
	}
	h.metrics.dispatched.Add(float64(len(items)))
	return nil
}

// Dispatch sends one work item to a node connected to this hub. The item is
// re-sent (as part of a snapshot) if the agent reconnects before acking it.
func (h *Hub) Dispatch(node string, item *agentv1.WorkItem) error {
	h.mu.Lock()
	s := h.sessions[node]
	h.mu.Unlock()
	if s == nil {
		return fmt.Errorf("dispatch %s to node %s: node is not connected to hub %s", item.GetUid(), node, h.opts.Name)
	}
	if _, err := s.next(0, func(rev uint64) *agentv1.Envelope { return protocol.NewDispatch(node, rev, item) }); err != nil {
		return fmt.Errorf("dispatch %s to node %s: %w", item.GetUid(), node, err)
	}
	h.metrics.dispatched.Inc()
	return nil
}

// Cancel asks a node connected to this hub to stop work item uid: a Pending
// item never runs, a running one has its runner's context cancelled, and the
// agent reports it Cancelled unless it had already ended. A node that misses
// it (reconnects first) cancels the item when the snapshot it gets from the
// WorkSource no longer lists it.
func (h *Hub) Cancel(node, uid string) error {
	h.mu.Lock()
	s := h.sessions[node]
	h.mu.Unlock()
	if s == nil {
		return fmt.Errorf("cancel %s on node %s: node is not connected to hub %s", uid, node, h.opts.Name)
	}
	if _, err := s.next(0, func(rev uint64) *agentv1.Envelope { return protocol.NewCancel(node, rev, uid) }); err != nil {
		return fmt.Errorf("cancel %s on node %s: %w", uid, node, err)
	}
	return nil
}

// Connected reports whether node has a stream open on this hub.
func (h *Hub) Connected(node string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.sessions[node]
	return ok
}

// Pending returns how many envelopes node has not acked yet.
func (h *Hub) Pending(node string) int {
	h.mu.Lock()
	s := h.sessions[node]
	h.mu.Unlock()
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending)
}

// SendMessage implements AgentHub: one agent->hub envelope.
func (h *Hub) SendMessage(ctx context.Context, env *agentv1.Envelope) (*agentv1.SendResponse, error) {
	node, err := h.nodeFromPeer(ctx)
	if err != nil {
		return nil, err
	}
	return h.HandleMessage(ctx, node, env)
}

// HandleMessage handles one envelope from node, which the transport has
// authenticated, over any transport. Errors are gRPC statuses:
// InvalidArgument means the envelope will never be accepted.
func (h *Hub) HandleMessage(ctx context.Context, node string, env *agentv1.Envelope) (*agentv1.SendResponse, error) {
	if n := proto.Size(env); n > protocol.MaxEnvelopeBytes {
		h.metrics.rejected.WithLabelValues("too-large").Inc()
		return nil, status.Errorf(codes.InvalidArgument, "envelope %q is %d bytes, more than the protocol's %d: %v",
			clip(env.GetId()), n, protocol.MaxEnvelopeBytes, protocol.ErrTooLarge)
	}
	if err := protocol.Validate(env); err != nil {
		h.metrics.rejected.WithLabelValues("malformed").Inc()
		return nil, status.Errorf(codes.InvalidArgument, "%v", err)
	}
	if env.GetNode() != node {
		h.metrics.rejected.WithLabelValues("wrong-node").Inc()
		return nil, status.Errorf(codes.PermissionDenied, "node %s may not send as node %s", node, env.GetNode())
	}
	h.mu.Lock()
	s := h.sessions[node]
	known, back := false, false
	if s != nil {
		// A call without a stream proves nothing about the node's session.
		known, back = h.live.Heartbeat(node, h.opts.Now())
	}
	h.mu.Unlock()
	if s == nil || !known {
		return nil, status.Errorf(codes.FailedPrecondition, "node %s has no open stream on hub %s; open GetMessage first", node, h.opts.Name)
	}
	if back && h.markResponding(ctx, node) {
		// Rare (after a silence): written before the answer, so that the
		// node is schedulable again once its agent hears back.
		h.mu.Lock()
		h.live.Responding(node)
		h.mu.Unlock()
	}
	kind := env.GetKind().String()
	// A heartbeat changes nothing twice, so its id is not remembered: at
	// one per node per 30 s, remembering them is most of a hub's memory
	// after a few hours.
	if env.GetKind() == agentv1.Kind_KIND_HEARTBEAT {
		h.metrics.received.WithLabelValues(kind).Inc()
		return &agentv1.SendResponse{}, nil
	}
	// Log chunks are not state: neither remembered nor ordered by revision.
	if c := env.GetLogChunk(); c != nil {
		h.metrics.received.WithLabelValues(kind).Inc()
		return h.deliverLog(ctx, node, c)
	}
	if !s.firstSeen(env.GetId()) {
		h.metrics.duplicates.Inc()
		return &agentv1.SendResponse{Duplicate: true}, nil
	}
	h.metrics.received.WithLabelValues(kind).Inc()

	switch p := env.GetPayload().(type) {
	case *agentv1.Envelope_Heartbeat:
		return &agentv1.SendResponse{}, nil
	case *agentv1.Envelope_Ack:
		s.ack(env.GetAckOf())
		for _, id := range p.Ack.GetMore() {
			s.ack(id)
		}
		h.metrics.acked.Add(float64(1 + len(p.Ack.GetMore())))
		return &agentv1.SendResponse{}, nil
	case *agentv1.Envelope_FullSyncRequest:
		if err := h.sendSnapshot(ctx, s, p.FullSyncRequest.GetHaveRevision()); err != nil {
			return nil, err
		}
		return &agentv1.SendResponse{}, nil
	case *agentv1.Envelope_NodeState:
		// A NodeState is the agent's whole state: any newer one replaces what we have.
		s.mu.Lock()
		v := s.agent.Reset(env.GetRevision())
		s.mu.Unlock()
		if v != protocol.Apply {
			h.metrics.duplicates.Inc()
			return &agentv1.SendResponse{Duplicate: true}, nil
		}
		h.nodeState(ctx, node, p.NodeState.GetWork())
		rev := int64(env.GetRevision())
		h.writeStatus(ctx, node, "node-state", func(n *fleetv1.FleetNode) bool {
			changed := applyInfo(n, p.NodeState.GetInfo())
			if n.Status.AgentRevision != rev {
				n.Status.AgentRevision, changed = rev, true
			}
			return changed
		})
		return &agentv1.SendResponse{}, nil
	case *agentv1.Envelope_Status:
		// Work statuses at consecutive revisions from the envelope's (one
		// for a plain report, a run of them for a batch): the new ones are
		// applied in order, repeats skipped, and a gap stops the run.
		works := append([]*agentv1.WorkStatus{p.Status.GetWork()}, p.Status.GetMore()...)
		applied := 0
		for i, w := range works {
			s.mu.Lock()
			v := s.agent.Step(env.GetRevision() + uint64(i))
			s.mu.Unlock()
			switch v {
			case protocol.Apply:
				h.log.Debug("work status", "node", node, "uid", w.GetUid(), "phase", w.GetPhase())
				h.workStatus(ctx, node, w)
				applied++
			case protocol.Gap:
				return &agentv1.SendResponse{FullSyncRequired: true}, nil
			}
		}
		if applied == 0 {
			h.metrics.duplicates.Inc()
			return &agentv1.SendResponse{Duplicate: true}, nil
		}
		return &agentv1.SendResponse{}, nil
	default:
		h.metrics.rejected.WithLabelValues("unexpected-kind").Inc()
		return nil, status.Errorf(codes.InvalidArgument, "envelope %s: kind %s is not sent by agents", env.GetId(), kind)
	}
}

// clip shortens an id an agent sent before it goes into an error message.
func clip(id string) string {
	const max = protocol.MaxIDBytes
	if len(id) > max {
		return id[:max] + "..."
	}
	return id
}

func (h *Hub) closeAllSessions() {
	h.mu.Lock()
	ss := make([]*session, 0, len(h.sessions))
	for _, s := range h.sessions {
		ss = append(ss, s)
	}
	h.mu.Unlock()
	for _, s := range ss {
		s.close("hub shutting down")
	}
}
