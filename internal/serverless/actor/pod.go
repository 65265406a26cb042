package actor

import (
	"slices"
	"time"
)

// PodState is a state of the seed's Pod lifecycle, plus Idle (see
// TransitionReturnToIdle).
type PodState string

const (
	PodCreating         PodState = "Creating"
	PodLivenessChecking PodState = "LivenessChecking"
	PodStandby          PodState = "Standby"
	// PodIdle is not in the seed: the instance is live and thawed and has
	// no session (it was created active, activated without a session, or
	// its sessions ended). It is in the idle pool: a session binds to it
	// without a thaw, and the hub scales it down after the Application's
	// idle timeout.
	PodIdle        PodState = "Idle"
	PodActivating  PodState = "Activating"
	PodRunning     PodState = "Running"
	PodEvacuating  PodState = "Evacuating"
	PodTerminating PodState = "Terminating"
	PodTerminated  PodState = "Terminated"
)

// Transitions the seed leaves out, named where the code takes them.
const (
	// TransitionReturnToIdle: Running (or Activating) → Idle when the pod's
	// last session ends and it is not a daemon; it may take up to
	// SessionsPerInstance sessions again.
	TransitionReturnToIdle = "ReturnToIdle"
	// TransitionCrash: any state before Terminating → Terminating when the
	// instance's process exits (or a frozen one's cgroup vanishes); its
	// sessions end at once with ReasonCrashed.
	TransitionCrash = "Crash"
	// TransitionEvacuationTimeout: Evacuating → Terminating when sessions
	// have not closed within EvacuationTimeout; they end with
	// ReasonEvacuationTimeout.
	TransitionEvacuationTimeout = "EvacuationTimeout"
	// TransitionStartFailed: Creating → Terminating when the runtime
	// cannot start the instance.
	TransitionStartFailed = "StartFailed"
	// TransitionFreezeFailed: Standby → Terminating when the freeze fails.
	TransitionFreezeFailed = "FreezeFailed"
)

// Pod messages.
type (
	// Started: the runtime started the instance.
	Started struct{}
	// StartFailed: it could not.
	StartFailed struct{ Message string }
	// Live: the instance passed its liveness (and readiness) probes.
	Live struct{}
	// FreezeFailed: the runtime could not freeze a standby instance.
	FreezeFailed struct{ Message string }
	// Exited: the instance's process ended (or, frozen, its cgroup went).
	Exited struct{ Message string }
	// Stopped: the runtime stopped the instance and removed what it held.
	Stopped struct{}
	// Delete is the hub's PodTerminate.
	Delete struct{}
	// Activate is the hub's PodActive: thaw a standby pod without a
	// session (it becomes Idle, or Running as a daemon).
	Activate struct{}
	// AddSession binds a session to the pod (the hub's SessionStart, routed
	// here by the session actor).
	AddSession struct{ Session string }
	// PodSessionReady: a session of the pod called SessionReady.
	PodSessionReady struct{ Session string }
	// SessionEnded: a session of the pod is Terminated.
	SessionEnded struct{ Session, Reason string }
)

func (Started) isMessage()         {}
func (StartFailed) isMessage()     {}
func (Live) isMessage()            {}
func (FreezeFailed) isMessage()    {}
func (Exited) isMessage()          {}
func (Stopped) isMessage()         {}
func (Delete) isMessage()          {}
func (Activate) isMessage()        {}
func (AddSession) isMessage()      {}
func (PodSessionReady) isMessage() {}
func (SessionEnded) isMessage()    {}

// Defaults of PodConfig (the Application's defaults in issue 16).
const (
	DefaultLivenessTimeout   = 30 * time.Second
	DefaultReadyTimeout      = 10 * time.Second
	DefaultEvacuationTimeout = 30 * time.Second
)

// PodConfig is what the hub's PodCreate tells the pod actor.
type PodConfig struct {
	Name string
	// Standby: create the pod standby (frozen once live); otherwise active.
	Standby bool
	// Daemon: an instance without sessions, Running once live.
	Daemon bool
	// SessionsPerInstance bounds the pod's sessions; 0 means 1.
	SessionsPerInstance int
	// LivenessTimeout bounds LivenessChecking.
	LivenessTimeout time.Duration
	// ReadyTimeout bounds Activating: the seed's ready callback timeout.
	ReadyTimeout time.Duration
	// EvacuationTimeout bounds Evacuating.
	EvacuationTimeout time.Duration
}

// Pod is the Pod actor of one instance.
type Pod struct {
	cfg      PodConfig
	state    PodState
	reason   string
	sessions []string
	deadline time.Time
}

// NewPod starts the actor of a PodCreate: Creating, with its first effects.
func NewPod(cfg PodConfig) (*Pod, []Effect) {
	if cfg.SessionsPerInstance <= 0 {
		cfg.SessionsPerInstance = 1
	}
	if cfg.LivenessTimeout <= 0 {
		cfg.LivenessTimeout = DefaultLivenessTimeout
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	if cfg.EvacuationTimeout <= 0 {
		cfg.EvacuationTimeout = DefaultEvacuationTimeout
	}
	p := &Pod{cfg: cfg, state: PodCreating}
	return p, []Effect{p.report(""), StartInstance{Pod: cfg.Name}}
}

// State is the pod's state.
func (p *Pod) State() PodState { return p.state }

// Reason is why the pod is Terminating or Terminated.
func (p *Pod) Reason() string { return p.reason }

// Sessions are the sessions bound to the pod.
func (p *Pod) Sessions() []string { return slices.Clone(p.sessions) }

// Deadline is when the pod wants a Tick (zero: never).
func (p *Pod) Deadline() time.Time { return p.deadline }

func (p *Pod) report(msg string) Effect {
	return PodReport{Pod: p.cfg.Name, State: p.state, Reason: p.reason, Message: msg, Sessions: p.Sessions()}
}

// to enters state s: a report, and no deadline unless the caller sets one.
func (p *Pod) to(s PodState, reason, msg string) []Effect {
	p.state, p.reason, p.deadline = s, reason, time.Time{}
	return []Effect{p.report(msg)}
}

// terminate enters Terminating; the remaining sessions end with reason.
func (p *Pod) terminate(reason, msg string) []Effect {
	var out []Effect
	for _, s := range p.sessions {
		out = append(out, ToSession{Session: s, Msg: InstanceGone{Reason: reason}})
	}
	p.sessions = nil
	out = append(out, p.to(PodTerminating, reason, msg)...)
	return append(out, StopInstance{Pod: p.cfg.Name, Reason: reason})
}

// bind adds session s, if the pod has room, and tells it the instance is
// ready for its SessionStart.
func (p *Pod) bind(s string) ([]Effect, bool) {
	if slices.Contains(p.sessions, s) {
		return nil, true // a re-delivered SessionStart
	}
	if len(p.sessions) >= p.cfg.SessionsPerInstance {
		return []Effect{ToSession{Session: s, Msg: Rejected{Reason: ReasonNoCapacity}}}, false
	}
	p.sessions = append(p.sessions, s)
	return []Effect{ToSession{Session: s, Msg: InstanceReady{}}}, true
}

func (p *Pod) reject(s string) []Effect {
	return []Effect{ToSession{Session: s, Msg: Rejected{Reason: ReasonNoCapacity}}}
}

// Step takes one message at now.
func (p *Pod) Step(now time.Time, m Message) []Effect {
	if p.state == PodTerminated {
		if a, ok := m.(AddSession); ok {
			return p.reject(a.Session)
		}
		return nil
	}
	switch m := m.(type) {
	case Delete:
		switch p.state {
		case PodActivating, PodRunning:
			if len(p.sessions) == 0 {
				return p.terminate(ReasonDeleted, "")
			}
			out := p.to(PodEvacuating, ReasonDeleted, "")
			p.deadline = now.Add(p.cfg.EvacuationTimeout)
			for _, s := range p.sessions {
				out = append(out, ToSession{Session: s, Msg: Evacuate{}})
			}
			return out
		case PodEvacuating, PodTerminating:
			return nil
		default:
			return p.terminate(ReasonDeleted, "")
		}
	case Exited:
		if p.state == PodTerminating {
			return nil // stopping it
		}
		return p.terminate(ReasonCrashed, m.Message) // TransitionCrash
	case Stopped:
		if p.state != PodTerminating {
			return nil
		}
		out := p.to(PodTerminated, p.reason, "")
		return append(out, Forget{Pod: p.cfg.Name})
	case SessionEnded:
		i := slices.Index(p.sessions, m.Session)
		if i < 0 {
			return nil
		}
		p.sessions = slices.Delete(p.sessions, i, i+1)
		if len(p.sessions) > 0 {
			return []Effect{p.report("")}
		}
		switch p.state {
		case PodEvacuating:
			return p.terminate(ReasonDeleted, "")
		case PodActivating:
			if m.Reason == ReasonOpenTimeout {
				// The instance never said SessionReady: the seed's ready
				// callback timeout, seen first by the session.
				return p.terminate(ReasonReadyTimeout, "session "+m.Session+" was not ready in time")
			}
			return p.to(PodIdle, "", TransitionReturnToIdle)
		case PodRunning:
			if p.cfg.Daemon {
				return []Effect{p.report("")}
			}
			return p.to(PodIdle, "", TransitionReturnToIdle)
		}
		return []Effect{p.report("")}
	}

	switch p.state {
	case PodCreating:
		switch m := m.(type) {
		case Started:
			out := p.to(PodLivenessChecking, "", "")
			p.deadline = now.Add(p.cfg.LivenessTimeout)
			return out
		case StartFailed:
			return p.terminate(ReasonStartFailed, m.Message) // TransitionStartFailed
		case AddSession:
			return p.pend(m.Session)
		}
	case PodLivenessChecking:
		switch m := m.(type) {
		case Live:
			return p.live(now)
		case Tick:
			if !now.Before(p.deadline) {
				return p.terminate(ReasonLivenessTimeout, "")
			}
		case AddSession:
			return p.pend(m.Session)
		}
	case PodStandby:
		switch m := m.(type) {
		case AddSession:
			out, ok := p.bind(m.Session)
			if !ok {
				return out
			}
			out = append([]Effect{ThawInstance{Pod: p.cfg.Name}}, out...)
			out = append(out, p.to(PodActivating, "", "")...)
			p.deadline = now.Add(p.cfg.ReadyTimeout)
			return out
		case Activate:
			out := []Effect{ThawInstance{Pod: p.cfg.Name}}
			if p.cfg.Daemon {
				return append(out, p.to(PodRunning, "", "")...)
			}
			return append(out, p.to(PodIdle, "", "")...)
		case FreezeFailed:
			return p.terminate(ReasonFreezeFailed, m.Message) // TransitionFreezeFailed
		}
	case PodIdle:
		if a, ok := m.(AddSession); ok {
			out, ok := p.bind(a.Session)
			if !ok {
				return out
			}
			out = append(out, p.to(PodActivating, "", "")...)
			p.deadline = now.Add(p.cfg.ReadyTimeout)
			return out
		}
	case PodActivating:
		switch m := m.(type) {
		case PodSessionReady:
			if slices.Contains(p.sessions, m.Session) {
				return p.to(PodRunning, "", "")
			}
		case AddSession:
			out, _ := p.bind(m.Session)
			return out
		case Tick:
			if !now.Before(p.deadline) {
				return p.terminate(ReasonReadyTimeout, "")
			}
		}
	case PodRunning:
		if a, ok := m.(AddSession); ok {
			out, ok := p.bind(a.Session)
			if ok && len(out) > 0 {
				out = append(out, p.report(""))
			}
			return out
		}
	case PodEvacuating:
		switch m := m.(type) {
		case Tick:
			if !now.Before(p.deadline) {
				return p.terminate(ReasonEvacuationTimeout, TransitionEvacuationTimeout)
			}
		case AddSession:
			return p.reject(m.Session)
		}
	case PodTerminating:
		if a, ok := m.(AddSession); ok {
			return p.reject(a.Session)
		}
	}
	return nil
}

// pend binds session s to a pod not live yet (the cold path: the hub binds
// a session to a pod it just created); s hears InstanceReady once the pod
// is live.
func (p *Pod) pend(s string) []Effect {
	if slices.Contains(p.sessions, s) {
		return nil
	}
	if len(p.sessions) >= p.cfg.SessionsPerInstance {
		return p.reject(s)
	}
	p.sessions = append(p.sessions, s)
	return nil
}

// live: LivenessChecking succeeded.
func (p *Pod) live(now time.Time) []Effect {
	if len(p.sessions) > 0 {
		// Created active for sessions already bound (the cold path).
		var out []Effect
		for _, s := range p.sessions {
			out = append(out, ToSession{Session: s, Msg: InstanceReady{}})
		}
		out = append(out, p.to(PodActivating, "", "")...)
		p.deadline = now.Add(p.cfg.ReadyTimeout)
		return out
	}
	switch {
	case p.cfg.Standby:
		return append(p.to(PodStandby, "", ""), FreezeInstance{Pod: p.cfg.Name})
	case p.cfg.Daemon:
		return p.to(PodRunning, "", "")
	default:
		return p.to(PodIdle, "", "")
	}
}
