package hub

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/agent"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/serverless/actor"
	"github.com/drover-fleet/drover/internal/serverless/appwire"
	"github.com/drover-fleet/drover/internal/testenv"
)

// appsRuns counts the runs of TestAppsThroughHubAndAgent in this process.
var appsRuns atomic.Int32

// TestAppsThroughHubAndAgent: a hub dispatches an instance and a session
// (appwire work items) to a real agent running serverless apps, with
// examples/echo-session as the instance; the agent's reports come back
// through the protocol (the session Ready with the instance's port), and
// the hub's cancel closes the session (Succeeded, Closed).
func TestAppsThroughHubAndAgent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: instances run as nobody")
	}
	open, err := os.MkdirTemp("", "hub-apps-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(open) })
	if err := os.Chmod(open, 0o755); err != nil { // instances (nobody) reach their dirs and the program
		t.Fatal(err)
	}
	prog := buildEchoSession(t, open)

	f := newFixture(t, "hub-apps")
	snk, ws := &sink{}, &works{}
	h := f.startHub(Options{Name: "hub-apps", Features: feature(ws, snk)})
	// FleetNodes outlive a run in the package's apiserver: a name per run
	// (go test -count=2).
	node := fmt.Sprintf("apps-node-%d", appsRuns.Add(1))
	opts := f.agentOpts(node, h, newRunner())
	opts.StateDir = filepath.Join(open, "state")
	opts.Apps = &agent.AppOptions{}
	f.startAgent(opts)
	waitConnected(t, h, node)

	inst, sess := appwire.InstanceWorkID("e1"), appwire.SessionWorkID("s1")
	ispec, _ := json.Marshal(appwire.InstanceSpec{Namespace: "ns", Application: "echo", Name: "echo-1", Command: []string{prog},
		Liveness: &appwire.Probe{TCP: true, TimeoutSeconds: 10}, LivenessTimeoutMillis: appwire.Millis(waitTimeout), ReadyTimeoutMillis: appwire.Millis(waitTimeout)})
	sspec, _ := json.Marshal(appwire.SessionSpec{Namespace: "ns", Application: "echo", Name: "s1", Instance: inst,
		OpenTimeoutMillis: appwire.Millis(waitTimeout)})
	for _, it := range []*agentv1.WorkItem{
		{Uid: inst, Type: appwire.TypeInstance, Spec: ispec},
		{Uid: sess, Type: appwire.TypeSession, Spec: sspec},
	} {
		ws.add(node, it) // a snapshot lists them too, and does not cancel them
		if err := h.Dispatch(node, it); err != nil {
			t.Fatal(err)
		}
	}
	var ready appwire.SessionReport
	testenv.Eventually(t, waitTimeout, "the session reported Ready", func(context.Context) (bool, error) {
		for _, st := range snk.statuses(node, sess) {
			if st.GetPhase() == agent.PhaseRunning && st.GetReason() == string(actor.SessionReady) {
				r, err := appwire.DecodeSessionReport(st.GetMessage())
				ready = r
				return true, err
			}
			if st.GetPhase() != agent.PhaseRunning {
				return false, fmt.Errorf("the session ended %s %s: %s", st.GetPhase(), st.GetReason(), st.GetMessage())
			}
		}
		return false, nil
	})
	if ready.Port == 0 || ready.Instance != inst || ready.ReadyTime == "" {
		t.Fatalf("Ready report %+v: want the instance, its port and the ready time", ready)
	}
	if err := h.Cancel(node, sess); err != nil {
		t.Fatal(err)
	}
	got := snk.waitStatus(t, node, sess, agent.PhaseSucceeded)
	if last := got[len(got)-1]; last.GetReason() != actor.ReasonClosed {
		t.Fatalf("closed session ended %s %s", last.GetPhase(), last.GetReason())
	}
	if err := h.Cancel(node, inst); err != nil {
		t.Fatal(err)
	}
	got = snk.waitStatus(t, node, inst, agent.PhaseSucceeded)
	if last := got[len(got)-1]; last.GetReason() != actor.ReasonDeleted {
		t.Fatalf("deleted instance ended %s %s", last.GetPhase(), last.GetReason())
	}
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
