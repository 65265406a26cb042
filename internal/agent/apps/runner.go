package apps

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/drover-fleet/drover/internal/serverless/actor"
	"github.com/drover-fleet/drover/internal/serverless/appwire"
)

// Reasons of ends the actors do not name.
const (
	ReasonInvalidSpec        = "InvalidSpec"
	ReasonRuntimeUnavailable = "RuntimeUnavailable"
	ReasonAgentStopping      = "AgentStopping"
)

// Run runs work item uid of type appwire.TypeInstance or TypeSession, with
// spec, until it ends: the phase is Succeeded or Failed, the reason the
// actor's and the message the last report; or Running when the agent is
// stopping (ctx ended, not Cancelled): the instance goes on, and the next
// agent's Resume ends it.
func (n *Node) Run(ctx context.Context, uid, typ string, spec []byte, report ReportFunc) (phase, reason, message string) {
	switch typ {
	case appwire.TypeInstance:
		return n.runInstance(ctx, uid, spec, report)
	case appwire.TypeSession:
		return n.runSession(ctx, uid, spec, report)
	}
	return PhaseFailed, ReasonInvalidSpec, fmt.Sprintf("work type %q is not an instance nor a session", typ)
}

func (n *Node) runInstance(ctx context.Context, uid string, raw []byte, report ReportFunc) (string, string, string) {
	spec, err := appwire.DecodeInstance(raw)
	if err == nil && spec.Runtime == "container" {
		return n.instanceFailed(uid, ReasonRuntimeUnavailable, "the container runtime is not available for instances on this agent: use the process runtime")
	}
	if err != nil {
		return n.instanceFailed(uid, ReasonInvalidSpec, err.Error())
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return PhaseRunning, ReasonAgentStopping, ""
	}
	if _, dup := n.pods[uid]; dup {
		n.mu.Unlock()
		return PhaseFailed, ReasonInvalidSpec, "instance " + uid + " already runs on this node"
	}
	p := &pod{item: newItem(uid), spec: spec}
	p.ctx, p.cancel = context.WithCancel(n.ctx)
	p.ops = newSerial(&n.wg, n.ctx.Done())
	a, effects := actor.NewPod(actor.PodConfig{Name: uid, Standby: spec.Standby, Daemon: spec.Daemon,
		SessionsPerInstance: spec.SessionsPerInstance, LivenessTimeout: appwire.Duration(spec.LivenessTimeoutMillis),
		ReadyTimeout: appwire.Duration(spec.ReadyTimeoutMillis), EvacuationTimeout: appwire.Duration(spec.EvacuationTimeoutMillis)})
	p.a = a
	n.pods[uid] = p
	q := n.effects(n.clk.Now(), effects)
	// Sessions that came before it (the cold path, on goroutines of
	// their own) bind now: the actor holds them until it is live.
	for _, s := range n.pending[uid] {
		q = append(q, target{pod: uid, msg: actor.AddSession{Session: s}})
	}
	delete(n.pending, uid)
	n.run(q)
	n.mu.Unlock()
	n.log.Info("instance created", "instance", uid, "application", spec.Namespace+"/"+spec.Application, "standby", spec.Standby)
	return n.wait(ctx, &p.item, report, func() { n.deliverPod(uid, actor.Delete{}) })
}

// instanceFailed ends an instance that never started, and the sessions
// waiting for it.
func (n *Node) instanceFailed(uid, reason, msg string) (string, string, string) {
	n.mu.Lock()
	n.run(n.podGone(uid))
	n.mu.Unlock()
	return PhaseFailed, reason, encode(appwire.InstanceReport{State: string(actor.PodTerminated), Reason: reason, Message: msg})
}

func (n *Node) runSession(ctx context.Context, uid string, raw []byte, report ReportFunc) (string, string, string) {
	spec, err := appwire.DecodeSession(raw)
	if err != nil {
		return PhaseFailed, ReasonInvalidSpec, encode(appwire.SessionReport{State: string(actor.SessionTerminated), Reason: ReasonInvalidSpec, Message: err.Error()})
	}
	n.mu.Lock()
	_, known := n.pods[spec.Instance]
	_, over := n.ended[spec.Instance]
	n.mu.Unlock()
	await := false
	if !known && !over {
		// Its instance's item may be claimed and not created yet, or wait
		// in the queue behind this one: it is coming if its item is there
		// and not over.
		phase, found, err := n.opts.Store.WorkPhase(ctx, spec.Instance)
		if err != nil {
			n.log.Warn("cannot look up the instance of a session", "session", uid, "instance", spec.Instance, "err", err)
		}
		await = err == nil && found && phase != PhaseSucceeded && phase != PhaseFailed && phase != "Cancelled"
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return PhaseRunning, ReasonAgentStopping, ""
	}
	_, over = n.ended[spec.Instance]
	if _, known = n.pods[spec.Instance]; !known && (!await || over) {
		n.mu.Unlock()
		return PhaseFailed, actor.ReasonInstanceGone, encode(appwire.SessionReport{State: string(actor.SessionTerminated),
			Reason: actor.ReasonInstanceGone, Instance: spec.Instance, Message: "instance " + spec.Instance + " does not run on this node"})
	}
	if _, dup := n.sessions[uid]; dup {
		n.mu.Unlock()
		return PhaseFailed, ReasonInvalidSpec, "session " + uid + " already runs on this node"
	}
	now := n.clk.Now()
	s := &session{item: newItem(uid), spec: spec, awaitPod: await}
	a, effects := actor.NewSession(now, actor.SessionConfig{Name: uid, Pod: spec.Instance,
		OpenTimeout: appwire.Duration(spec.OpenTimeoutMillis), HeartbeatInterval: appwire.Duration(spec.HeartbeatIntervalMillis),
		HeartbeatMisses: spec.HeartbeatMisses, EvacuationTimeout: appwire.Duration(spec.EvacuationTimeoutMillis)})
	s.a = a
	n.sessions[uid] = s
	n.run(n.effects(now, effects))
	n.mu.Unlock()
	return n.wait(ctx, &s.item, report, func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		n.run([]target{{session: uid, msg: actor.Close{}}})
	})
}

// wait is the item's runner goroutine: it sends the item's reports in
// order, tells the actor when the hub cancels the item, and returns its
// end.
func (n *Node) wait(ctx context.Context, it *item, report ReportFunc, cancel func()) (string, string, string) {
	done := ctx.Done()
	for {
		select {
		case <-it.wake:
		case <-n.ctx.Done():
			// Closed while it runs: the agent is stopping.
			return PhaseRunning, ReasonAgentStopping, ""
		case <-done:
			done = nil
			if !n.opts.Cancelled(ctx) {
				// The agent is stopping. Its next start (Resume) stops
				// the instance: there is no re-attach.
				return PhaseRunning, ReasonAgentStopping, ""
			}
			cancel()
			continue
		}
		n.mu.Lock()
		reps, end := it.reports, it.end
		it.reports = nil
		n.mu.Unlock()
		// Each report is the item's whole state: of those queued while the
		// last one was being committed and sent, only the newest goes.
		// On a session's open path this skips the passing states
		// (Starting, ReadinessChecking; an instance's Activating), each of
		// which would cost a commit of the agent's outbox before Ready.
		if len(reps) > 0 {
			r := reps[len(reps)-1]
			if err := report(context.WithoutCancel(ctx), r.reason, r.message); err != nil {
				n.log.Warn("cannot report", "uid", it.uid, "state", r.reason, "err", err)
			}
		}
		if end != nil {
			return end.phase, end.reason, end.message
		}
	}
}

// Resume ends an item found Running after an agent start. Re-attach is not
// done: an instance's process (and cgroup) is stopped and the instance
// ends Failed, AgentRestarted; a session ends Failed, InstanceGone.
func (n *Node) Resume(ctx context.Context, uid, typ string, raw []byte, report ReportFunc) (string, string, string) {
	const why = "the agent restarted while it ran; instances are not re-attached after a restart"
	if typ == appwire.TypeSession {
		var spec appwire.SessionSpec
		_ = json.Unmarshal(raw, &spec)
		return PhaseFailed, actor.ReasonInstanceGone, encode(appwire.SessionReport{State: string(actor.SessionTerminated),
			Reason: actor.ReasonInstanceGone, Instance: spec.Instance, Message: why})
	}
	bg := context.WithoutCancel(ctx)
	msg := why
	data, found, err := n.opts.Store.Record(bg, uid)
	var rec record
	switch {
	case err != nil:
		msg = fmt.Sprintf("%s; what it recorded cannot be read (%v): its process, if any, is left", why, err)
	case found && len(data) > 0 && json.Unmarshal(data, &rec) == nil && rec.Info.PID > 0:
		sctx, cancel := context.WithTimeout(bg, n.opts.StopGrace+30*time.Second)
		err := n.opts.Runtime.StopLeftover(sctx, uid, rec.Info, n.opts.StopGrace)
		cancel()
		if err != nil {
			msg = fmt.Sprintf("%s; stopping what was left of it: %v", why, err)
		} else {
			msg = fmt.Sprintf("%s; its process %d was stopped", why, rec.Info.PID)
		}
	}
	if err == nil {
		if err := n.opts.Store.SetRecord(bg, uid, false, nil); err != nil {
			n.log.Warn("cannot record a stopped instance", "instance", uid, "err", err)
		}
	}
	n.log.Info("instance found after a restart, stopped", "instance", uid, "message", msg)
	n.mu.Lock()
	n.run(n.podGone(uid)) // sessions claimed meanwhile: their instance is gone
	n.mu.Unlock()
	reason := ReasonAgentRestarted
	if n.opts.Cancelled(ctx) {
		return PhaseSucceeded, actor.ReasonDeleted, encode(appwire.InstanceReport{State: string(actor.PodTerminated), Reason: actor.ReasonDeleted, Message: msg})
	}
	return PhaseFailed, reason, encode(appwire.InstanceReport{State: string(actor.PodTerminated), Reason: reason, Message: msg})
}

// serial runs one pod's runtime operations one after the other, in the
// order its actor asked for them (a thaw never overtakes a freeze).
type serial struct {
	mu     sync.Mutex
	q      []func()
	wake   chan struct{}
	closed bool
}

func newSerial(wg *sync.WaitGroup, stop <-chan struct{}) *serial {
	s := &serial{wake: make(chan struct{}, 1)}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return // the agent is stopping: what is queued is left
			default:
			}
			s.mu.Lock()
			if len(s.q) > 0 {
				f := s.q[0]
				s.q = s.q[1:]
				s.mu.Unlock()
				f()
				continue
			}
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return
			}
			select {
			case <-s.wake:
			case <-stop:
				return
			}
		}
	}()
	return s
}

func (s *serial) do(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.q = append(s.q, f)
	s.signal()
}

func (s *serial) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.signal()
}

func (s *serial) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}
