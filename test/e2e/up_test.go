package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/testenv"
)

// TestUpThenServerRestart is the quick start: `drover up --agents 2` gives
// a working fleet; Ctrl-C stops it cleanly; `drover server` on the same data
// dir still has the fleet, and a saved agent comes back without a token.
func TestUpThenServerRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: needs real drover processes and a kube-apiserver; run without -short")
	}
	drover := testenv.Binary(t, "./cmd/drover")
	agent := testenv.Binary(t, "./cmd/drover-agent", "-X github.com/drover-fleet/drover/internal/agent/cmd.Version=v0.0.1-e2e")
	dir := filepath.Join(t.TempDir(), "data")
	common := []string{"--data-dir", dir, "--hub-listen", "127.0.0.1:0", "--mqtt-listen", "127.0.0.1:0", "--metrics-bind-address", "0"}

	up := start(t, "drover up", drover, append([]string{"up", "--agents", "2", "--agent-binary", agent}, common...)...)
	m := up.waitLine(t, readyRE, startTimeout)
	up.waitLine(t, regexp.MustCompile(`^2/2 agents Online$`), defaultTimeout)
	c := &cluster{drover: drover, agent: agent, kubeconfig: m[1], ca: m[3]}
	c.connect(t)
	// Each agent runs from a copy of its own, which its upgrades replace.
	agents := agentProcesses(t, up.cmd.Process.Pid)
	for _, n := range []string{"node-1", "node-2"} {
		if want := filepath.Join(dir, "agents", n, "bin", "drover-agent"); agents[n].exe != want {
			t.Errorf("agent %s runs %q, want its own copy %s (all: %v)", n, agents[n].exe, want, agents)
		}
	}
	// The terminal has Drover's lines; controller-runtime's go to the file.
	if out := up.Output(); strings.Contains(out, "Starting EventSource") {
		t.Errorf("drover up printed controller-runtime's info lines without -v:\n%s", tail(out, 30))
	}
	if b, err := os.ReadFile(filepath.Join(dir, "server.log")); err != nil || !strings.Contains(string(b), "Starting EventSource") {
		t.Errorf("server.log (err %v) misses controller-runtime's info lines", err)
	}
	for _, n := range []string{"node-1", "node-2"} {
		if node, ok := c.node(t, n); !ok || node.Status.Phase != fleetv1.FleetNodeOnline || node.Labels["drover.io/local"] != "true" {
			t.Fatalf("after drover up, node %s = %+v (exists %v), want Online with label drover.io/local=true", n, node.Status, ok)
		}
	}
	// The quick start's NodeGrant: namespace default runs tasks on every
	// node as the node's task user; no other namespace runs anything.
	ctx := context.Background()
	probe := func(ns string, mut func(*batchv1.TaskSpec)) error {
		tk := &batchv1.Task{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "probe"}, Spec: batchv1.TaskSpec{Command: []string{"true"}, NodeName: "node-1"}}
		if mut != nil {
			mut(&tk.Spec)
		}
		return c.client.Create(ctx, tk, client.DryRunAll)
	}
	if err := probe("default", func(s *batchv1.TaskSpec) { s.WorkingDir = "scan" }); err != nil {
		t.Errorf("a Task in namespace default after drover up: %v", err)
	}
	if err := probe("kube-public", nil); err == nil || !strings.Contains(err.Error(), `namespace "kube-public" has no NodeGrant`) {
		t.Errorf("a Task in namespace kube-public after drover up: %v; want refused, no NodeGrant", err)
	}
	if err := probe("default", func(s *batchv1.TaskSpec) {
		s.SecurityContext = &batchv1.TaskSecurityContext{RunAsUser: ptr.To[int64](0)}
	}); err == nil ||
		!strings.Contains(err.Error(), `NodeGrant "drover-up" does not allow runAsUser 0`) {
		t.Errorf("a root Task in namespace default after drover up: %v; want refused by NodeGrant drover-up", err)
	}
	caBefore, err := os.ReadFile(c.ca)
	if err != nil {
		t.Fatal(err)
	}

	// SIGTERM is Ctrl-C for a process group: everything stops, exit 0.
	if err := up.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := up.exited(t, shutdownTimeout); code != 0 {
		t.Fatalf("drover up exit code after SIGTERM = %d, want 0; output:\n%s", code, tail(up.Output(), 30))
	}
	if out := up.Output(); strings.Contains(out, "level=ERROR") || !strings.Contains(out, "Drover stopped.") {
		t.Errorf("drover up after SIGTERM: want no error and \"Drover stopped.\"; output:\n%s", tail(out, 30))
	}
	// drover up waited for its agents to stop.
	for n, a := range agents {
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(a.pid))); err == nil {
			t.Errorf("agent %s (pid %d) still runs after drover up ended", n, a.pid)
		}
	}

	srv := start(t, "drover server (restarted)", drover, append([]string{"server"}, common...)...)
	m = srv.waitLine(t, readyRE, startTimeout)
	c.kubeconfig, c.hub = m[1], m[2]
	c.connect(t)
	if _, ok := c.node(t, "node-1"); !ok {
		t.Fatal("node-1 is gone after a server restart on the same data dir")
	}
	caAfter, err := os.ReadFile(c.ca)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(caBefore, caAfter) {
		t.Fatal("the CA changed across a restart: every agent would have to register again")
	}
	// No token: the agent resumes with the identity `drover up` gave it.
	c.startAgent(t, "node-1", filepath.Join(dir, "agents", "node-1"), "--hub", c.hub)
	c.waitPhase(t, "node-1", fleetv1.FleetNodeOnline, defaultTimeout)

	// Ctrl-C: the manager releases its Lease before the control plane
	// stops, and says nothing is wrong.
	if err := srv.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if code := srv.exited(t, shutdownTimeout); code != 0 {
		t.Fatalf("drover server exit code after SIGINT = %d, want 0; output:\n%s", code, tail(srv.Output(), 30))
	}
	if out := srv.Output(); strings.Contains(out, "level=ERROR") || strings.Contains(out, "Starting EventSource") {
		t.Errorf("drover server printed errors or info lines on a clean stop; output:\n%s", tail(out, 30))
	}
}

type agentProcess struct {
	pid int
	exe string // what /proc/<pid>/exe links to
}

// agentProcesses maps the node names of parent's drover-agent children to
// their processes.
func agentProcesses(t testing.TB, parent int) map[string]agentProcess {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	agents := map[string]agentProcess{}
	for _, st := range stats {
		b, err := os.ReadFile(st)
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces, not ')'.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(parent) {
			continue
		}
		pidDir := filepath.Dir(st)
		pid, _ := strconv.Atoi(filepath.Base(pidDir))
		cmdline, _ := os.ReadFile(filepath.Join(pidDir, "cmdline"))
		args := strings.Split(string(cmdline), "\x00")
		exe, _ := os.Readlink(filepath.Join(pidDir, "exe"))
		for i, a := range args {
			if a == "--node" && i+1 < len(args) {
				agents[args[i+1]] = agentProcess{pid: pid, exe: exe}
			}
		}
	}
	return agents
}
