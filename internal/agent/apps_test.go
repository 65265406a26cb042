package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/serverless/actor"
	"github.com/drover-fleet/drover/internal/serverless/appwire"
	"github.com/drover-fleet/drover/internal/store"
	"github.com/drover-fleet/drover/internal/testkit"
)

// appStatus is a work status of an instance or a session from the outbox.
type appStatus struct {
	phase, reason, message string
}

func appStatuses(t *testing.T, a *Agent, uid string) []appStatus {
	t.Helper()
	var out []appStatus
	for _, e := range outbox(t, a) {
		if w := e.GetStatus().GetWork(); w != nil && w.GetUid() == uid {
			out = append(out, appStatus{w.GetPhase(), w.GetReason(), w.GetMessage()})
		}
	}
	return out
}

// waitApp waits for a status of uid that ok accepts, and returns it.
func waitApp(t *testing.T, a *Agent, uid string, ok func(appStatus) bool) appStatus {
	t.Helper()
	var got appStatus
	testkit.Eventually(t, taskWait, func() string {
		ss := appStatuses(t, a, uid)
		for _, s := range ss {
			if ok(s) {
				got = s
				return ""
			}
		}
		return fmt.Sprintf("%s: statuses %+v", uid, ss)
	})
	return got
}

func inState(state string) func(appStatus) bool {
	return func(s appStatus) bool { return s.phase == PhaseRunning && s.reason == state }
}

func appEnded(s appStatus) bool { return terminal(s.phase) }

func putApp(t *testing.T, a *Agent, uid, typ string, spec any) {
	t.Helper()
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.db.PutWork(context.Background(), store.Work{UID: uid, Type: typ, Spec: b, Phase: PhasePending}); err != nil {
		t.Fatal(err)
	}
	a.schedule(uid)
}

// TestAppsThroughTheAgent: instance and session work items run through the
// agent's work loop and DB (the runner a hub's dispatch reaches), with
// examples/echo-session as the instance: an active instance and a session
// bound to it while it is created (the cold path), Ready with the port, a
// client served, the session closed by a hub cancel; then the agent
// restarts while the instance runs, and the new agent stops it and reports
// it Failed, AgentRestarted.
func TestAppsThroughTheAgent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: instances run as nobody")
	}
	dir := stateDir(t)
	prog := buildEchoSession(t, openDir(t))
	withApps := func(o *Options) { o.Apps = &AppOptions{} }
	a := startTaskAgentOpts(t, dir, nil, withApps)

	inst, sess := appwire.InstanceWorkID("e1"), appwire.SessionWorkID("s1")
	putApp(t, a.Agent, inst, appwire.TypeInstance, appwire.InstanceSpec{Namespace: "ns", Application: "echo", Name: "echo-1",
		Command: []string{prog}, Liveness: &appwire.Probe{TCP: true, TimeoutSeconds: 10},
		LivenessTimeoutMillis: appwire.Millis(taskWait), ReadyTimeoutMillis: appwire.Millis(taskWait)})
	putApp(t, a.Agent, sess, appwire.TypeSession, appwire.SessionSpec{Namespace: "ns", Application: "echo", Name: "s1",
		Instance: inst, OpenTimeoutMillis: appwire.Millis(taskWait)})

	ready := waitApp(t, a.Agent, sess, inState(string(actor.SessionReady)))
	rep, err := appwire.DecodeSessionReport(ready.message)
	if err != nil || rep.Port == 0 || rep.Instance != inst || rep.ReadyTime == "" {
		t.Fatalf("Ready report %q (%v): want the instance, its port and the ready time", ready.message, err)
	}
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(rep.Port)), taskWait)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(taskWait))
	if got, err := bufio.NewReader(c).ReadString('\n'); err != nil || strings.TrimSpace(got) != "session "+sess {
		t.Fatalf("greeting %q, %v", got, err)
	}
	waitApp(t, a.Agent, sess, inState(string(actor.SessionLive)))
	waitApp(t, a.Agent, inst, inState(string(actor.PodRunning)))

	if err := a.cancel(context.Background(), sess, "deleted"); err != nil {
		t.Fatal(err)
	}
	if end := waitApp(t, a.Agent, sess, appEnded); end.phase != PhaseSucceeded || end.reason != actor.ReasonClosed {
		t.Fatalf("closed session ended %+v", end)
	}
	idle := waitApp(t, a.Agent, inst, inState(string(actor.PodIdle)))
	irep, err := appwire.DecodeInstanceReport(idle.message)
	if err != nil || irep.Port != rep.Port {
		t.Fatalf("Idle report %q (%v)", idle.message, err)
	}

	recs, err := a.db.Actions(context.Background(), inst)
	if err != nil || len(recs) != 1 {
		t.Fatalf("instance records %+v (%v)", recs, err)
	}
	var rec struct {
		Info struct {
			PID int `json:"pid"`
		} `json:"info"`
	}
	_ = json.Unmarshal(recs[0].Data, &rec)
	// The agent stops; the instance runs on, its item Running in the DB.
	a.stop()
	if rec.Info.PID == 0 || !alive(rec.Info.PID) {
		t.Fatalf("record %s: the instance's process does not run on", recs[0].Data)
	}
	b := startTaskAgentOpts(t, dir, nil, withApps)
	if end := waitApp(t, b.Agent, inst, appEnded); end.phase != PhaseFailed || end.reason != "AgentRestarted" {
		t.Fatalf("instance after a restart ended %+v", end)
	}
	testkit.Eventually(t, taskWait, func() string {
		if alive(rec.Info.PID) {
			return fmt.Sprintf("the instance's process %d runs after the restart", rec.Info.PID)
		}
		return ""
	})
}

// buildEchoSession builds examples/echo-session into dir.
func buildEchoSession(t *testing.T, dir string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out := filepath.Join(dir, "echo-session")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, "build", "-o", out, "../../examples/echo-session")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build examples/echo-session: %v\n%s", err, b)
	}
	if err := os.Chmod(out, 0o755); err != nil {
		t.Fatal(err)
	}
	return out
}
