package actor

// Effect is what a Step decided: the caller carries it out (or routes it to
// another actor) and feeds the outcome back as a message.
type Effect interface{ isEffect() }

// Message is what a Step takes.
type Message interface{ isMessage() }

// Runtime commands, carried out by the instance runtime
// (internal/agent/instance), which answers with Started, StartFailed, Live,
// FreezeFailed, Exited and Stopped.
type (
	// StartInstance starts the pod's instance (its process; the runtime
	// assigns its port) and begins probing its liveness.
	StartInstance struct{ Pod string }
	// FreezeInstance freezes a live instance: it becomes standby.
	FreezeInstance struct{ Pod string }
	// ThawInstance thaws a standby instance (activation).
	ThawInstance struct{ Pod string }
	// StopInstance stops the instance and removes what it holds (cgroup,
	// port, dirs): the runtime answers Stopped.
	StopInstance struct{ Pod, Reason string }
)

// Session service commands, sent to the instance through its session
// service (the seed's session command messages).
type (
	SendSessionStart struct{ Pod, Session string }
	// SendSessionClose asks the instance to close a session; best effort:
	// the instance may be gone or never answer.
	SendSessionClose struct{ Pod, Session string }
)

// Routing between actors: the caller delivers Msg to the named actor.
type (
	ToPod struct {
		Pod string
		Msg Message
	}
	ToSession struct {
		Session string
		Msg     Message
	}
)

// Reports for the hub: each one is a change of the node's state, so the
// caller increments the node revision and sends PodState/SessionState.
type (
	PodReport struct {
		Pod      string
		State    PodState
		Reason   string
		Message  string
		Sessions []string
	}
	SessionReport struct {
		Session string
		Pod     string
		State   SessionState
		Reason  string
		// Flagged: no heartbeat for HeartbeatMisses intervals; the hub
		// (the Application's policy) decides what to do.
		Flagged bool
		Clients []string
	}
)

// Forget deletes the actor's table item (the seed's Terminated: "delete
// Pod table item", "delete session table item"); the actor is done.
type Forget struct{ Pod, Session string }

func (StartInstance) isEffect()    {}
func (FreezeInstance) isEffect()   {}
func (ThawInstance) isEffect()     {}
func (StopInstance) isEffect()     {}
func (SendSessionStart) isEffect() {}
func (SendSessionClose) isEffect() {}
func (ToPod) isEffect()            {}
func (ToSession) isEffect()        {}
func (PodReport) isEffect()        {}
func (SessionReport) isEffect()    {}
func (Forget) isEffect()           {}

// Tick is the clock: the caller steps an actor with Tick at (or after) its
// Deadline.
type Tick struct{}

func (Tick) isMessage() {}

// Reasons in reports.
const (
	ReasonStartFailed       = "StartFailed"
	ReasonLivenessTimeout   = "LivenessTimeout"
	ReasonFreezeFailed      = "FreezeFailed"
	ReasonReadyTimeout      = "ReadyTimeout"
	ReasonDeleted           = "Deleted"
	ReasonCrashed           = "InstanceCrashed"
	ReasonEvacuationTimeout = "EvacuationTimeout"
	ReasonOpenTimeout       = "OpenTimeout"
	ReasonCloseTimeout      = "CloseTimeout"
	ReasonClosed            = "Closed"
	ReasonClosedByInstance  = "ClosedByInstance"
	ReasonNoCapacity        = "NoCapacity"
	ReasonInstanceGone      = "InstanceGone"
)
