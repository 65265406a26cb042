package actor

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/clock/clocktest"
)

// step is one line of a script: after advancing the fake clock by wait,
// msg goes to the actor; its state must then be want, and its effects,
// reports aside, must be exactly effects (nil: none).
type step struct {
	wait    time.Duration
	msg     Message
	want    any // PodState or SessionState
	effects []Effect
}

// actions are the effects that are not reports.
func actions(effs []Effect) []Effect {
	var out []Effect
	for _, e := range effs {
		switch e.(type) {
		case PodReport, SessionReport:
		default:
			out = append(out, e)
		}
	}
	return out
}

// reported checks that a change of state was reported.
func reported(t *testing.T, before, after any, effs []Effect) {
	t.Helper()
	if before == after {
		return
	}
	for _, e := range effs {
		switch r := e.(type) {
		case PodReport:
			if r.State == after {
				return
			}
		case SessionReport:
			if r.State == after {
				return
			}
		}
	}
	t.Errorf("%v → %v not reported: %#v", before, after, effs)
}

type stepper interface {
	Step(time.Time, Message) []Effect
}

func run(t *testing.T, clk *clocktest.Fake, a stepper, state func() any, steps []step) {
	t.Helper()
	for i, s := range steps {
		clk.Step(s.wait)
		before := state()
		effs := a.Step(clk.Now(), s.msg)
		if got := state(); got != s.want {
			t.Fatalf("step %d (%T after %v): state %v, want %v", i, s.msg, s.wait, got, s.want)
		}
		reported(t, before, state(), effs)
		if got := actions(effs); !reflect.DeepEqual(got, s.effects) {
			t.Fatalf("step %d (%T): effects\n%#v\nwant\n%#v", i, s.msg, got, s.effects)
		}
	}
}

const pod = "p1"

var cfg = PodConfig{Name: pod, LivenessTimeout: 30 * time.Second, ReadyTimeout: 10 * time.Second, EvacuationTimeout: 30 * time.Second}

func withCfg(f func(*PodConfig)) PodConfig {
	c := cfg
	f(&c)
	return c
}

func standby(c *PodConfig) { c.Standby = true }

func gone(reason string, sessions ...string) []Effect {
	var out []Effect
	for _, s := range sessions {
		out = append(out, ToSession{Session: s, Msg: InstanceGone{Reason: reason}})
	}
	return append(out, StopInstance{Pod: pod, Reason: reason})
}

func ready(s string) Effect { return ToSession{Session: s, Msg: InstanceReady{}} }

func TestPod(t *testing.T) {
	toStandby := []step{
		{msg: Started{}, want: PodLivenessChecking},
		{wait: time.Second, msg: Live{}, want: PodStandby, effects: []Effect{FreezeInstance{Pod: pod}}},
	}
	running := append(append([]step{}, toStandby...),
		step{msg: AddSession{Session: "s1"}, want: PodActivating, effects: []Effect{ThawInstance{Pod: pod}, ready("s1")}},
		step{msg: PodSessionReady{Session: "s1"}, want: PodRunning},
	)
	cat := func(a []step, b ...step) []step { return append(append([]step{}, a...), b...) }
	tests := []struct {
		name  string
		cfg   PodConfig
		steps []step
	}{
		{"create standby", withCfg(standby), toStandby},
		{"create standby, session, ready", withCfg(standby), running},
		{"create active: live means Idle", cfg, []step{
			{msg: Started{}, want: PodLivenessChecking},
			{msg: Live{}, want: PodIdle},
			{msg: AddSession{Session: "s1"}, want: PodActivating, effects: []Effect{ready("s1")}},
			{msg: PodSessionReady{Session: "s1"}, want: PodRunning},
		}},
		{"create active with a session bound while creating (cold path)", cfg, []step{
			{msg: AddSession{Session: "s1"}, want: PodCreating},
			{msg: Started{}, want: PodLivenessChecking},
			{msg: Live{}, want: PodActivating, effects: []Effect{ready("s1")}},
			{msg: PodSessionReady{Session: "s1"}, want: PodRunning},
		}},
		{"create active daemon: Running without sessions", withCfg(func(c *PodConfig) { c.Daemon = true }), []step{
			{msg: Started{}, want: PodLivenessChecking},
			{msg: Live{}, want: PodRunning},
			{msg: Delete{}, want: PodTerminating, effects: gone(ReasonDeleted)},
			{msg: Stopped{}, want: PodTerminated, effects: []Effect{Forget{Pod: pod}}},
		}},
		{"start failed", cfg, []step{
			{msg: StartFailed{Message: "no such file"}, want: PodTerminating, effects: gone(ReasonStartFailed)},
			{msg: Stopped{}, want: PodTerminated, effects: []Effect{Forget{Pod: pod}}},
		}},
		{"liveness check timeout", withCfg(standby), []step{
			{msg: Started{}, want: PodLivenessChecking},
			{wait: 29 * time.Second, msg: Tick{}, want: PodLivenessChecking},
			{wait: time.Second, msg: Tick{}, want: PodTerminating, effects: gone(ReasonLivenessTimeout)},
			{msg: Exited{}, want: PodTerminating}, // it is being stopped
			{msg: Stopped{}, want: PodTerminated, effects: []Effect{Forget{Pod: pod}}},
		}},
		{"liveness timeout ends a session bound while creating", cfg, []step{
			{msg: AddSession{Session: "s1"}, want: PodCreating},
			{msg: Started{}, want: PodLivenessChecking},
			{wait: 30 * time.Second, msg: Tick{}, want: PodTerminating, effects: gone(ReasonLivenessTimeout, "s1")},
		}},
		{"standby: delete", withCfg(standby), cat(toStandby,
			step{msg: Delete{}, want: PodTerminating, effects: gone(ReasonDeleted)})},
		{"standby: freeze failed", withCfg(standby), cat(toStandby,
			step{msg: FreezeFailed{Message: "EBUSY"}, want: PodTerminating, effects: gone(ReasonFreezeFailed)})},
		{"standby: PodActive thaws to Idle", withCfg(standby), cat(toStandby,
			step{msg: Activate{}, want: PodIdle, effects: []Effect{ThawInstance{Pod: pod}}})},
		{"standby: crash", withCfg(standby), cat(toStandby,
			step{msg: Exited{Message: "cgroup gone"}, want: PodTerminating, effects: gone(ReasonCrashed)})},
		{"activating: ready callback timeout", withCfg(standby), cat(toStandby,
			step{msg: AddSession{Session: "s1"}, want: PodActivating, effects: []Effect{ThawInstance{Pod: pod}, ready("s1")}},
			step{wait: 9 * time.Second, msg: Tick{}, want: PodActivating},
			step{wait: time.Second, msg: Tick{}, want: PodTerminating, effects: gone(ReasonReadyTimeout, "s1")},
		)},
		{"activating: the session's open timeout first", withCfg(standby), cat(toStandby,
			step{msg: AddSession{Session: "s1"}, want: PodActivating, effects: []Effect{ThawInstance{Pod: pod}, ready("s1")}},
			step{msg: SessionEnded{Session: "s1", Reason: ReasonOpenTimeout}, want: PodTerminating, effects: gone(ReasonReadyTimeout)},
		)},
		{"activating: session closed before ready returns to idle", withCfg(standby), cat(toStandby,
			step{msg: AddSession{Session: "s1"}, want: PodActivating, effects: []Effect{ThawInstance{Pod: pod}, ready("s1")}},
			step{msg: SessionEnded{Session: "s1", Reason: ReasonClosed}, want: PodIdle},
		)},
		{"activating: delete evacuates", withCfg(standby), cat(toStandby,
			step{msg: AddSession{Session: "s1"}, want: PodActivating, effects: []Effect{ThawInstance{Pod: pod}, ready("s1")}},
			step{msg: Delete{}, want: PodEvacuating, effects: []Effect{ToSession{Session: "s1", Msg: Evacuate{}}}},
			step{msg: SessionEnded{Session: "s1"}, want: PodTerminating, effects: gone(ReasonDeleted)},
		)},
		{"running: delete evacuates, session closed callback ends it", withCfg(standby), cat(running,
			step{msg: Delete{}, want: PodEvacuating, effects: []Effect{ToSession{Session: "s1", Msg: Evacuate{}}}},
			step{msg: Delete{}, want: PodEvacuating},
			step{msg: AddSession{Session: "s2"}, want: PodEvacuating, effects: []Effect{ToSession{Session: "s2", Msg: Rejected{Reason: ReasonNoCapacity}}}},
			step{msg: SessionEnded{Session: "s1"}, want: PodTerminating, effects: gone(ReasonDeleted)},
			step{msg: Stopped{}, want: PodTerminated, effects: []Effect{Forget{Pod: pod}}},
			step{msg: Delete{}, want: PodTerminated},
		)},
		{"running: evacuation timeout", withCfg(standby), cat(running,
			step{msg: Delete{}, want: PodEvacuating, effects: []Effect{ToSession{Session: "s1", Msg: Evacuate{}}}},
			step{wait: 29 * time.Second, msg: Tick{}, want: PodEvacuating},
			step{wait: time.Second, msg: Tick{}, want: PodTerminating, effects: gone(ReasonEvacuationTimeout, "s1")},
		)},
		{"running: crash ends the sessions", withCfg(standby), cat(running,
			step{msg: Exited{Message: "exit status 2"}, want: PodTerminating, effects: gone(ReasonCrashed, "s1")},
		)},
		{"running: last session ends, back to the idle pool, and again", withCfg(standby), cat(running,
			step{msg: AddSession{Session: "s2"}, want: PodRunning, effects: []Effect{ToSession{Session: "s2", Msg: Rejected{Reason: ReasonNoCapacity}}}},
			step{msg: SessionEnded{Session: "s1", Reason: ReasonClosed}, want: PodIdle},
			step{msg: AddSession{Session: "s2"}, want: PodActivating, effects: []Effect{ready("s2")}},
			step{msg: PodSessionReady{Session: "s2"}, want: PodRunning},
		)},
		{"sessionsPerInstance 2", withCfg(func(c *PodConfig) { c.Standby, c.SessionsPerInstance = true, 2 }), cat(running,
			step{msg: AddSession{Session: "s2"}, want: PodRunning, effects: []Effect{ready("s2")}},
			step{msg: AddSession{Session: "s2"}, want: PodRunning}, // re-delivered
			step{msg: AddSession{Session: "s3"}, want: PodRunning, effects: []Effect{ToSession{Session: "s3", Msg: Rejected{Reason: ReasonNoCapacity}}}},
			step{msg: SessionEnded{Session: "s1"}, want: PodRunning},
			step{msg: SessionEnded{Session: "s2"}, want: PodIdle},
		)},
		{"idle: delete", cfg, []step{
			{msg: Started{}, want: PodLivenessChecking},
			{msg: Live{}, want: PodIdle},
			{msg: Delete{}, want: PodTerminating, effects: gone(ReasonDeleted)},
		}},
		{"creating: delete", cfg, []step{
			{msg: Delete{}, want: PodTerminating, effects: gone(ReasonDeleted)},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktest.New(time.Time{})
			p, effs := NewPod(tt.cfg)
			if p.State() != PodCreating || !reflect.DeepEqual(actions(effs), []Effect{StartInstance{Pod: pod}}) {
				t.Fatalf("new pod: %v %#v", p.State(), effs)
			}
			run(t, clk, p, func() any { return p.State() }, tt.steps)
		})
	}
}

const sess = "s1"

func TestSession(t *testing.T) {
	scfg := SessionConfig{Name: sess, Pod: pod, OpenTimeout: 10 * time.Second, HeartbeatInterval: 5 * time.Second,
		HeartbeatMisses: 3, EvacuationTimeout: 30 * time.Second, CloseTimeout: 10 * time.Second}
	start := SendSessionStart{Pod: pod, Session: sess}
	closeCmd := SendSessionClose{Pod: pod, Session: sess}
	ended := func(reason string) []Effect {
		return []Effect{ToPod{Pod: pod, Msg: SessionEnded{Session: sess, Reason: reason}}, Forget{Session: sess}}
	}
	ready := []step{
		{msg: InstanceReady{}, want: SessionReadinessChecking, effects: []Effect{start}},
		{wait: time.Second, msg: ReadyCallback{}, want: SessionReady, effects: []Effect{ToPod{Pod: pod, Msg: PodSessionReady{Session: sess}}}},
	}
	live := append(append([]step{}, ready...), step{msg: ClientJoin{Client: "c1"}, want: SessionLive})
	cat := func(a []step, b ...step) []step { return append(append([]step{}, a...), b...) }
	tests := []struct {
		name  string
		steps []step
	}{
		{"ready, live, closed by the instance", cat(live,
			step{msg: ClientJoin{Client: "c2"}, want: SessionLive},
			step{msg: ClientLeave{Client: "c2"}, want: SessionLive},
			step{msg: ClosedCallback{}, want: SessionTerminated, effects: ended(ReasonClosedByInstance)},
			step{msg: Close{}, want: SessionTerminated},
		)},
		{"session ready timeout: terminated, closed as best it can", cat(ready[:1],
			step{wait: 9 * time.Second, msg: Tick{}, want: SessionReadinessChecking},
			step{wait: time.Second, msg: Tick{}, want: SessionTerminated, effects: append(ended(ReasonOpenTimeout), closeCmd)},
		)},
		{"starting timeout: the pod never got ready", []step{
			{wait: 10 * time.Second, msg: Tick{}, want: SessionTerminated, effects: ended(ReasonOpenTimeout)},
		}},
		{"starting: close before the instance heard of it", []step{
			{msg: Close{}, want: SessionTerminated, effects: ended(ReasonClosed)},
		}},
		{"rejected by the pod", []step{
			{msg: Rejected{Reason: ReasonNoCapacity}, want: SessionTerminated, effects: ended(ReasonNoCapacity)},
		}},
		{"readiness checking: close", cat(ready[:1],
			step{msg: Close{}, want: SessionTerminating, effects: []Effect{closeCmd}},
			step{msg: ClosedCallback{}, want: SessionTerminated, effects: ended(ReasonClosed)},
		)},
		{"ready: delete session → Terminating → gone", cat(ready,
			step{msg: Close{}, want: SessionTerminating, effects: []Effect{closeCmd}},
			step{msg: ClosedCallback{}, want: SessionTerminated, effects: ended(ReasonClosed)},
		)},
		{"ready: close timeout", cat(ready,
			step{msg: Close{}, want: SessionTerminating, effects: []Effect{closeCmd}},
			step{wait: 10 * time.Second, msg: Tick{}, want: SessionTerminated, effects: ended(ReasonCloseTimeout)},
		)},
		{"live: delete → Evacuating → clients leave → Terminating → gone", cat(live,
			step{msg: ClientJoin{Client: "c2"}, want: SessionLive},
			step{msg: Close{}, want: SessionEvacuating, effects: []Effect{closeCmd}},
			step{msg: ClientLeave{Client: "c1"}, want: SessionEvacuating},
			step{msg: ClientLeave{Client: "c2"}, want: SessionTerminating},
			step{msg: ClosedCallback{}, want: SessionTerminated, effects: ended(ReasonClosed)},
		)},
		{"live: pod evacuates, SessionEvacuated", cat(live,
			step{msg: Evacuate{}, want: SessionEvacuating, effects: []Effect{closeCmd}},
			step{msg: EvacuatedCallback{}, want: SessionTerminating},
			step{msg: ClosedCallback{}, want: SessionTerminated, effects: ended(ReasonDeleted)},
		)},
		{"live: evacuation timeout", cat(live,
			step{msg: Close{}, want: SessionEvacuating, effects: []Effect{closeCmd}},
			step{wait: 4 * time.Second, msg: Heartbeat{}, want: SessionEvacuating},
			step{wait: 4 * time.Second, msg: Heartbeat{}, want: SessionEvacuating},
			step{wait: 4 * time.Second, msg: Heartbeat{}, want: SessionEvacuating},
			step{wait: 4 * time.Second, msg: Heartbeat{}, want: SessionEvacuating},
			step{wait: 4 * time.Second, msg: Heartbeat{}, want: SessionEvacuating},
			step{wait: 4 * time.Second, msg: Heartbeat{}, want: SessionEvacuating},
			step{wait: 4 * time.Second, msg: Heartbeat{}, want: SessionEvacuating},
			step{wait: 2 * time.Second, msg: Tick{}, want: SessionTerminating},
			step{wait: 10 * time.Second, msg: Tick{}, want: SessionTerminated, effects: ended(ReasonCloseTimeout)}, // the Terminating report said EvacuationTimeout
		)},
		{"instance crash", cat(live,
			step{msg: InstanceGone{Reason: ReasonCrashed}, want: SessionTerminated, effects: ended(ReasonCrashed)},
		)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktest.New(time.Time{})
			s, effs := NewSession(clk.Now(), scfg)
			if s.State() != SessionStarting || !reflect.DeepEqual(actions(effs), []Effect{ToPod{Pod: pod, Msg: AddSession{Session: sess}}}) {
				t.Fatalf("new session: %v %#v", s.State(), effs)
			}
			run(t, clk, s, func() any { return s.State() }, tt.steps)
		})
	}
}

func TestSessionHeartbeatFlag(t *testing.T) {
	clk := clocktest.New(time.Time{})
	s, _ := NewSession(clk.Now(), SessionConfig{Name: sess, Pod: pod})
	s.Step(clk.Now(), InstanceReady{})
	s.Step(clk.Now(), ReadyCallback{})
	if want := clk.Now().Add(15 * time.Second); !s.Deadline().Equal(want) {
		t.Fatalf("deadline %v, want %v (3 heartbeats of 5s)", s.Deadline(), want)
	}
	clk.Step(14 * time.Second)
	if effs := s.Step(clk.Now(), Tick{}); len(effs) != 0 || s.Flagged() {
		t.Fatalf("flagged early: %#v", effs)
	}
	clk.Step(time.Second)
	effs := s.Step(clk.Now(), Tick{})
	if !s.Flagged() || len(effs) != 1 || !effs[0].(SessionReport).Flagged {
		t.Fatalf("not flagged after 3 missed heartbeats: %#v", effs)
	}
	if effs := s.Step(clk.Now(), Tick{}); len(effs) != 0 {
		t.Fatalf("flagged twice: %#v", effs)
	}
	if s.State() != SessionReady {
		t.Fatalf("a flag changes no state: %v", s.State())
	}
	effs = s.Step(clk.Now(), Heartbeat{})
	if s.Flagged() || len(effs) != 1 || effs[0].(SessionReport).Flagged {
		t.Fatalf("a heartbeat clears the flag: %#v", effs)
	}
}

// node is the routing a node actor does between actors, for a test of both
// actors together: effects to actors are delivered, others collected.
type node struct {
	pods     map[string]*Pod
	sessions map[string]*Session
	out      []Effect
}

func (n *node) deliver(now time.Time, effs []Effect) {
	for len(effs) > 0 {
		e := effs[0]
		effs = effs[1:]
		switch e := e.(type) {
		case ToPod:
			effs = append(effs, n.pods[e.Pod].Step(now, e.Msg)...)
		case ToSession:
			if s, ok := n.sessions[e.Session]; ok {
				effs = append(effs, s.Step(now, e.Msg)...)
			}
		default:
			n.out = append(n.out, e)
		}
	}
}

func (n *node) took(want Effect) error {
	for _, e := range n.out {
		if reflect.DeepEqual(e, want) {
			n.out = nil
			return nil
		}
	}
	return fmt.Errorf("no %#v in %#v", want, n.out)
}

// TestPodAndSession runs a standby pod and a session through the seed's
// create-session diagram and back to the idle pool.
func TestPodAndSession(t *testing.T) {
	clk := clocktest.New(time.Time{})
	n := &node{pods: map[string]*Pod{}, sessions: map[string]*Session{}}
	p, effs := NewPod(PodConfig{Name: pod, Standby: true})
	n.pods[pod] = p
	n.deliver(clk.Now(), effs)
	n.deliver(clk.Now(), p.Step(clk.Now(), Started{}))
	n.deliver(clk.Now(), p.Step(clk.Now(), Live{}))
	must(t, n.took(FreezeInstance{Pod: pod}))

	s, effs := NewSession(clk.Now(), SessionConfig{Name: sess, Pod: pod})
	n.sessions[sess] = s
	n.deliver(clk.Now(), effs)
	must(t, n.took(SendSessionStart{Pod: pod, Session: sess}))
	if p.State() != PodActivating || s.State() != SessionReadinessChecking {
		t.Fatalf("pod %v session %v", p.State(), s.State())
	}
	n.deliver(clk.Now(), s.Step(clk.Now(), ReadyCallback{}))
	if p.State() != PodRunning || s.State() != SessionReady {
		t.Fatalf("pod %v session %v", p.State(), s.State())
	}
	n.deliver(clk.Now(), s.Step(clk.Now(), Close{}))
	must(t, n.took(SendSessionClose{Pod: pod, Session: sess}))
	n.deliver(clk.Now(), s.Step(clk.Now(), ClosedCallback{}))
	if p.State() != PodIdle || s.State() != SessionTerminated {
		t.Fatalf("pod %v session %v", p.State(), s.State())
	}
	must(t, n.took(Forget{Session: sess}))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
