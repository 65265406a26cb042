package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
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
}
