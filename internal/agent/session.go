package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/store"
	"github.com/drover-fleet/drover/internal/task/taskwire"
)

// callTimeout bounds one SendMessage call.
const callTimeout = 15 * time.Second

// helloTimeout bounds the wait for the hub's first envelope of a session.
const helloTimeout = time.Minute

// session runs one stream to hub until it fails or ctx ends.
func (a *Agent) session(ctx context.Context, hub string) error {
	client, conn, err := a.opts.Connect(ctx, hub, a.tlsConfig(hub))
	if err != nil {
		return classify(hub, err)
	}
	defer conn.Close()

	hubRev, err := a.db.HubRevision(ctx)
	if err != nil {
		return err
	}
	acked, err := a.ackedRevision(ctx)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Features name the protocol extensions this agent understands: the
	// hub uses them only with agents that name them. taskwire.FeatureRunAs:
	// this agent runs tasks as their securityContext's user.
	stream, err := client.GetMessage(ctx, &agentv1.GetMessageRequest{LastRevision: hubRev, AgentRevision: acked, Info: a.info(),
		Features: []string{protocol.FeatureDispatchBatch, taskwire.FeatureRunAs}})
	if err != nil {
		return classify(hub, err)
	}
	// The first message proves the hub accepted us; only then is this hub
	// "ours". It comes at once from a hub that took the session: without
	// it (over MQTT, a hello no hub answers) the agent tries again.
	stopUnanswered := afterFunc(a.opts.Clock, helloTimeout, cancel)
	first, err := stream.Recv()
	if !stopUnanswered() {
		return fmt.Errorf("hub %s: no answer to the session's hello within %v (over MQTT: check that --mqtt-prefix is the hub's, "+
			"and that the broker's ACL lets this node publish under it)", hub, helloTimeout)
	}
	if err != nil {
		return classify(hub, err)
	}
	a.mu.Lock()
	a.hub, a.client = hub, client
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		if a.client == client {
			a.client = nil
		}
		a.mu.Unlock()
	}()
	if a.identity().Hub != hub {
		if err := a.changeIdentity(ctx, func(id *store.Identity) { id.Hub = hub }); err != nil {
			return err
		}
	}
	a.log.Info("connected", "hub", hub, "hubRevision", hubRev, "agentRevision", acked)
	a.setConnected(true)
	a.opts.Metrics.sessionUp(hub, true)
	defer a.opts.Metrics.sessionUp(hub, false)
	defer a.setConnected(false)
	if _, err := a.reportNodeState(ctx); err != nil {
		return err
	}

	tracker := protocol.NewTracker(hubRev)
	g, ctx := errgroup.WithContext(ctx)
	// The stream lives on the session's context, which the group's does
	// not end: when a heartbeat or report fails (no answer within
	// callTimeout, or refused: the hub ended the session) the reader would
	// wait in Recv for ever, and so would g.Wait. Over MQTT nothing else
	// breaks the stream. End it with the group.
	defer context.AfterFunc(ctx, cancel)()
	// The reader only receives, so that envelopes that arrive while a run
	// of them is being applied wait here and are applied (and acked)
	// together, in one DB transaction, rather than one sync each.
	inbox := make(chan *agentv1.Envelope, protocol.MaxAckIDs)
	g.Go(func() error {
		defer close(inbox)
		for {
			env, err := stream.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					return fmt.Errorf("hub %s closed the stream", hub)
				}
				return classify(hub, err)
			}
			select {
			case inbox <- env:
			case <-ctx.Done():
				return nil
			}
		}
	})
	g.Go(func() error {
		batch := []*agentv1.Envelope{first}
		for {
		drain:
			for len(batch) < protocol.MaxAckIDs {
				select {
				case env, ok := <-inbox:
					if !ok {
						break drain
					}
					batch = append(batch, env)
				default:
					break drain
				}
			}
			if err := a.handleBatch(ctx, client, tracker, batch); err != nil {
				return err
			}
			batch = batch[:0]
			env, ok := <-inbox
			if !ok {
				return nil // the reader ended, and says why
			}
			batch = append(batch, env)
		}
	})
	g.Go(func() error { return a.heartbeats(ctx, client) })
	g.Go(func() error { return a.flushOutbox(ctx, client) })
	return g.Wait()
}

// connectGRPC is the default Connector.
func connectGRPC(_ context.Context, hub string, cfg *tls.Config) (agentv1.AgentHubClient, io.Closer, error) {
	conn, err := dial(hub, cfg)
	if err != nil {
		return nil, nil, err
	}
	return agentv1.NewAgentHubClient(conn), conn, nil
}

// classify turns refusals that retrying cannot fix into FatalErrors.
func classify(hub string, err error) error {
	switch status.Code(err) {
	case codes.Unauthenticated, codes.PermissionDenied:
		return &FatalError{fmt.Errorf("hub %s refused this node: %s", hub, status.Convert(err).Message())}
	}
	return fmt.Errorf("hub %s: %w", hub, err)
}

// ackedRevision is the highest agent report revision the hub has acknowledged:
// everything after it is still in the outbox and will be re-sent.
func (a *Agent) ackedRevision(ctx context.Context) (uint64, error) {
	rev, err := a.db.AgentRevision(ctx)
	if err != nil {
		return 0, err
	}
	pending, err := a.db.Pending(ctx, math.MaxInt32)
	if err != nil {
		return 0, err
	}
	for _, m := range pending {
		env, err := protocol.Decode(m.Data)
		if err != nil || env.GetRevision() == 0 {
			continue
		}
		return min(rev, env.GetRevision()-1), nil
	}
	return rev, nil
}

// afterFunc is time.AfterFunc on clk: f runs on a goroutine of its own once
// d has passed, unless stop comes first. stop reports whether it did; the
// goroutine ends with it either way.
func afterFunc(clk clock.Clock, d time.Duration, f func()) (stop func() bool) {
	t := clk.NewTimer(d)
	stopped := make(chan struct{})
	go func() {
		select {
		case <-t.Chan():
			f()
		case <-stopped:
		}
	}()
	return func() bool {
		ok := t.Stop()
		close(stopped)
		return ok
	}
}

func (a *Agent) heartbeats(ctx context.Context, client agentv1.AgentHubClient) error {
	for {
		a.mu.Lock()
		every := a.heartbeat
		a.mu.Unlock()
		if err := a.sleep(ctx, every); err != nil {
			return nil
		}
		if _, err := a.call(ctx, client, protocol.NewHeartbeat(a.opts.Node)); err != nil {
			return fmt.Errorf("heartbeat: %w", err)
		}
	}
}

func (a *Agent) call(ctx context.Context, client agentv1.AgentHubClient, env *agentv1.Envelope) (*agentv1.SendResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	return client.SendMessage(ctx, env)
}

// sendBatch sends msgs in order, each once the last is accepted (the hub
// orders reports by revision), and removes the accepted ones from the outbox
// in one commit at the end, or when a send fails: a crash before that
// re-sends them, which the hub recognises as repeats.
func (a *Agent) sendBatch(ctx context.Context, client agentv1.AgentHubClient, msgs []store.OutMsg, covered *uint64) (err error) {
	done := make([]string, 0, len(msgs))
	defer func() {
		if ackErr := a.db.Ack(context.WithoutCancel(ctx), done...); ackErr != nil && err == nil {
			err = ackErr
		}
	}()
	sending := make([]string, 0, len(msgs))
	for _, m := range msgs {
		sending = append(sending, m.ID)
	}
	_ = a.db.MarkAttempt(ctx, sending...)
	alone := 0 // messages before this index go alone: a batch of them was refused
	for i := 0; i < len(msgs); {
		start := i
		m := msgs[i]
		i++
		env, err := protocol.Decode(m.Data)
		if err != nil {
			a.log.Error("dropping undecodable outbox message", "id", m.ID, "err", err)
			done = append(done, m.ID)
			continue
		}
		if env.GetKind() == agentv1.Kind_KIND_STATUS && env.GetRevision() < *covered {
			done = append(done, m.ID)
			continue
		}
		ids := []string{m.ID}
		if env.GetKind() == agentv1.Kind_KIND_STATUS && len(env.GetStatus().GetMore()) == 0 && start >= alone {
			// Reports at the next revisions go along in one envelope: one
			// round trip (and, over MQTT, one publish and one answer) for
			// the run rather than one each.
			works := []*agentv1.WorkStatus{env.GetStatus().GetWork()}
			size := len(m.Data)
			for ; i < len(msgs) && len(works) < protocol.MaxStatusBatch; i++ {
				next, err := protocol.Decode(msgs[i].Data)
				if err != nil || next.GetKind() != agentv1.Kind_KIND_STATUS || len(next.GetStatus().GetMore()) > 0 ||
					next.GetRevision() != env.GetRevision()+uint64(len(works)) || size+len(msgs[i].Data) > statusBatchBytes {
					break
				}
				size += len(msgs[i].Data)
				works = append(works, next.GetStatus().GetWork())
				ids = append(ids, msgs[i].ID)
			}
			if len(works) > 1 {
				env = protocol.NewStatuses(a.opts.Node, env.GetRevision(), works)
			}
		}
		resp, err := a.call(ctx, client, env)
		if status.Code(err) == codes.InvalidArgument && len(ids) > 1 {
			// Send them one by one, so that only the one the hub refuses is lost.
			a.log.Warn("hub rejected a batch of reports; sending them one by one", "reports", len(ids), "err", err)
			alone, i = i, start
			continue
		}
		if status.Code(err) == codes.InvalidArgument {
			// The hub will never accept it; keeping it would block every later report.
			a.log.Error("hub rejected report; dropping it", "ids", ids, "err", err)
		} else if err != nil {
			return fmt.Errorf("send report %s: %w", env.GetId(), err)
		}
		done = append(done, ids...)
		if resp.GetFullSyncRequired() {
			if *covered, err = a.reportNodeState(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// outboxBatch is how many outbox messages one read takes.
const outboxBatch = protocol.MaxStatusBatch

// statusBatchBytes bounds the reports one Status envelope carries, well
// within the protocol's envelope limit.
const statusBatchBytes = protocol.MaxEnvelopeBytes / 4

// report records an agent->hub report durably, with the phase of uid when
// phase is not empty (see store.Report), then wakes the flusher. build
// makes the envelope for the report's revision.
func (a *Agent) report(ctx context.Context, uid, phase, reason string, build func(rev uint64) *agentv1.Envelope) (uint64, error) {
	rev, err := a.db.Report(ctx, uid, phase, reason, func(rev uint64) (string, []byte, error) {
		env := build(rev)
		b, err := protocol.Encode(env)
		return env.GetId(), b, err
	})
	if err != nil {
		return 0, err
	}
	a.wake()
	return rev, nil
}

// wake tells the outbox flusher there is something to send.
func (a *Agent) wake() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// flushOutbox sends queued reports in order until each is accepted.
func (a *Agent) flushOutbox(ctx context.Context, client agentv1.AgentHubClient) error {
	// Status reports below covered are superseded by a NodeState queued
	// because the hub saw a gap: the hub would see each of them as a gap
	// too, and answer each with another full-sync request.
	var covered uint64
	for {
		msgs, err := a.db.Pending(ctx, outboxBatch)
		if err != nil {
			return err
		}
		if err := a.sendBatch(ctx, client, msgs, &covered); err != nil {
			return err
		}
		if len(msgs) == outboxBatch {
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-a.kick:
		}
		if len(a.work) > 0 || a.overflow.Load() {
			// The work loop has items queued, so more reports follow
			// within milliseconds: waiting a little sends them in one
			// Status (over MQTT one publish and one answer) rather than
			// one each. An agent with nothing queued reports at once.
			if err := a.lingerForReports(ctx); err != nil {
				return nil
			}
		}
	}
}

// reportLinger is how long the outbox flusher waits for more reports while
// the work loop has items queued: a few items' worth of running noop work,
// small against what a queued item already waits.
const reportLinger = 10 * time.Millisecond

func (a *Agent) lingerForReports(ctx context.Context) error {
	if a.linger != nil {
		return a.linger(ctx)
	}
	return a.sleep(ctx, reportLinger)
}

// reportNodeState queues the agent's whole state at a new revision, which
// it returns.
func (a *Agent) reportNodeState(ctx context.Context) (uint64, error) {
	a.reportMu.Lock()
	defer a.reportMu.Unlock()
	ws, err := a.db.ListWork(ctx)
	if err != nil {
		return 0, err
	}
	statuses := nodeStateWork(ws, protocol.MaxWorkItems, nodeStateBytes)
	return a.report(ctx, "", "", "", func(rev uint64) *agentv1.Envelope {
		return protocol.NewNodeState(a.opts.Node, rev, a.info(), statuses)
	})
}

// nodeStateBytes bounds the work list of a NodeState: half an envelope,
// leaving room for the NodeInfo (whose maps the protocol bounds too).
const nodeStateBytes = protocol.MaxEnvelopeBytes / 2

// nodeStateWork is what a NodeState reports of ws (in delivery order): all
// of it when it fits in maxItems entries and about maxBytes, else the items
// that have not ended first, then the most recently delivered ones that
// have. A NodeState over the protocol's limits could never be sent, and the
// agent could never connect again.
func nodeStateWork(ws []store.Work, maxItems, maxBytes int) []*agentv1.WorkStatus {
	size := func(w store.Work) int { return len(w.UID) + len(w.Phase) + len(w.Reason) + 16 } // + tags, lengths
	total := 0
	for _, w := range ws {
		total += size(w)
	}
	keep := ws
	if len(ws) > maxItems || total > maxBytes {
		keep = make([]store.Work, 0, min(len(ws), maxItems))
		used := 0
		take := func(w store.Work) bool {
			if len(keep) >= maxItems || used+size(w) > maxBytes {
				return false
			}
			keep = append(keep, w)
			used += size(w)
			return true
		}
		for _, w := range ws {
			if !terminal(w.Phase) && !take(w) {
				break
			}
		}
		unfinished := len(keep)
		for i := len(ws) - 1; i >= 0; i-- {
			if terminal(ws[i].Phase) && !take(ws[i]) {
				break
			}
		}
		slices.Reverse(keep[unfinished:])
	}
	out := make([]*agentv1.WorkStatus, 0, len(keep))
	for _, w := range keep {
		out = append(out, &agentv1.WorkStatus{Uid: w.UID, Phase: w.Phase, Reason: w.Reason})
	}
	return out
}

// handleBatch applies a run of hub->agent envelopes in stream order, then
// acks the ones it handled in one Ack. A run of Dispatches (each with one
// item or several, at consecutive revisions) is persisted in one
// transaction; anything else ends the run first, so that it sees the
// dispatches before it.
func (a *Agent) handleBatch(ctx context.Context, client agentv1.AgentHubClient, tr *protocol.Tracker, envs []*agentv1.Envelope) error {
	var (
		acks     []string
		run      []store.Work
		askedGap bool
	)
	applyRun := func() error {
		if len(run) == 0 {
			return nil
		}
		created, err := a.db.ApplyDispatches(ctx, run)
		if err != nil {
			return err
		}
		var repeats []string
		for i, c := range created {
			if c {
				a.schedule(run[i].UID)
			} else if a.held.held(run[i].UID) {
				repeats = append(repeats, run[i].UID)
			}
		}
		// A repeat of an item that has ended needs its credentials no more.
		if err := a.forgetEndedCredentials(ctx, repeats); err != nil {
			return err
		}
		run = run[:0]
		return nil
	}
	for _, env := range envs {
		if err := protocol.Validate(env); err != nil {
			a.log.Error("ignoring malformed message from hub", "err", err)
			continue
		}
		if env.GetNode() != a.opts.Node {
			a.log.Error("ignoring message for another node", "for", env.GetNode())
			continue
		}
		if d := env.GetDispatch(); d != nil {
			// Item i is at the envelope's revision + i. Items the agent
			// already holds are repeats (a re-sent envelope); a gap leaves
			// the envelope unacked: the snapshot it asks for settles it.
			gap := false
			for i, it := range protocol.DispatchItems(d) {
				rev := env.GetRevision() + uint64(i)
				v := tr.Step(rev)
				if v == protocol.Apply {
					spec := a.held.keep(it.GetUid(), it.GetType(), it.GetSpec())
					run = append(run, store.Work{UID: it.GetUid(), Type: it.GetType(), Spec: spec, Phase: PhasePending, Revision: rev})
					continue
				}
				if v != protocol.Gap {
					continue
				}
				gap = true
				if !askedGap {
					// Everything after a gap in this run is a gap too: one
					// request brings the snapshot that settles them all.
					askedGap = true
					if err := applyRun(); err != nil {
						return err
					}
					a.log.Info("revision gap; asking for a full sync", "have", tr.Last(), "got", rev)
					if _, err := a.call(ctx, client, protocol.NewFullSyncRequest(a.opts.Node, tr.Last())); err != nil {
						return err
					}
				}
				break
			}
			if !gap {
				// Stale and duplicate messages are acked too, so the hub stops re-sending them.
				acks = append(acks, env.GetId())
			}
			continue
		}
		if err := applyRun(); err != nil {
			return err
		}
		ack, err := a.handle(ctx, client, tr, env, &askedGap)
		if err != nil {
			return err
		}
		if ack {
			acks = append(acks, env.GetId())
		}
	}
	if err := applyRun(); err != nil {
		return err
	}
	if len(acks) == 0 {
		return nil
	}
	_, err := a.call(ctx, client, protocol.NewAck(a.opts.Node, acks[0], acks[1:]...))
	return err
}

// handle applies one hub->agent envelope other than a Dispatch, which
// handleBatch has validated, and reports whether to ack it.
func (a *Agent) handle(ctx context.Context, client agentv1.AgentHubClient, tr *protocol.Tracker, env *agentv1.Envelope, askedGap *bool) (bool, error) {
	switch p := env.GetPayload().(type) {
	case *agentv1.Envelope_LogRequest:
		// Not state: neither ordered nor acked, and answered beside the
		// stream for as long as the reader reads (tasklogs.go).
		go a.serveLogs(ctx, client, p.LogRequest)
		return false, nil
	case *agentv1.Envelope_NodeConfiguration:
		if a.opts.HeartbeatInterval == 0 && p.NodeConfiguration.GetHeartbeatSeconds() > 0 {
			a.mu.Lock()
			a.heartbeat = secs(p.NodeConfiguration.GetHeartbeatSeconds())
			a.mu.Unlock()
		}
		return false, nil
	case *agentv1.Envelope_Snapshot:
		v := tr.Reset(env.GetRevision())
		if v == protocol.Apply {
			*askedGap = false
			items := make([]store.Work, 0, len(p.Snapshot.GetItems()))
			var secret []string
			for _, it := range p.Snapshot.GetItems() {
				spec := a.held.keep(it.GetUid(), it.GetType(), it.GetSpec())
				if a.held.held(it.GetUid()) {
					secret = append(secret, it.GetUid())
				}
				items = append(items, store.Work{UID: it.GetUid(), Type: it.GetType(), Spec: spec, Phase: PhasePending, Revision: env.GetRevision()})
			}
			removed, err := a.db.ApplySnapshot(ctx, env.GetRevision(), items)
			if err != nil {
				return false, err
			}
			if err := a.forgetEndedCredentials(ctx, secret); err != nil {
				return false, err
			}
			a.held.snapshotApplied()
			for _, uid := range removed {
				if err := a.cancel(ctx, uid, "no longer in the hub's snapshot"); err != nil {
					return false, err
				}
				// The hub has forgotten uid: forget it too (its last status is
				// in the outbox), or the DB and every NodeState grow for ever,
				// and a NodeState over protocol.MaxWorkItems cannot be sent.
				if err := a.db.DeleteWork(ctx, uid); err != nil {
					return false, err
				}
				a.held.drop(uid)
			}
			for _, it := range items {
				a.schedule(it.UID)
			}
		}
		a.log.Debug("snapshot", "revision", env.GetRevision(), "verdict", v.String(), "items", len(p.Snapshot.GetItems()))
	case *agentv1.Envelope_Cancel:
		switch v := tr.Step(env.GetRevision()); v {
		case protocol.Gap:
			if *askedGap {
				return false, nil
			}
			*askedGap = true
			_, err := a.call(ctx, client, protocol.NewFullSyncRequest(a.opts.Node, tr.Last()))
			return false, err
		case protocol.Apply:
			if err := a.db.SetHubRevision(ctx, env.GetRevision()); err != nil {
				return false, err
			}
			if err := a.cancel(ctx, p.Cancel.GetUid(), "cancelled by the hub"); err != nil {
				return false, err
			}
		}
	default:
		a.log.Error("ignoring message kind the hub should not send", "kind", env.GetKind().String())
		return false, nil
	}
	// Stale and duplicate messages are acked too, so the hub stops re-sending them.
	return true, nil
}
