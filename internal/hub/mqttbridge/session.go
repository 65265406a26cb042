package mqttbridge

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/mqtt/topics"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// maxUnacked bounds the envelopes one agent has not acked. An agent that
// falls this far behind loses its session and gets a snapshot on its next
// hello, as a gRPC agent does when its send queue fills.
const maxUnacked = 4096

// session is one agent session carried by the bridge: the hub's
// ServeSession, whose envelopes go to the node's dispatch topic and are
// published again until acked.
type session struct {
	b    *Bridge
	node string
	peer hub.Peer // node, with the key of its connection when the session opened
	id   string   // the agent's connection, from its hello

	ctx    context.Context
	cancel context.CancelFunc
	// end ends the session with a gRPC status that the agent is told on
	// its response topic (M5), as the bridge does when the agent has been
	// silent too long: a cancel alone ends the session without a word.
	end  context.CancelCauseFunc
	over chan struct{}

	// mu guards everything below.
	mu       sync.Mutex
	unacked  map[string]*outgoing
	lastSeen time.Time
}

// outgoing is an envelope waiting for the agent's ack.
type outgoing struct {
	env   *agentv1.Envelope
	data  []byte
	due   time.Time
	every time.Duration
}

func newSession(ctx context.Context, b *Bridge, p hub.Peer, id string) *session {
	s := &session{b: b, node: p.Node, peer: p, id: id, over: make(chan struct{}), unacked: map[string]*outgoing{}, lastSeen: b.opts.Clock.Now()}
	s.ctx, s.end = context.WithCancelCause(ctx)
	s.cancel = func() { s.end(nil) }
	return s
}

func (s *session) isOver() bool {
	select {
	case <-s.over:
		return true
	default:
		return false
	}
}

func (s *session) touch() {
	s.mu.Lock()
	s.lastSeen = s.b.opts.Clock.Now()
	s.mu.Unlock()
}

// run serves the session until the hub ends it, the agent is gone, or a
// newer hello replaces it. An end the agent did not cause is published on
// its response topic, so it reconnects (or stops, for a refusal).
func (s *session) run(req *agentv1.GetMessageRequest) {
	defer close(s.over)
	defer s.cancel()
	go s.resend()
	log := s.b.log.With("node", s.node, "session", s.id)
	log.Debug("agent session starts")
	err := s.b.hub.ServeSession(s.ctx, s.peer, req, s.send)
	if s.ctx.Err() != nil {
		// Ended by the bridge: a cancel (the agent is gone or said hello
		// again, the bridge stops) needs no word; a status must reach the
		// agent, or a stalled agent that resumes would wait for ever on a
		// session that is gone.
		cause, ok := status.FromError(context.Cause(s.ctx))
		if !ok {
			log.Debug("agent session ended", "err", err)
			return
		}
		err = cause.Err()
	}
	if err == nil {
		err = status.Error(codes.Aborted, "session ended")
	}
	st := status.Convert(err)
	log.Info("agent session ended by the hub", "code", st.Code().String(), "err", st.Message())
	s.b.respond(s.node, topics.Response{Session: s.id, Code: uint32(st.Code()), Error: st.Message()})
}

// send publishes env to the agent; envelopes with a revision are kept until acked.
func (s *session) send(env *agentv1.Envelope) error {
	data, err := protocol.Encode(env)
	if err != nil {
		return err
	}
	if env.GetRevision() > 0 {
		s.mu.Lock()
		if len(s.unacked) >= maxUnacked {
			s.mu.Unlock()
			return status.Errorf(codes.ResourceExhausted, "node %s has not acked %d messages; it gets a snapshot when it says hello again", s.node, maxUnacked)
		}
		every := s.b.opts.ResendAfter
		s.unacked[env.GetId()] = &outgoing{env: env, data: data, due: s.b.opts.Clock.Now().Add(every), every: every}
		s.mu.Unlock()
	}
	// Not waiting for the broker's PUBACK lets envelopes stream at the
	// broker's pace rather than one round trip each; the app-level ack and
	// re-sends are what make delivery sure.
	return s.b.publishAsync(s.ctx, s.b.layout.Dispatch(s.node), data)
}

// acked settles id. An acked snapshot settles everything sent before it too,
// as in the hub: it carried the node's whole state, and the agent does not
// ack what it skipped.
func (s *session) acked(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.unacked[id]
	if !ok {
		return
	}
	delete(s.unacked, id)
	if o.env.GetKind() != agentv1.Kind_KIND_SNAPSHOT {
		return
	}
	for k, p := range s.unacked {
		if p.env.GetRevision() < o.env.GetRevision() {
			delete(s.unacked, k)
		}
	}
}

// unackedCount is how many envelopes wait for the agent's ack.
func (s *session) unackedCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.unacked)
}

// resend publishes again what is due, oldest revision first, and ends a
// session whose agent has been silent for the hub's offline timeout (its
// connection died without a Last Will, e.g. the broker restarted).
func (s *session) resend() {
	tick := s.b.opts.Clock.NewTicker(min(s.b.opts.ResendAfter/4, 250*time.Millisecond))
	defer tick.Stop()
	idle := s.b.hub.OfflineTimeout()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-tick.Chan():
		}
		now := s.b.opts.Clock.Now()
		s.mu.Lock()
		silent := now.Sub(s.lastSeen)
		var due []*outgoing
		for _, o := range s.unacked {
			if !now.Before(o.due) {
				o.every = min(2*o.every, 30*time.Second)
				o.due = now.Add(o.every)
				due = append(due, o)
			}
		}
		s.mu.Unlock()
		if silent > idle {
			s.b.log.Info("agent silent for longer than the offline timeout; ending its mqtt session", "node", s.node, "silent", silent)
			// Told to the agent (run), should it be only stalled: it says
			// hello again rather than wait on a session that is gone.
			s.end(status.Errorf(codes.Aborted, "no word from node %s for %v, longer than the offline timeout (%v): its session ended; say hello again",
				s.node, silent.Round(time.Millisecond), idle))
			return
		}
		slices.SortFunc(due, func(a, b *outgoing) int { return cmp.Compare(a.env.GetRevision(), b.env.GetRevision()) })
		for _, o := range due {
			s.b.log.Debug("agent has not acked; publishing again", "node", s.node, "id", o.env.GetId(), "kind", o.env.GetKind().String(), "revision", o.env.GetRevision())
			s.b.metrics.resent.Inc()
			s.b.resent.Add(1)
			if err := s.b.publish(s.b.layout.Dispatch(s.node), o.data); err != nil && !errors.Is(err, context.Canceled) {
				s.b.log.Warn("cannot publish again", "node", s.node, "err", err)
			}
		}
	}
}
