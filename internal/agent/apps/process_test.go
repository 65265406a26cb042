package apps

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/agent/cgroup"
	"github.com/drover-fleet/drover/internal/agent/instance"
	"github.com/drover-fleet/drover/internal/agent/taskexec"
	"github.com/drover-fleet/drover/internal/serverless/actor"
	"github.com/drover-fleet/drover/internal/serverless/appwire"
)

// nobody is the instances' user in these tests.
const nobody = 65534

// processEnv is what the real-process tests share: examples/echo-session
// built where an instance's user may run it, cgroups, a task driver.
type processEnv struct {
	prog, shared string
	cg           *cgroup.Manager
}

func newProcessEnv(t *testing.T) *processEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (cgroups and the freezer for standby, an unprivileged instance user)")
	}
	cg, err := cgroup.New(cgroup.Options{})
	if err != nil {
		t.Skipf("needs cgroups (standby is a frozen cgroup): %v", err)
	}
	shared, err := os.MkdirTemp("", "apps-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(shared) })
	if err := os.Chmod(shared, 0o755); err != nil {
		t.Fatal(err)
	}
	return &processEnv{prog: buildEcho(t), shared: shared, cg: cg}
}

// buildEcho builds examples/echo-session, once for the package.
func buildEcho(t *testing.T) string {
	t.Helper()
	echo.once.Do(func() {
		if echo.dir, echo.err = os.MkdirTemp("", "apps-echo-"); echo.err != nil {
			return
		}
		if echo.err = os.Chmod(echo.dir, 0o755); echo.err != nil {
			return
		}
		goBin, err := exec.LookPath("go")
		if err != nil {
			goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		out := filepath.Join(echo.dir, "echo-session")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, goBin, "build", "-o", out, "../../../examples/echo-session")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			echo.err = fmt.Errorf("build examples/echo-session: %w\n%s", err, b)
			return
		}
		echo.path, echo.err = out, os.Chmod(out, 0o755)
	})
	if echo.err != nil {
		t.Fatal(echo.err)
	}
	return echo.path
}

// node is a Node on the process runtime, with its own driver (as one agent
// process); Close is left to the test when it simulates a restart.
func (e *processEnv) node(t *testing.T, store Store) (*Node, *taskexec.Driver) {
	t.Helper()
	d, err := taskexec.New(taskexec.Options{StateDir: filepath.Join(e.shared, "state"), WorkDir: filepath.Join(e.shared, "work"), Cgroups: e.cg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	rt, err := instance.New(instance.Options{Driver: d})
	if err != nil {
		t.Fatal(err)
	}
	n, err := New(Options{Runtime: ProcessRuntime(rt, d, nil), SocketDir: filepath.Join(e.shared, "s"), Store: store,
		Cancelled: cancelled, DefaultUID: nobody, DefaultGID: nobody, StopGrace: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return n, d
}

func (e *processEnv) instanceSpec(name string, standby bool) appwire.InstanceSpec {
	return appwire.InstanceSpec{Namespace: "ns", Application: "echo", Name: name, Standby: standby,
		Command: []string{e.prog}, Liveness: &appwire.Probe{TCP: true, TimeoutSeconds: 10}, Config: map[string]string{"greeting": "hi"},
		LivenessTimeoutMillis: appwire.Millis(testTimeout), ReadyTimeoutMillis: appwire.Millis(testTimeout)}
}

func sessionSpec(name, inst string) appwire.SessionSpec {
	return appwire.SessionSpec{Namespace: "ns", Application: "echo", Name: name, Instance: inst,
		Data: map[string]string{"user": "ada"}, OpenTimeoutMillis: appwire.Millis(testTimeout)}
}

// talk connects to the instance's port as a client of session, and says
// one line; the connection stays open until the test ends.
func talk(t *testing.T, port int, session string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), testTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(testTimeout))
	r := bufio.NewReader(c)
	if got, err := r.ReadString('\n'); err != nil || strings.TrimSpace(got) != "session "+session {
		t.Fatalf("greeting %q, %v; want session %s", got, err, session)
	}
	fmt.Fprintln(c, "hello")
	if got, err := r.ReadString('\n'); err != nil || strings.TrimSpace(got) != "hello" {
		t.Fatalf("echo %q, %v", got, err)
	}
	return c
}

// TestProcessSessions runs examples/echo-session as instances through the
// node actor: create standby → session start → SessionReady → a client →
// close; create active (cold path: the session comes while the instance
// is still Creating) → session; a session for an instance the node does
// not run; a crash; a delete.
func TestProcessSessions(t *testing.T) {
	e := newProcessEnv(t)
	store := newMemStore()
	n, d := e.node(t, store)
	defer n.Close()
	agent := context.Background()

	// Standby: started, live, frozen.
	instA := appwire.InstanceWorkID("a")
	store.setPhase(instA, PhaseRunning)
	a := start(t, n, agent, instA, appwire.TypeInstance, e.instanceSpec("echo-a", true))
	rep := instanceReport(t, a.waitState(string(actor.PodStandby)))
	if rep.Port == 0 || rep.Since == "" {
		t.Fatalf("standby report without port or since: %+v", rep)
	}

	// A session: thawed, SessionStart, SessionReady.
	sessA := appwire.SessionWorkID("s1")
	s1 := start(t, n, agent, sessA, appwire.TypeSession, sessionSpec("s1", instA))
	sr := sessionReport(t, s1.waitState(string(actor.SessionReady)))
	if sr.Port != rep.Port || sr.Instance != instA || sr.ReadyTime == "" {
		t.Fatalf("ready report %+v; want port %d, instance %s, a ready time", sr, rep.Port, instA)
	}
	a.waitState(string(actor.PodRunning))
	// The session file has the session's and the application's data.
	b, err := os.ReadFile(filepath.Join(d.WorkDir(instA), instance.SessionFileName))
	if err != nil {
		t.Fatal(err)
	}
	var meta instance.SessionMetadata
	if err := json.Unmarshal(b, &meta); err != nil || len(meta.Sessions) != 1 || meta.Sessions[0].Name != sessA ||
		meta.Sessions[0].Data["user"] != "ada" || meta.AppData["greeting"] != "hi" {
		t.Fatalf("session file: %s (%v)", b, err)
	}
	// A client: Live.
	talk(t, sr.Port, sessA)
	live := sessionReport(t, s1.waitState(string(actor.SessionLive)))
	if len(live.Clients) != 1 {
		t.Fatalf("live report %+v: want one client", live)
	}

	// SessionClose (the hub cancels the item): the instance evacuates
	// its client and closes; the pod returns to Idle.
	s1.cancel(errCancelled)
	if end := s1.wait(); end.phase != PhaseSucceeded || end.reason != actor.ReasonClosed {
		t.Fatalf("closed session ended %+v", end)
	}
	a.waitState(string(actor.PodIdle))

	// The cold path: the session comes while its instance is Creating.
	instB := appwire.InstanceWorkID("b")
	store.setPhase(instB, PhaseRunning)
	sessB := appwire.SessionWorkID("s2")
	bi := start(t, n, agent, instB, appwire.TypeInstance, e.instanceSpec("echo-b", false))
	s2 := start(t, n, agent, sessB, appwire.TypeSession, sessionSpec("s2", instB))
	sr2 := sessionReport(t, s2.waitState(string(actor.SessionReady)))
	talk(t, sr2.Port, sessB)
	s2.waitState(string(actor.SessionLive))

	// A session for an instance this node does not run.
	gone := start(t, n, agent, appwire.SessionWorkID("s3"), appwire.TypeSession, sessionSpec("s3", appwire.InstanceWorkID("nowhere")))
	if end := gone.wait(); end.phase != PhaseFailed || end.reason != actor.ReasonInstanceGone {
		t.Fatalf("session of an unknown instance ended %+v", end)
	}

	// A crash of B's process ends B and its session, Failed.
	data, _, _ := store.Record(agent, instB)
	var rec record
	if err := json.Unmarshal(data, &rec); err != nil || rec.Info.PID == 0 {
		t.Fatalf("record of %s: %s (%v)", instB, data, err)
	}
	if err := syscall.Kill(rec.Info.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if end := s2.wait(); end.phase != PhaseFailed || end.reason != actor.ReasonCrashed {
		t.Fatalf("session of a crashed instance ended %+v", end)
	}
	if end := bi.wait(); end.phase != PhaseFailed || end.reason != actor.ReasonCrashed {
		t.Fatalf("crashed instance ended %+v", end)
	}

	// PodTerminate (the hub cancels A): stopped, Succeeded.
	a.cancel(errCancelled)
	end := a.wait()
	if end.phase != PhaseSucceeded || end.reason != actor.ReasonDeleted {
		t.Fatalf("deleted instance ended %+v", end)
	}
	if r := instanceReport(t, end.message); r.State != string(actor.PodTerminated) {
		t.Fatalf("last report of a deleted instance: %+v", r)
	}
	data, _, _ = store.Record(agent, instA)
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(rec.Info.PID, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("the process of a deleted instance: kill 0 = %v, want ESRCH", err)
	}
}

// TestProcessRestart: the agent stops while a standby instance and a
// session run; its next start (Resume) stops what is left of the
// instance and ends it Failed, AgentRestarted, and the session Failed,
// InstanceGone.
func TestProcessRestart(t *testing.T) {
	e := newProcessEnv(t)
	store := newMemStore()
	n, _ := e.node(t, store)
	agent, stopAgent := context.WithCancel(context.Background())

	inst := appwire.InstanceWorkID("r")
	store.setPhase(inst, PhaseRunning)
	a := start(t, n, agent, inst, appwire.TypeInstance, e.instanceSpec("echo-r", true))
	a.waitState(string(actor.PodStandby))
	sess := appwire.SessionWorkID("rs")
	s := start(t, n, agent, sess, appwire.TypeSession, sessionSpec("rs", inst))
	s.waitState(string(actor.SessionReady))

	stopAgent()
	for _, r := range []*run{a, s} {
		if end := r.wait(); end.phase != PhaseRunning {
			t.Fatalf("%s ended %+v when the agent stopped; want it left Running", r.uid, end)
		}
	}
	n.Close()
	data, _, _ := store.Record(context.Background(), inst)
	var rec record
	if err := json.Unmarshal(data, &rec); err != nil || rec.Info.PID == 0 {
		t.Fatalf("record: %s (%v)", data, err)
	}
	if err := syscall.Kill(rec.Info.PID, 0); err != nil {
		t.Fatalf("the instance's process did not outlive the agent: %v", err)
	}

	n2, _ := e.node(t, store)
	defer n2.Close()
	spec, _ := json.Marshal(e.instanceSpec("echo-r", true))
	noReport := func(context.Context, string, string) error { return nil }
	phase, reason, msg := n2.Resume(context.Background(), inst, appwire.TypeInstance, spec, noReport)
	if phase != PhaseFailed || reason != ReasonAgentRestarted {
		t.Fatalf("resumed instance: %s %s %s", phase, reason, msg)
	}
	if err := syscall.Kill(rec.Info.PID, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("the process of a resumed instance: kill 0 = %v, want ESRCH (%s)", err, msg)
	}
	sspec, _ := json.Marshal(sessionSpec("rs", inst))
	phase, reason, _ = n2.Resume(context.Background(), sess, appwire.TypeSession, sspec, noReport)
	if phase != PhaseFailed || reason != actor.ReasonInstanceGone {
		t.Fatalf("resumed session: %s %s", phase, reason)
	}
}
