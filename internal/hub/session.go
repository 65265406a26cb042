package hub

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/fleetnode"
	hubsession "github.com/drover-fleet/drover/internal/hub/session"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// session is one agent's open GetMessage stream on this hub: the shell
// around its hubsession.Machine, which holds the rules (queue, revisions,
// acks, snapshots, duplicates).
type session struct {
	node string
	// key is the hex SHA-256 of the public key the stream was opened with
	// (Peer.Key): calls of the node must come with the same one.
	key string
	// cert is Peer.Cert: the session ends when it expires or its CA is no
	// longer trusted (watchNodes).
	cert, root *x509.Certificate
	// features are the protocol features the agent named when it opened
	// the stream; fixed for the stream's life (Supports).
	features []string
	// addr is Peer.Addr: the IP the stream came from (Address).
	addr string
	// wake has room for one signal: an event that may give the stream
	// something to do (a queued envelope, a snapshot, a close) leaves one,
	// and the stream's goroutine asks the Machine what next.
	wake chan struct{}
	// done is closed once the Machine is: a log request waiting on the
	// stream gives up then.
	done chan struct{}

	mu     sync.Mutex // guards m and closed
	m      *hubsession.Machine
	closed bool // done is closed
}

// newSession starts a stream's bookkeeping. hubRev is the last hub->agent
// revision the agent applied: the stream's revisions continue from it, so
// that nothing sent before the first snapshot looks stale to the agent.
// features are those the agent named.
func newSession(p Peer, hubRev, agentRev uint64, features []string) *session {
	node := p.Node
	return &session{
		node: node,
		key:  p.Key,
		cert: p.Cert,
		root: p.Root,
		addr: p.Addr,
		// A copy: the request's slice is not ours to keep.
		features: slices.Clone(features),
		wake:     make(chan struct{}, 1),
		done:     make(chan struct{}),
		m: hubsession.New(hubsession.Config{
			Node: node, HubRevision: hubRev, AgentRevision: agentRev,
			Batching: slices.Contains(features, protocol.FeatureDispatchBatch),
		}),
	}
}

// step runs f on the Machine under s.mu and wakes the stream.
func (s *session) step(f func(m *hubsession.Machine)) {
	s.mu.Lock()
	f(s.m)
	// The Machine closes itself too (a snapshot meeting a full queue).
	if s.m.Reason() != "" && !s.closed {
		s.closed = true
		close(s.done)
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *session) close(reason string) {
	s.step(func(m *hubsession.Machine) { m.Close(reason) })
}

// send queues env, which carries no revision and is not acked (a log
// request).
func (s *session) send(env *agentv1.Envelope) (err error) {
	s.step(func(m *hubsession.Machine) { err = m.Send(env) })
	return err
}

// nodeFromPeer returns the node named by the verified client certificate,
// and its key. Only chains rooted at Drover's CA count: the listener also
// accepts certificates from the kube-apiserver's client CA, for operators,
// and whoever can get one of those signed must not pass for a node.
func (h *Hub) nodeFromPeer(ctx context.Context) (Peer, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return Peer{}, status.Error(codes.Unauthenticated, "no peer information")
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
		return Peer{}, status.Error(codes.Unauthenticated, "a node client certificate signed by Drover's CA is required; register with a bootstrap token first")
	}
	cert := chain[0]
	if pki.IsOperatorCert(cert) {
		return Peer{}, status.Error(codes.PermissionDenied, "an operator certificate is not a node certificate")
	}
	isNode := false
	for _, o := range cert.Subject.Organization {
		isNode = isNode || o == "drover:nodes"
	}
	if !isNode {
		return Peer{}, status.Error(codes.PermissionDenied, "certificate is not a node certificate")
	}
	return Peer{Node: cert.Subject.CommonName, Key: pki.KeyFingerprint(cert), Cert: cert, Root: chain[len(chain)-1], Addr: peerIP(p.Addr)}, nil
}

// peerIP is the IP of a connection's remote address, "" when it has none
// (a unix socket, an in-memory listener).
func peerIP(a net.Addr) string {
	if a == nil {
		return ""
	}
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP.String()
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return ""
	}
	return ap.Addr().Unmap().String()
}

// GetMessage implements AgentHub: the hub->agent stream.
func (h *Hub) GetMessage(req *agentv1.GetMessageRequest, stream grpc.ServerStreamingServer[agentv1.Envelope]) error {
	ctx := stream.Context()
	p, err := h.nodeFromPeer(ctx)
	if err != nil {
		return err
	}
	return h.ServeSession(ctx, p, req, stream.Send)
}

// ServeSession runs node p's session with this hub over any transport: it
// checks the node may connect (approved, not revoked, and p.Key the key
// its FleetNode was registered with), marks it Online, and calls send with every
// hub->agent envelope (a NodeConfiguration, a snapshot, then dispatches and
// cancels) until ctx ends, send fails, or the session is closed (a newer
// session of the node replaced it, the hub stops). The caller has
// authenticated p's certificate. Errors are gRPC statuses; a refusal that retrying
// cannot fix is Unauthenticated or PermissionDenied.
//
// send is called from this goroutine only, in revision order. Envelopes are
// settled by the agent's acks (HandleMessage); a transport that can lose
// messages re-sends what is not acked (the agent drops duplicates).
func (h *Hub) ServeSession(ctx context.Context, p Peer, req *agentv1.GetMessageRequest, send func(*agentv1.Envelope) error) error {
	node := p.Node
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
	// Before the stream replaces the node's open one: an old certificate
	// must not take a session over from the machine that holds the name now.
	if err := h.checkKey(ctx, &fn, p.Key); err != nil {
		h.log.Info("stream refused", "node", node, "keySHA256", p.Key, "reason", status.Convert(err).Message())
		return err
	}

	if !h.router.ready() {
		return status.Errorf(codes.Unavailable, "hub %s is starting: the work it dispatches is still loading; reconnect shortly", h.opts.Name)
	}
	if err := protocol.CheckFeatures(req.GetFeatures()); err != nil {
		return status.Errorf(codes.InvalidArgument, "node %s: %v", node, err)
	}
	s := newSession(p, req.GetLastRevision(), req.GetAgentRevision(), req.GetFeatures())
	now := h.opts.Clock.Now()
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

	h.markOnline(ctx, s, &fn, req, now)

	if err := send(protocol.NewNodeConfiguration(node, &agentv1.NodeConfiguration{
		HeartbeatSeconds: uint32(h.opts.HeartbeatInterval / time.Second),
		Hub:              h.opts.Name,
	})); err != nil {
		return err
	}
	if err := h.sendSnapshot(ctx, s, req.GetLastRevision()); err != nil {
		return err
	}
	for {
		if ctx.Err() != nil {
			return nil
		}
		s.mu.Lock()
		action, env := s.m.Next()
		reason := s.m.Reason()
		s.mu.Unlock()
		switch action {
		case hubsession.Send:
			if d := env.GetDispatch(); d != nil {
				h.metrics.batchItems.Observe(float64(1 + len(d.GetMore())))
			}
			if err := send(env); err != nil {
				return err
			}
		case hubsession.Resync:
			h.metrics.resyncs.Inc()
			if err := h.sendSnapshot(ctx, s, 0); err != nil {
				return err
			}
		case hubsession.Closed:
			return status.Error(codes.Aborted, reason)
		default:
			select {
			case <-s.wake:
			case <-ctx.Done():
				return nil
			}
		}
	}
}

// markOnline claims the node for this hub. Moving from another hub while
// Online is a hand-over, not a flap: the phase stays Online. fn is the node
// as read when the stream opened. The labels and capacity the agent reports
// go into the status only: the manager holds them against what was approved
// (internal/fleetnode).
func (h *Hub) markOnline(ctx context.Context, s *session, fn *fleetv1.FleetNode, req *agentv1.GetMessageRequest, now time.Time) {
	var c fleetnode.Change
	var wrote *fleetv1.FleetNode
	if h.writeStatus(ctx, fn.Name, "connect", func(n *fleetv1.FleetNode) bool {
		// A stream already replaced by a newer one must not write back
		// what the agent reported before.
		if !h.current(fn.Name, s) {
			return false
		}
		wrote, c = n, fleetnode.SetConnected(n, h.opts.Name, now, nodeInfo(req.GetInfo()))
		return c.Changed
	}) {
		h.nodeEvent(wrote, c.Event)
	}
}

// current reports whether s is node's open stream here (not one a newer
// stream of the node has replaced).
func (h *Hub) current(node string, s *session) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sessions[node] == s
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
	now := h.opts.Clock.Now()
	var c fleetnode.Change
	var wrote *fleetv1.FleetNode
	if h.writeStatus(ctx, node, "disconnect", func(n *fleetv1.FleetNode) bool {
		if h.Connected(node) {
			return false
		}
		wrote, c = n, fleetnode.SetDisconnected(n, h.opts.Name, now, h.opts.OfflineTimeout)
		return c.Changed
	}) {
		h.nodeEvent(wrote, c.Event)
	}
}

// sendSnapshot sends the node's whole desired state at a revision past what
// the agent holds, so the agent replaces its view.
func (h *Hub) sendSnapshot(ctx context.Context, s *session, agentHas uint64) error {
	// A Dispatch or Cancel may be taken while WorkFor runs, and the
	// WorkSource may not show it yet. The snapshot comes after it on the
	// stream, so it must show it (the Machine sees to that between
	// BeginSnapshot and EndSnapshot): the agent cancels a dispatched item
	// that the next snapshot leaves out.
	s.mu.Lock()
	b := s.m.BeginSnapshot()
	s.mu.Unlock()
	items, err := h.router.WorkFor(ctx, s.node)
	if err != nil {
		s.step(func(m *hubsession.Machine) { m.AbortSnapshot(b) })
		return status.Errorf(codes.Unavailable, "list work for node %s: %v", s.node, err)
	}
	var env *agentv1.Envelope
	s.step(func(m *hubsession.Machine) { env, err = m.EndSnapshot(b, items, agentHas) })
	if err != nil {
		if errors.Is(err, protocol.ErrMalformed) || errors.Is(err, protocol.ErrTooLarge) {
			// The WorkSource's list breaks the protocol: the node cannot be
			// synced until it changes. Retrying is all the agent can do.
			h.log.Error("cannot build a snapshot of the node's work", "node", s.node, "items", len(items), "err", err)
			return status.Errorf(codes.Internal, "hub %s cannot build the snapshot of node %s's work: %v", h.opts.Name, s.node, err)
		}
		return status.Errorf(codes.Aborted, "snapshot for node %s: %v", s.node, err)
	}
	h.metrics.dispatched.Add(float64(len(env.GetSnapshot().GetItems())))
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
	var err error
	s.step(func(m *hubsession.Machine) { _, _, err = m.Dispatch(item) })
	if err != nil {
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
	var err error
	s.step(func(m *hubsession.Machine) { _, _, err = m.Cancel(uid) })
	if err != nil {
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

// Supports reports whether node's stream on this hub was opened naming
// protocol feature (GetMessageRequest.features); false when node has no
// stream here. A reconnect may change the answer: an agent names its
// features anew on every stream.
func (h *Hub) Supports(node, feature string) bool {
	h.mu.Lock()
	s := h.sessions[node]
	h.mu.Unlock()
	return s != nil && slices.Contains(s.features, feature)
}

// Address is the IP address node's stream on this hub comes from (the
// node's address as this hub sees it); "" when node has no stream here or
// its transport does not tell (MQTT).
func (h *Hub) Address(node string) string {
	h.mu.Lock()
	s := h.sessions[node]
	h.mu.Unlock()
	if s == nil {
		return ""
	}
	return s.addr
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
	return s.m.Pending()
}

// SendMessage implements AgentHub: one agent->hub envelope.
func (h *Hub) SendMessage(ctx context.Context, env *agentv1.Envelope) (*agentv1.SendResponse, error) {
	p, err := h.nodeFromPeer(ctx)
	if err != nil {
		return nil, err
	}
	return h.HandleMessage(ctx, p, env)
}

// HandleMessage handles one envelope from node p, which the transport has
// authenticated, over any transport. It comes with the key of the node's
// open stream, or is refused: the stream's key was checked when it opened,
// so no API read is needed per message. Errors are gRPC statuses:
// InvalidArgument means the envelope will never be accepted.
func (h *Hub) HandleMessage(ctx context.Context, p Peer, env *agentv1.Envelope) (*agentv1.SendResponse, error) {
	node := p.Node
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
	if s != nil && p.Key != "" && p.Key != s.key {
		h.mu.Unlock()
		h.metrics.rejected.WithLabelValues("wrong-key").Inc()
		// The open stream's key passed checkKey: it is the registered one.
		return nil, keyMismatch(node)
	}
	known, back := false, false
	if s != nil {
		// A call without a stream proves nothing about the node's session.
		known, back = h.live.Heartbeat(node, h.opts.Clock.Now())
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
	s.mu.Lock()
	fresh := s.m.Received(env.GetId())
	s.mu.Unlock()
	if !fresh {
		h.metrics.duplicates.Inc()
		return &agentv1.SendResponse{Duplicate: true}, nil
	}
	h.metrics.received.WithLabelValues(kind).Inc()

	switch p := env.GetPayload().(type) {
	case *agentv1.Envelope_Heartbeat:
		return &agentv1.SendResponse{}, nil
	case *agentv1.Envelope_Ack:
		s.mu.Lock()
		s.m.Ack(env.GetAckOf(), p.Ack.GetMore()...)
		s.mu.Unlock()
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
		v := s.m.NodeState(env.GetRevision())
		s.mu.Unlock()
		if v != protocol.Apply {
			h.metrics.duplicates.Inc()
			return &agentv1.SendResponse{Duplicate: true}, nil
		}
		h.nodeState(ctx, node, p.NodeState.GetWork())
		rev := int64(env.GetRevision())
		h.writeStatus(ctx, node, "node-state", func(n *fleetv1.FleetNode) bool {
			// A report of a stream that has since been replaced (the
			// agent restarted while this call was under way) would write
			// back what the agent reported before: the new stream's
			// connect and NodeState have the say.
			if !h.current(node, s) {
				return false
			}
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
			v := s.m.Status(env.GetRevision() + uint64(i))
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
