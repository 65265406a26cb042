package actor

import (
	"slices"
	"time"
)

// SessionState is a state of the seed's session lifecycle.
type SessionState string

const (
	SessionStarting          SessionState = "Starting"
	SessionReadinessChecking SessionState = "ReadinessChecking"
	SessionReady             SessionState = "Ready"
	SessionLive              SessionState = "Live"
	SessionEvacuating        SessionState = "Evacuating"
	SessionTerminating       SessionState = "Terminating"
	SessionTerminated        SessionState = "Terminated"
)

// Session transitions the seed leaves out.
const (
	// TransitionInstanceGone: any state → Terminated when the pod's
	// instance crashed or was terminated under the session.
	TransitionInstanceGone = "InstanceGone"
	// TransitionStartingTimeout: Starting → Terminated when the pod never
	// became ready for the session within the open timeout.
	TransitionStartingTimeout = "StartingTimeout"
	// TransitionSessionEvacuationTimeout: Evacuating → Terminating when
	// clients have not left within the evacuation timeout.
	TransitionSessionEvacuationTimeout = "EvacuationTimeout"
	// TransitionCloseTimeout: Terminating → Terminated when the instance
	// does not confirm SessionClosed within the close timeout.
	TransitionCloseTimeout = "CloseTimeout"
	// TransitionHeartbeatMissed: Ready, Live or Evacuating stays, Flagged,
	// after HeartbeatMisses heartbeat intervals without one; a heartbeat
	// clears the flag.
	TransitionHeartbeatMissed = "HeartbeatMissed"
)

// Session messages.
type (
	// InstanceReady (from the pod): the instance is live, thawed and
	// waits for SessionStart.
	InstanceReady struct{}
	// InstanceGone (from the pod): the instance crashed or is terminated.
	InstanceGone struct{ Reason string }
	// Rejected (from the pod): it has no room for the session.
	Rejected struct{ Reason string }
	// Evacuate (from the pod): the pod is being deleted.
	Evacuate struct{}
	// Close is the hub's SessionClose (the session is deleted).
	Close struct{}
	// Callbacks of the instance, through its session service.
	ReadyCallback     struct{}
	EvacuatedCallback struct{}
	ClosedCallback    struct{}
	Heartbeat         struct{}
	ClientJoin        struct{ Client string }
	ClientLeave       struct{ Client string }
)

func (InstanceReady) isMessage()     {}
func (InstanceGone) isMessage()      {}
func (Rejected) isMessage()          {}
func (Evacuate) isMessage()          {}
func (Close) isMessage()             {}
func (ReadyCallback) isMessage()     {}
func (EvacuatedCallback) isMessage() {}
func (ClosedCallback) isMessage()    {}
func (Heartbeat) isMessage()         {}
func (ClientJoin) isMessage()        {}
func (ClientLeave) isMessage()       {}

// Defaults of SessionConfig (issue 16's Application defaults).
const (
	DefaultOpenTimeout       = 10 * time.Second
	DefaultHeartbeatInterval = 5 * time.Second
	DefaultHeartbeatMisses   = 3
	DefaultCloseTimeout      = 10 * time.Second
)

// SessionConfig is what the hub's SessionStart tells the session actor.
type SessionConfig struct {
	Name string
	Pod  string
	// OpenTimeout bounds Starting and ReadinessChecking together: the
	// seed's session ready timeout.
	OpenTimeout       time.Duration
	HeartbeatInterval time.Duration
	HeartbeatMisses   int
	EvacuationTimeout time.Duration
	CloseTimeout      time.Duration
}

// Session is the Session actor of one session.
type Session struct {
	cfg      SessionConfig
	state    SessionState
	reason   string
	flagged  bool
	clients  []string
	sent     bool // SessionStart was sent to the instance
	deadline time.Time
	lastBeat time.Time
}

// NewSession starts the actor of a SessionStart at now: Starting, bound to
// its pod.
func NewSession(now time.Time, cfg SessionConfig) (*Session, []Effect) {
	if cfg.OpenTimeout <= 0 {
		cfg.OpenTimeout = DefaultOpenTimeout
	}
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if cfg.HeartbeatMisses <= 0 {
		cfg.HeartbeatMisses = DefaultHeartbeatMisses
	}
	if cfg.EvacuationTimeout <= 0 {
		cfg.EvacuationTimeout = DefaultEvacuationTimeout
	}
	if cfg.CloseTimeout <= 0 {
		cfg.CloseTimeout = DefaultCloseTimeout
	}
	s := &Session{cfg: cfg, state: SessionStarting, deadline: now.Add(cfg.OpenTimeout)}
	return s, []Effect{s.report(), ToPod{Pod: cfg.Pod, Msg: AddSession{Session: cfg.Name}}}
}

func (s *Session) State() SessionState { return s.state }
func (s *Session) Reason() string      { return s.reason }
func (s *Session) Flagged() bool       { return s.flagged }
func (s *Session) Clients() []string   { return slices.Clone(s.clients) }

// Deadline is when the session wants a Tick (zero: never).
func (s *Session) Deadline() time.Time {
	if s.beating() {
		hb := s.lastBeat.Add(time.Duration(s.cfg.HeartbeatMisses) * s.cfg.HeartbeatInterval)
		if !s.flagged && (s.deadline.IsZero() || hb.Before(s.deadline)) {
			return hb
		}
	}
	return s.deadline
}

// beating: the instance is expected to send heartbeats.
func (s *Session) beating() bool {
	return s.state == SessionReady || s.state == SessionLive || s.state == SessionEvacuating
}

func (s *Session) report() Effect {
	return SessionReport{Session: s.cfg.Name, Pod: s.cfg.Pod, State: s.state, Reason: s.reason, Flagged: s.flagged, Clients: s.Clients()}
}

func (s *Session) to(st SessionState, reason string) []Effect {
	s.state, s.deadline = st, time.Time{}
	if reason != "" {
		s.reason = reason
	}
	return []Effect{s.report()}
}

// terminated ends the session: the pod hears of it, the table item goes.
func (s *Session) terminated(reason string) []Effect {
	out := s.to(SessionTerminated, reason)
	return append(out, ToPod{Pod: s.cfg.Pod, Msg: SessionEnded{Session: s.cfg.Name, Reason: s.reason}}, Forget{Session: s.cfg.Name})
}

// closing sends SessionClose and waits for SessionClosed.
func (s *Session) closing(now time.Time, reason string) []Effect {
	out := []Effect{SendSessionClose{Pod: s.cfg.Pod, Session: s.cfg.Name}}
	out = append(out, s.to(SessionTerminating, reason)...)
	s.deadline = now.Add(s.cfg.CloseTimeout)
	return out
}

// Step takes one message at now.
func (s *Session) Step(now time.Time, m Message) []Effect {
	if s.state == SessionTerminated {
		return nil
	}
	switch m := m.(type) {
	case InstanceGone:
		return s.terminated(m.Reason) // TransitionInstanceGone
	case Rejected:
		return s.terminated(m.Reason)
	case Heartbeat:
		s.lastBeat = now
		if s.flagged {
			s.flagged = false
			return []Effect{s.report()}
		}
		return nil
	case Tick:
		return s.tick(now)
	}
	switch s.state {
	case SessionStarting:
		switch m.(type) {
		case InstanceReady:
			deadline := s.deadline // the open timeout runs on
			out := []Effect{SendSessionStart{Pod: s.cfg.Pod, Session: s.cfg.Name}}
			out = append(out, s.to(SessionReadinessChecking, "")...)
			s.sent, s.deadline = true, deadline
			return out
		case Close, Evacuate:
			// The instance never heard of it.
			return s.terminated(ReasonClosed)
		}
	case SessionReadinessChecking:
		switch m.(type) {
		case ReadyCallback:
			s.lastBeat = now
			return append(s.to(SessionReady, ""), ToPod{Pod: s.cfg.Pod, Msg: PodSessionReady{Session: s.cfg.Name}})
		case Close, Evacuate:
			return s.closing(now, ReasonClosed)
		case ClosedCallback:
			return s.terminated(ReasonClosedByInstance)
		}
	case SessionReady:
		switch m := m.(type) {
		case ClientJoin:
			s.clients = append(s.clients, m.Client)
			return s.to(SessionLive, "")
		case Close:
			return s.closing(now, ReasonClosed)
		case Evacuate:
			return s.closing(now, ReasonDeleted)
		case ClosedCallback:
			return s.terminated(ReasonClosedByInstance)
		}
	case SessionLive:
		switch m := m.(type) {
		case ClientJoin:
			if !slices.Contains(s.clients, m.Client) {
				s.clients = append(s.clients, m.Client)
				return []Effect{s.report()}
			}
		case ClientLeave:
			if s.leave(m.Client) {
				return []Effect{s.report()}
			}
		case Close, Evacuate:
			reason := ReasonClosed
			if _, ok := m.(Evacuate); ok {
				reason = ReasonDeleted
			}
			out := []Effect{SendSessionClose{Pod: s.cfg.Pod, Session: s.cfg.Name}}
			out = append(out, s.to(SessionEvacuating, reason)...)
			s.deadline = now.Add(s.cfg.EvacuationTimeout)
			return out
		case ClosedCallback:
			// The seed's Live → Terminating "session closed", and at once
			// Terminating → Terminated "session gone": the instance said so.
			out := s.to(SessionTerminating, ReasonClosedByInstance)
			return append(out, s.terminated("")...)
		}
	case SessionEvacuating:
		switch m := m.(type) {
		case ClientLeave:
			if !s.leave(m.Client) {
				return nil
			}
			if len(s.clients) > 0 {
				return []Effect{s.report()}
			}
			return s.toTerminating(now)
		case EvacuatedCallback:
			s.clients = nil
			return s.toTerminating(now)
		case ClosedCallback:
			s.clients = nil
			return s.terminated("")
		}
	case SessionTerminating:
		if _, ok := m.(ClosedCallback); ok {
			return s.terminated("")
		}
	}
	return nil
}

// toTerminating: Evacuating → Terminating, waiting for SessionClosed.
func (s *Session) toTerminating(now time.Time) []Effect {
	out := s.to(SessionTerminating, "")
	s.deadline = now.Add(s.cfg.CloseTimeout)
	return out
}

func (s *Session) leave(c string) bool {
	i := slices.Index(s.clients, c)
	if i < 0 {
		return false
	}
	s.clients = slices.Delete(s.clients, i, i+1)
	return true
}

func (s *Session) tick(now time.Time) []Effect {
	var out []Effect
	if s.beating() && !s.flagged && !now.Before(s.lastBeat.Add(time.Duration(s.cfg.HeartbeatMisses)*s.cfg.HeartbeatInterval)) {
		s.flagged = true // TransitionHeartbeatMissed
		out = append(out, s.report())
	}
	if s.deadline.IsZero() || now.Before(s.deadline) {
		return out
	}
	switch s.state {
	case SessionStarting:
		return append(out, s.terminated(ReasonOpenTimeout)...) // TransitionStartingTimeout
	case SessionReadinessChecking:
		// The seed: "session state terminated", then "do the best to close
		// session" with the instance.
		out = append(out, s.terminated(ReasonOpenTimeout)...)
		return append(out, SendSessionClose{Pod: s.cfg.Pod, Session: s.cfg.Name})
	case SessionEvacuating:
		s.clients = nil
		out = append(out, s.to(SessionTerminating, ReasonEvacuationTimeout)...) // TransitionSessionEvacuationTimeout
		s.deadline = now.Add(s.cfg.CloseTimeout)
		return out
	case SessionTerminating:
		return append(out, s.terminated(ReasonCloseTimeout)...) // TransitionCloseTimeout
	}
	return out
}
