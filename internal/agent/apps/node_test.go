package apps

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/agent/instance"
	"github.com/drover-fleet/drover/internal/agent/sessionsvc"
	"github.com/drover-fleet/drover/internal/agent/taskexec"
	"github.com/drover-fleet/drover/internal/clock/clocktest"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/serverless/actor"
	"github.com/drover-fleet/drover/internal/serverless/appwire"
	"github.com/drover-fleet/drover/internal/testkit"
)

// The routing of the node actor, on a fake runtime, a fake session
// service and a fake clock: the actors are pure, so what is tested here is
// that the node steps them with the right messages at the right time and
// ends the items as they say.

type fakeRuntime struct {
	mu        sync.Mutex
	insts     map[string]*fakeInstance
	startErr  error
	freezeErr error
	neverLive bool
	leftovers []string
}

func (r *fakeRuntime) Start(_ context.Context, spec instance.Spec) (Instance, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.startErr != nil {
		return nil, r.startErr
	}
	i := &fakeInstance{r: r, name: spec.Name, port: 40000 + len(r.insts), done: make(chan struct{}), socket: spec.SessionSocket}
	r.insts[spec.Name] = i
	return i, nil
}

func (r *fakeRuntime) StopLeftover(_ context.Context, name string, _ taskexec.Info, _ time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.leftovers = append(r.leftovers, name)
	return nil
}

func (r *fakeRuntime) inst(name string) *fakeInstance {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.insts[name]
}

type fakeInstance struct {
	r      *fakeRuntime
	name   string
	port   int
	socket string
	done   chan struct{}
	once   sync.Once

	mu      sync.Mutex
	ops     []string
	files   []instance.SessionMetadata
	stopped bool
}

func (i *fakeInstance) op(s string) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.ops = append(i.ops, s)
}

func (i *fakeInstance) Port() int               { return i.port }
func (i *fakeInstance) Info() taskexec.Info     { return taskexec.Info{PID: 4242} }
func (i *fakeInstance) Done() <-chan struct{}   { return i.done }
func (i *fakeInstance) Result() taskexec.Result { return taskexec.Result{Phase: PhaseFailed} }
func (i *fakeInstance) Status() instance.Status { return instance.Status{Name: i.name, Port: i.port} }
func (i *fakeInstance) Member(int) bool         { return true }
func (i *fakeInstance) crash()                  { i.once.Do(func() { close(i.done) }) }

func (i *fakeInstance) WaitLive(ctx context.Context, _, _ *instance.Probe, _ time.Duration) error {
	i.r.mu.Lock()
	never := i.r.neverLive
	i.r.mu.Unlock()
	if never {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

func (i *fakeInstance) Freeze(context.Context) (time.Duration, error) {
	i.op("freeze")
	i.r.mu.Lock()
	defer i.r.mu.Unlock()
	return 0, i.r.freezeErr
}

func (i *fakeInstance) Thaw(context.Context) (time.Duration, error) {
	i.op("thaw")
	return 0, nil
}

func (i *fakeInstance) Stop(context.Context, time.Duration) error {
	i.op("stop")
	i.mu.Lock()
	i.stopped = true
	i.mu.Unlock()
	i.crash()
	return nil
}

func (i *fakeInstance) WriteSessionFile(m instance.SessionMetadata) error {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.files = append(i.files, m)
	return nil
}

func (i *fakeInstance) lastFile() instance.SessionMetadata {
	i.mu.Lock()
	defer i.mu.Unlock()
	if len(i.files) == 0 {
		return instance.SessionMetadata{}
	}
	return i.files[len(i.files)-1]
}

// fakeSessions records the commands sent to instances.
type fakeSessions struct {
	mu   sync.Mutex
	cmds []string // "start inst sess", "close inst sess"
}

func (s *fakeSessions) Serve(inst string, _ sessionsvc.Owner) (string, error) {
	return "/fake/" + inst + ".sock", nil
}
func (s *fakeSessions) Remove(string) {}
func (s *fakeSessions) Start(inst, sess string, _ map[string]string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cmds = append(s.cmds, "start "+inst+" "+sess)
	return nil
}
func (s *fakeSessions) CloseSession(inst, sess string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cmds = append(s.cmds, "close "+inst+" "+sess)
	return nil
}
func (s *fakeSessions) Forget(string, string) {}
func (s *fakeSessions) Close()                {}

func (s *fakeSessions) sent(cmd string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Contains(s.cmds, cmd)
}

type harness struct {
	t     *testing.T
	n     *Node
	clk   *clocktest.Fake
	rt    *fakeRuntime
	svc   *fakeSessions
	store *memStore
	h     sessionsvc.Handler
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	h := &harness{t: t, clk: clocktest.New(time.Time{}), rt: &fakeRuntime{insts: map[string]*fakeInstance{}}, svc: &fakeSessions{}, store: newMemStore()}
	n, err := New(Options{Runtime: h.rt, Store: h.store, Cancelled: cancelled, DefaultUID: -1, DefaultGID: -1, Clock: h.clk,
		newSessions: func(cb sessionsvc.Handler) (Sessions, error) { h.h = cb; return h.svc, nil }})
	if err != nil {
		t.Fatal(err)
	}
	h.n = n
	t.Cleanup(n.Close)
	return h
}

func (h *harness) instance(uid string, standby bool) *run {
	h.t.Helper()
	h.store.setPhase(uid, PhaseRunning)
	return start(h.t, h.n, context.Background(), uid, appwire.TypeInstance, appwire.InstanceSpec{Namespace: "ns", Application: "app",
		Name: "i", Standby: standby, Command: []string{"/bin/app"}, Config: map[string]string{"k": "v"}})
}

func (h *harness) session(uid, inst string) *run {
	h.t.Helper()
	return start(h.t, h.n, context.Background(), uid, appwire.TypeSession, appwire.SessionSpec{Namespace: "ns", Application: "app",
		Name: "s", Instance: inst, Data: map[string]string{"user": uid}})
}

// stepUntil moves the clock by d until r ends.
func (h *harness) stepUntil(r *run, d time.Duration) ending {
	h.t.Helper()
	var e ending
	testkit.Eventually(h.t, testTimeout, func() string {
		select {
		case e = <-r.done:
			r.end = &e
			return ""
		case <-time.After(10 * time.Millisecond):
			h.clk.Step(d)
			return fmt.Sprintf("%s has not ended; reports %v", r.uid, r.reports())
		}
	})
	return e
}

func (h *harness) waitCmd(cmd string) {
	h.t.Helper()
	testkit.Eventually(h.t, testTimeout, func() string {
		if h.svc.sent(cmd) {
			return ""
		}
		return "not sent: " + cmd
	})
}

func TestNodeRouting(t *testing.T) {
	inst, sess := appwire.InstanceWorkID("i1"), appwire.SessionWorkID("s1")
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, h *harness)
	}{
		{"standby, session ready, closed by the hub, back to idle, deleted", func(t *testing.T, h *harness) {
			p := h.instance(inst, true)
			p.waitState(string(actor.PodStandby))
			s := h.session(sess, inst)
			s.waitState(string(actor.SessionReadinessChecking))
			h.waitCmd("start " + inst + " " + sess)
			i := h.rt.inst(inst)
			if f := i.lastFile(); len(f.Sessions) != 1 || f.Sessions[0].Name != sess || f.Sessions[0].Data["user"] != sess || f.AppData["k"] != "v" {
				t.Fatalf("session file before SessionStart: %+v", f)
			}
			h.h(inst, sess, actor.ReadyCallback{})
			rep := sessionReport(t, s.waitState(string(actor.SessionReady)))
			if rep.Port != i.port || rep.ReadyTime == "" {
				t.Fatalf("ready report %+v", rep)
			}
			p.waitState(string(actor.PodRunning))
			s.cancel(errCancelled)
			h.waitCmd("close " + inst + " " + sess)
			h.h(inst, sess, actor.ClosedCallback{})
			if e := s.wait(); e.phase != PhaseSucceeded || e.reason != actor.ReasonClosed {
				t.Fatalf("session ended %+v", e)
			}
			p.waitState(string(actor.PodIdle))
			if f := i.lastFile(); len(f.Sessions) != 0 {
				t.Fatalf("session file after the close: %+v", f)
			}
			p.cancel(errCancelled)
			if e := p.wait(); e.phase != PhaseSucceeded || e.reason != actor.ReasonDeleted {
				t.Fatalf("instance ended %+v", e)
			}
			i.mu.Lock()
			defer i.mu.Unlock()
			if !slices.Equal(i.ops, []string{"freeze", "thaw", "stop"}) {
				t.Fatalf("runtime operations %v, want freeze, thaw, stop in order", i.ops)
			}
		}},
		{"open timeout: the instance never says ready", func(t *testing.T, h *harness) {
			p := h.instance(inst, false)
			p.waitState(string(actor.PodIdle))
			s := h.session(sess, inst)
			s.waitState(string(actor.SessionReadinessChecking))
			if e := h.stepUntil(s, time.Second); e.phase != PhaseFailed || e.reason != actor.ReasonOpenTimeout {
				t.Fatalf("session ended %+v", e)
			}
			// The seed's "do the best to close the session".
			h.waitCmd("close " + inst + " " + sess)
			if e := h.stepUntil(p, time.Second); e.phase != PhaseFailed || e.reason != actor.ReasonReadyTimeout {
				t.Fatalf("instance ended %+v", e)
			}
		}},
		{"liveness timeout", func(t *testing.T, h *harness) {
			h.rt.neverLive = true
			p := h.instance(inst, true)
			p.waitState(string(actor.PodLivenessChecking))
			if e := h.stepUntil(p, 5*time.Second); e.phase != PhaseFailed || e.reason != actor.ReasonLivenessTimeout {
				t.Fatalf("instance ended %+v", e)
			}
			if i := h.rt.inst(inst); !i.stopped {
				t.Fatal("an instance that timed out was not stopped")
			}
		}},
		{"start failure ends the sessions bound on the cold path", func(t *testing.T, h *harness) {
			h.rt.startErr = errors.New("no such program")
			h.store.setPhase(inst, PhaseRunning) // its item is claimed, the instance not created yet
			s := h.session(sess, inst)
			s.waitState(string(actor.SessionStarting))
			p := h.instance(inst, false)
			if e := p.wait(); e.phase != PhaseFailed || e.reason != actor.ReasonStartFailed {
				t.Fatalf("instance ended %+v", e)
			}
			if e := s.wait(); e.phase != PhaseFailed || e.reason != actor.ReasonStartFailed {
				t.Fatalf("session ended %+v", e)
			}
		}},
		{"crash ends the instance and its session", func(t *testing.T, h *harness) {
			p := h.instance(inst, false)
			p.waitState(string(actor.PodIdle))
			s := h.session(sess, inst)
			h.waitCmd("start " + inst + " " + sess)
			h.h(inst, sess, actor.ReadyCallback{})
			s.waitState(string(actor.SessionReady))
			h.rt.inst(inst).crash()
			if e := s.wait(); e.phase != PhaseFailed || e.reason != actor.ReasonCrashed {
				t.Fatalf("session ended %+v", e)
			}
			if e := p.wait(); e.phase != PhaseFailed || e.reason != actor.ReasonCrashed {
				t.Fatalf("instance ended %+v", e)
			}
		}},
		{"freeze failure", func(t *testing.T, h *harness) {
			h.rt.freezeErr = errors.New("no freezer")
			p := h.instance(inst, true)
			if e := p.wait(); e.phase != PhaseFailed || e.reason != actor.ReasonFreezeFailed {
				t.Fatalf("instance ended %+v", e)
			}
		}},
		{"a missed heartbeat flags the session; a heartbeat clears it", func(t *testing.T, h *harness) {
			p := h.instance(inst, false)
			p.waitState(string(actor.PodIdle))
			s := h.session(sess, inst)
			h.waitCmd("start " + inst + " " + sess)
			h.h(inst, sess, actor.ReadyCallback{})
			s.waitState(string(actor.SessionReady))
			testkit.Eventually(t, testTimeout, func() string {
				h.clk.Step(time.Second)
				for _, m := range s.messages(string(actor.SessionReady)) {
					if sessionReport(t, m).Flagged {
						return ""
					}
				}
				return "not flagged"
			})
			h.h(inst, sess, actor.Heartbeat{})
			testkit.Eventually(t, testTimeout, func() string {
				m := s.messages(string(actor.SessionReady))
				if !sessionReport(t, m[len(m)-1]).Flagged {
					return ""
				}
				return "still flagged"
			})
		}},
		{"a session for an instance the node does not run", func(t *testing.T, h *harness) {
			s := h.session(sess, appwire.InstanceWorkID("elsewhere"))
			if e := s.wait(); e.phase != PhaseFailed || e.reason != actor.ReasonInstanceGone {
				t.Fatalf("session ended %+v", e)
			}
		}},
		{"a session that comes before its instance waits for it", func(t *testing.T, h *harness) {
			h.store.setPhase(inst, "Pending")
			s := h.session(sess, inst)
			s.waitState(string(actor.SessionStarting))
			p := h.instance(inst, true) // the cold path: created, then bound
			s.waitState(string(actor.SessionReadinessChecking))
			p.waitState(string(actor.PodActivating))
			if i := h.rt.inst(inst); slices.Contains(i.ops, "freeze") {
				t.Fatalf("an instance with a session was frozen: %v", i.ops)
			}
		}},
		{"restart: an instance is stopped, AgentRestarted; a session InstanceGone", func(t *testing.T, h *harness) {
			if err := h.store.SetRecord(context.Background(), inst, true, []byte(`{"info":{"pid":4242}}`)); err != nil {
				t.Fatal(err)
			}
			noReport := func(context.Context, string, string) error { return nil }
			phase, reason, _ := h.n.Resume(context.Background(), inst, appwire.TypeInstance, nil, noReport)
			if phase != PhaseFailed || reason != ReasonAgentRestarted || !slices.Equal(h.rt.leftovers, []string{inst}) {
				t.Fatalf("resumed instance: %s %s, leftovers stopped %v", phase, reason, h.rt.leftovers)
			}
			phase, reason, _ = h.n.Resume(context.Background(), sess, appwire.TypeSession, nil, noReport)
			if phase != PhaseFailed || reason != actor.ReasonInstanceGone {
				t.Fatalf("resumed session: %s %s", phase, reason)
			}
			// A session claimed after the restart, its instance's item
			// still Running in the DB (its end not recorded yet): gone.
			h.store.setPhase(inst, PhaseRunning)
			if e := h.session(appwire.SessionWorkID("late"), inst).wait(); e.phase != PhaseFailed || e.reason != actor.ReasonInstanceGone {
				t.Fatalf("session of a resumed instance ended %+v", e)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, newHarness(t)) })
	}
}

// messages are the report messages of state, in order.
func (r *run) messages(state string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, rep := range r.reps {
		if rep.reason == state {
			out = append(out, rep.message)
		}
	}
	return out
}

// Reports fit the protocol whatever the instance says: many sessions, many
// clients, long client names.
func TestReportsFit(t *testing.T) {
	var sessions, clients []string
	for i := range 1000 {
		sessions = append(sessions, appwire.SessionWorkID(fmt.Sprintf("%036d", i)))
		clients = append(clients, fmt.Sprintf("client-%d-%s", i, strings.Repeat("x", 1000)))
	}
	ir := encodeInstance(appwire.InstanceReport{State: "Running", Sessions: sessions})
	sr := encodeSession(appwire.SessionReport{State: "Live", Clients: clients})
	for _, m := range []string{ir, sr} {
		if len(m) > protocol.MaxMessageBytes {
			t.Errorf("a report of %d bytes, over the protocol's %d", len(m), protocol.MaxMessageBytes)
		}
	}
	got := instanceReport(t, ir)
	if len(got.Sessions) == 0 || !strings.Contains(got.Message, "1000 sessions") {
		t.Errorf("a cut instance report: %d sessions, message %q", len(got.Sessions), got.Message)
	}
	gs := sessionReport(t, sr)
	if len(gs.Clients) == 0 || len(gs.Clients[0]) > maxClientName+len("…") || !strings.Contains(gs.Message, "1000 clients") {
		t.Errorf("a cut session report: %d clients, message %q", len(gs.Clients), gs.Message)
	}
	if small := encodeSession(appwire.SessionReport{State: "Live", Clients: []string{"a"}}); !strings.Contains(small, `"clients":["a"]`) {
		t.Errorf("a small report was changed: %s", small)
	}
}
