package sessionsvc

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/agent/instance"
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/serverless/actor"
)

// input is a message for an actor: pod or session names it.
type input struct {
	pod, session string
	msg          actor.Message
}

// miniNode is the least a node actor does, for a test that the actors'
// effects fit the runtime and the session service: it carries out effects
// and feeds their outcomes back, on one goroutine.
type miniNode struct {
	t       *testing.T
	ctx     context.Context
	clk     clock.Clock
	rt      *instance.Runtime
	svc     *Service
	prog    string
	sock    string
	inst    *atomic.Pointer[instance.Instance]
	pod     *actor.Pod
	session *actor.Session
	inputs  chan input
	reports []actor.Effect
}

func (n *miniNode) step(in input) {
	var effs []actor.Effect
	switch {
	case in.pod != "":
		effs = n.pod.Step(n.clk.Now(), in.msg)
	case n.session != nil:
		effs = n.session.Step(n.clk.Now(), in.msg)
	}
	n.apply(effs)
}

func (n *miniNode) apply(effs []actor.Effect) {
	t := n.t
	for _, e := range effs {
		switch e := e.(type) {
		case actor.StartInstance:
			u := int64(65534)
			i, err := n.rt.Start(n.ctx, instance.Spec{Name: e.Pod, Namespace: "ns", Application: "echo",
				Command: []string{n.prog}, RunAsUser: &u, RunAsGroup: &u, SessionSocket: n.sock})
			if err != nil {
				n.step(input{pod: e.Pod, msg: actor.StartFailed{Message: err.Error()}})
				continue
			}
			n.inst.Store(i)
			n.step(input{pod: e.Pod, msg: actor.Started{}})
			if err := i.WaitLive(n.ctx, &instance.Probe{TCP: true}, nil, 0); err != nil {
				t.Fatalf("liveness: %v", err)
			}
			n.step(input{pod: e.Pod, msg: actor.Live{}})
		case actor.FreezeInstance:
			if _, err := n.inst.Load().Freeze(n.ctx); err != nil {
				n.step(input{pod: e.Pod, msg: actor.FreezeFailed{Message: err.Error()}})
			}
		case actor.ThawInstance:
			if _, err := n.inst.Load().Thaw(n.ctx); err != nil {
				t.Fatalf("thaw: %v", err)
			}
		case actor.StopInstance:
			if err := n.inst.Load().Stop(n.ctx, 5*time.Second); err != nil {
				t.Fatalf("stop: %v", err)
			}
			n.step(input{pod: e.Pod, msg: actor.Stopped{}})
		case actor.SendSessionStart:
			if err := n.svc.Start(e.Pod, e.Session, map[string]string{"user": "ada"}); err != nil {
				t.Fatalf("SessionStart: %v", err)
			}
		case actor.SendSessionClose:
			_ = n.svc.CloseSession(e.Pod, e.Session) // best effort
		case actor.ToPod:
			n.step(input{pod: e.Pod, msg: e.Msg})
		case actor.ToSession:
			n.step(input{session: e.Session, msg: e.Msg})
		case actor.Forget:
			if e.Session != "" {
				n.svc.Forget(podName, e.Session)
			}
		default:
			n.reports = append(n.reports, e)
		}
	}
}

const podName = "echo-actors"

// until steps the actors with the instance's callbacks (and Ticks) until
// cond holds.
func (n *miniNode) until(what string, cond func() bool) {
	n.t.Helper()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case in := <-n.inputs:
			n.step(in)
		case <-tick.C:
			n.step(input{pod: podName, msg: actor.Tick{}})
			n.step(input{session: "s1", msg: actor.Tick{}})
		case <-n.ctx.Done():
			n.t.Fatalf("%s: not within the test's timeout: pod %v, session %v", what, n.pod.State(), n.session.State())
		}
	}
}

// TestActorsDriveEchoSession: the Pod and Session actors' effects, carried
// out by the instance runtime and the session service, take
// examples/echo-session through the seed's create-standby and
// create-session diagrams, back to the idle pool, and to Terminated.
func TestActorsDriveEchoSession(t *testing.T) {
	rt, prog, shared, _ := echoRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*testTimeout)
	defer cancel()
	n := &miniNode{t: t, ctx: ctx, clk: clock.Real(), rt: rt, prog: prog,
		inst: &atomic.Pointer[instance.Instance]{}, inputs: make(chan input, 64)}
	var err error
	n.svc, err = New(Options{Dir: filepath.Join(shared, "s"), Handler: func(_, session string, msg actor.Message) {
		n.inputs <- input{session: session, msg: msg}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.svc.Close()
	member := func(pid int) bool { i := n.inst.Load(); return i != nil && i.Member(pid) }
	if n.sock, err = n.svc.Serve(podName, Owner{UID: 65534, GID: 65534, Member: member}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if i := n.inst.Load(); i != nil {
			_ = i.Stop(context.Background(), time.Second)
		}
	}()

	var effs []actor.Effect
	n.pod, effs = actor.NewPod(actor.PodConfig{Name: podName, Standby: true})
	n.apply(effs)
	if n.pod.State() != actor.PodStandby || !n.inst.Load().Frozen() {
		t.Fatalf("pod %v, frozen %v; want Standby, frozen", n.pod.State(), n.inst.Load().Frozen())
	}

	opened := time.Now()
	n.session, effs = actor.NewSession(n.clk.Now(), actor.SessionConfig{Name: "s1", Pod: podName})
	n.apply(effs)
	n.until("session Ready", func() bool { return n.session.State() == actor.SessionReady })
	t.Logf("standby → session Ready through the actors: %v", time.Since(opened))
	if n.pod.State() != actor.PodRunning {
		t.Fatalf("pod %v, want Running", n.pod.State())
	}

	i := n.inst.Load()
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(i.Port())), testTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if got := line(t, c, r); got != "session s1" {
		t.Fatalf("greeting %q", got)
	}
	n.until("session Live", func() bool { return n.session.State() == actor.SessionLive })

	// Close: Live → Evacuating → (clients leave, SessionEvacuated) →
	// Terminating → SessionClosed → Terminated; the pod goes back to Idle.
	n.step(input{session: "s1", msg: actor.Close{}})
	n.until("session Terminated", func() bool { return n.session.State() == actor.SessionTerminated })
	if n.session.Reason() != actor.ReasonClosed || n.pod.State() != actor.PodIdle {
		t.Fatalf("session %v (%s), pod %v; want Terminated (Closed), Idle", n.session.State(), n.session.Reason(), n.pod.State())
	}
	fmt.Fprintln(c, "after close")
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("the client of a closed session is still served")
	}

	n.step(input{pod: podName, msg: actor.Delete{}})
	if n.pod.State() != actor.PodTerminated {
		t.Fatalf("pod %v after Delete, want Terminated", n.pod.State())
	}
	if err := i.Alive(); err == nil {
		t.Fatal("the instance of a Terminated pod is alive")
	}
	var states []string
	for _, e := range n.reports {
		switch r := e.(type) {
		case actor.PodReport:
			states = append(states, "pod "+string(r.State))
		case actor.SessionReport:
			states = append(states, "session "+string(r.State))
		}
	}
	t.Logf("reports: %v", states)
}
