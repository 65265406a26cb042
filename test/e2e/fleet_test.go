package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	"github.com/drover-fleet/drover/internal/testkit"
)

// TestFleet shares one `drover server` between user stories, each with its
// own nodes.
func TestFleet(t *testing.T) {
	c := startCluster(t)

	t.Run("a node registers, waits for approval, and is Online once approved", func(t *testing.T) {
		tok := c.token(t, false, time.Hour)
		a := c.startAgent(t, "edge-approve", t.TempDir(), "--hub", c.hub, "--token", tok, "--labels", "site=berlin")
		n := c.waitPhase(t, "edge-approve", fleetv1.FleetNodePending, defaultTimeout)
		if n.Spec.Approved {
			t.Fatal("node approved without `drover approve` or an auto-approve token")
		}
		if c := meta.FindStatusCondition(n.Status.Conditions, fleetv1.ApprovedCondition); c == nil || c.Reason != fleetv1.ReasonAwaitingApproval {
			t.Errorf("Approved condition = %+v, want reason %s", c, fleetv1.ReasonAwaitingApproval)
		}
		a.waitLine(t, regexp.MustCompile(`waiting for approval`), defaultTimeout)

		out, err := c.cli(t, "approve", "edge-approve")
		if err != nil || !strings.Contains(out, "fleetnode/edge-approve approved") {
			t.Fatalf("drover approve edge-approve = %q, %v", out, err)
		}
		n = c.waitPhase(t, "edge-approve", fleetv1.FleetNodeOnline, defaultTimeout)
		if n.Status.Hub != "hub-main" || n.Status.AgentVersion != "v0.0.1-e2e" || n.Labels["site"] != "berlin" {
			t.Errorf("online node: hub=%q version=%q labels=%v, want hub-main, v0.0.1-e2e, site=berlin", n.Status.Hub, n.Status.AgentVersion, n.Labels)
		}
		if n.Status.CertificateExpiry == nil || n.Status.Capacity.Cpu().IsZero() {
			t.Errorf("online node lacks certificate expiry or cpu capacity: %+v", n.Status)
		}
		out, err = c.cli(t, "get", "nodes")
		if err != nil || !regexp.MustCompile(`edge-approve\s+Online\s+true\s+hub-main\s+v0.0.1-e2e`).MatchString(out) {
			t.Errorf("drover get nodes = %q, %v; want a row for edge-approve Online", out, err)
		}
		out, err = c.cli(t, "get", "nodes", "-l", "site=berlin")
		if err != nil || !strings.Contains(out, "edge-approve") || strings.Count(strings.TrimSpace(out), "\n") != 1 {
			t.Errorf("drover get nodes -l site=berlin = %q, %v; want the header and edge-approve only", out, err)
		}
	})

	t.Run("tokens are created on stdout, listed without secrets, and deleted", func(t *testing.T) {
		cmd := exec.Command(c.drover, "--kubeconfig", c.kubeconfig, "token", "create", "--auto-approve", "--description", "e2e list")
		stdout, err := cmd.Output()
		if err != nil {
			t.Fatalf("drover token create: %v", err)
		}
		tok := strings.TrimSpace(string(stdout))
		id, secret, ok := strings.Cut(tok, ".")
		if !ok || len(id) != 6 || len(secret) != 16 {
			t.Fatalf("drover token create printed %q on stdout, want one id.secret token", stdout)
		}
		out, err := c.cli(t, "token", "list")
		if err != nil || !regexp.MustCompile(id+`\s+\S+\s+true\s+e2e list`).MatchString(out) || strings.Contains(out, secret) {
			t.Fatalf("drover token list = %q, %v; want a row for %s without its secret", out, err, id)
		}
		if out, err := c.cli(t, "token", "delete", tok); err != nil || !strings.Contains(out, id+" deleted") {
			t.Fatalf("drover token delete = %q, %v", out, err)
		}
		a := c.startAgent(t, "edge-deleted-token", t.TempDir(), "--hub", c.hub, "--token", tok)
		if code := a.exited(t, defaultTimeout); code != 3 || !strings.Contains(a.Output(), "unknown") {
			t.Errorf("agent with a deleted token: exit %d, output:\n%s", code, tail(a.Output(), 10))
		}
	})

	t.Run("bad, unknown and expired tokens are refused with a clear error", func(t *testing.T) {
		good := c.token(t, true, time.Hour)
		expired := c.token(t, true, time.Second)
		time.Sleep(1100 * time.Millisecond) // let it expire
		id, _, _ := strings.Cut(good, ".")
		tests := []struct {
			name, token, want string
		}{
			{"malformed", "not-a-token", "malformed"},
			// One message for every bad token: it cannot tell ids apart.
			{"unknown id", "zzzzzz.0123456789abcdef", "token is not valid"},
			{"wrong secret", id + ".0000000000000000", "token is not valid"},
			{"expired", expired, "token is not valid"},
		}
		for i, tt := range tests {
			node := fmt.Sprintf("edge-badtoken-%d", i)
			a := c.startAgent(t, node, t.TempDir(), "--hub", c.hub, "--token", tt.token)
			if code := a.exited(t, defaultTimeout); code != 3 {
				t.Errorf("%s: agent exit code = %d, want 3 (fatal); output:\n%s", tt.name, code, tail(a.Output(), 10))
			}
			if !strings.Contains(a.Output(), tt.want) {
				t.Errorf("%s: agent output does not say %q:\n%s", tt.name, tt.want, tail(a.Output(), 10))
			}
			if _, ok := c.node(t, node); ok {
				t.Errorf("%s: a FleetNode was created for a refused registration", tt.name)
			}
		}
	})

	t.Run("a silent node goes Offline after the configured timeout", func(t *testing.T) {
		a := c.startAgent(t, "edge-offline", t.TempDir(), "--hub", c.hub, "--token", c.token(t, true, time.Hour))
		c.waitPhase(t, "edge-offline", fleetv1.FleetNodeOnline, defaultTimeout)
		killed := time.Now()
		a.stop(syscall.SIGKILL)
		n := c.waitPhase(t, "edge-offline", fleetv1.FleetNodeOffline, offlineTimeout+defaultTimeout)
		// The timeout runs from the node's last message, which came at most one
		// heartbeat interval before the kill.
		if took := time.Since(killed); took < offlineTimeout-heartbeatInterval {
			t.Errorf("node went Offline %v after the kill, before the %v timeout less one %v heartbeat", took, offlineTimeout, heartbeatInterval)
		}
		if r := meta.FindStatusCondition(n.Status.Conditions, fleetv1.ReadyCondition); r == nil || r.Reason != fleetv1.ReasonHeartbeatTimeout {
			t.Errorf("Ready condition = %+v, want reason %s", r, fleetv1.ReasonHeartbeatTimeout)
		}
	})

	t.Run("an agent restart keeps its identity and revisions", func(t *testing.T) {
		dir := t.TempDir()
		a := c.startAgent(t, "edge-restart", dir, "--hub", c.hub, "--token", c.token(t, true, time.Hour))
		n := c.waitPhase(t, "edge-restart", fleetv1.FleetNodeOnline, defaultTimeout)
		testkit.Eventually(t, defaultTimeout, func() string {
			n, _ = c.node(t, "edge-restart")
			if n.Status.AgentRevision < 1 {
				return fmt.Sprintf("agentRevision = %d, want ≥ 1", n.Status.AgentRevision)
			}
			return ""
		})
		before := n.Status.AgentRevision
		a.stop(syscall.SIGTERM)
		// No token this time: a node that lost its identity could not come back.
		b := c.startAgent(t, "edge-restart", dir, "--hub", c.hub)
		b.waitLine(t, regexp.MustCompile(`resuming with saved identity`), defaultTimeout)
		testkit.Eventually(t, defaultTimeout, func() string {
			n, _ = c.node(t, "edge-restart")
			if n.Status.Phase != fleetv1.FleetNodeOnline || n.Status.AgentRevision <= before {
				return fmt.Sprintf("phase %s agentRevision %d, want Online and > %d", n.Status.Phase, n.Status.AgentRevision, before)
			}
			return ""
		})
	})

	t.Run("an agent moves to another hub when its hub is killed, without going Offline", func(t *testing.T) {
		hubs := make([]string, 2)
		procs := make([]*proc, 2)
		for i, name := range []string{"hub-a", "hub-b"} {
			procs[i] = start(t, name, c.drover, "hub", "--kubeconfig", c.kubeconfig, "--hub-name", name,
				"--hub-listen", "127.0.0.1:0", "--mqtt-listen", "127.0.0.1:0", "--metrics-bind-address", "0",
				"--heartbeat-interval", heartbeatInterval.String(), "--offline-timeout", offlineTimeout.String())
			hubs[i] = procs[i].waitLine(t, regexp.MustCompile(`^ready hub=(\S+)$`), defaultTimeout)[1]
		}
		a := c.startAgent(t, "edge-move", t.TempDir(), "--hub", hubs[0]+","+hubs[1], "--token", c.token(t, true, time.Hour))
		n := c.waitPhase(t, "edge-move", fleetv1.FleetNodeOnline, defaultTimeout)
		if n.Status.Hub != "hub-a" {
			t.Fatalf("node connected to %q, want hub-a (first in --hub)", n.Status.Hub)
		}
		uid := n.UID

		// Watch every phase the node shows from here on.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var mu sync.Mutex
		seen := map[fleetv1.FleetNodePhase]int{}
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			for ctx.Err() == nil {
				var m fleetv1.FleetNode
				if err := c.client.Get(ctx, client.ObjectKey{Name: "edge-move"}, &m); err == nil {
					mu.Lock()
					seen[m.Status.Phase]++
					mu.Unlock()
				}
				select {
				case <-ctx.Done():
				case <-time.After(50 * time.Millisecond):
				}
			}
		}()
		offline := func() string {
			mu.Lock()
			defer mu.Unlock()
			if seen[fleetv1.FleetNodeOffline] > 0 {
				return fmt.Sprintf("the node went Offline while moving hubs (phases seen %v)", seen)
			}
			return ""
		}

		procs[0].stop(syscall.SIGKILL)
		testkit.Eventually(t, defaultTimeout, func() string {
			if why := offline(); why != "" {
				t.Fatal(why)
			}
			n, _ = c.node(t, "edge-move")
			if n.Status.Hub != "hub-b" {
				return fmt.Sprintf("node hub = %q, want hub-b", n.Status.Hub)
			}
			return ""
		})
		// Stay past the offline timeout: hub-a's death must not surface.
		testkit.Never(t, offlineTimeout+2*time.Second, offline)
		cancel()
		<-watched
		if why := offline(); why != "" {
			t.Error(why)
		}
		if seen[fleetv1.FleetNodeOnline] == 0 {
			t.Errorf("phases seen while moving hubs = %v, want Online only", seen)
		}
		n, _ = c.node(t, "edge-move")
		if r := meta.FindStatusCondition(n.Status.Conditions, fleetv1.ReadyCondition); r == nil || r.Reason != fleetv1.ReasonMovedHub {
			t.Errorf("Ready condition = %+v, want reason %s", r, fleetv1.ReasonMovedHub)
		}
		if n.UID != uid {
			t.Error("the FleetNode was re-created: the agent registered again instead of resuming")
		}
		if strings.Count(a.Output(), "registered; certificate saved") != 1 {
			t.Errorf("agent registered %d times, want once", strings.Count(a.Output(), "registered; certificate saved"))
		}
	})

	t.Run("a revoked node is disconnected and refused", func(t *testing.T) {
		dir := t.TempDir()
		a := c.startAgent(t, "edge-revoke", dir, "--hub", c.hub, "--token", c.token(t, true, time.Hour))
		c.waitPhase(t, "edge-revoke", fleetv1.FleetNodeOnline, defaultTimeout)
		if out, err := c.cli(t, "revoke", "edge-revoke"); err != nil {
			t.Fatalf("drover revoke = %q, %v", out, err)
		}
		if code := a.exited(t, defaultTimeout); code != 3 {
			t.Errorf("revoked agent exit code = %d, want 3", code)
		}
		if !strings.Contains(a.Output(), "revoked") {
			t.Errorf("revoked agent does not say why:\n%s", tail(a.Output(), 10))
		}
		c.waitPhase(t, "edge-revoke", fleetv1.FleetNodeRevoked, defaultTimeout)
		b := c.startAgent(t, "edge-revoke", dir, "--hub", c.hub)
		if code := b.exited(t, defaultTimeout); code != 3 || !strings.Contains(b.Output(), "revoked") {
			t.Errorf("restarted revoked agent: exit %d, output:\n%s", code, tail(b.Output(), 10))
		}
		_ = filepath.Join
	})
}

// TestNodeJobCLI drives a NodeUpgradeJob that needs confirmation through
// the CLI: the node waits until `drover confirm`, then its download fails
// (nothing listens on the URL) and it rolls back: what matters here is what
// an operator sees.
func TestNodeJobCLI(t *testing.T) {
	c := startCluster(t)
	c.startAgent(t, "edge-job", t.TempDir(), "--hub", c.hub, "--token", c.token(t, true, time.Hour), "--labels", "ring=canary")
	c.waitPhase(t, "edge-job", fleetv1.FleetNodeOnline, defaultTimeout)

	job := &opsv1.NodeUpgradeJob{ObjectMeta: metav1.ObjectMeta{Name: "canary"}, Spec: opsv1.NodeUpgradeJobSpec{
		LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"ring": "canary"}},
		Version:       "v0.0.2", RequireConfirmation: true,
		Artifact:     opsv1.AgentArtifact{URL: "https://example.com/drover-agent", SHA256: strings.Repeat("ab", 32)},
		JobExecution: opsv1.JobExecution{TimeoutSeconds: 3},
	}}
	if err := c.client.Create(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, defaultTimeout, func() string {
		out, err := c.cli(t, "get", "nuj")
		if err != nil || !regexp.MustCompile(`canary\s+(InProgress|Failure)\s+1\s`).MatchString(out) {
			return fmt.Sprintf("drover get nuj = %q, %v", out, err)
		}
		return ""
	})
	testkit.Eventually(t, defaultTimeout, func() string {
		out, err := c.cli(t, "describe", "nuj", "canary")
		// The seed's Confirm action, between Check and BackUp, waits.
		if err != nil || !regexp.MustCompile(`edge-job\s+InProgress\s+Confirm\s`).MatchString(out) || !regexp.MustCompile(`Confirm\s+waiting\s+since`).MatchString(out) {
			return fmt.Sprintf("not waiting for confirmation: %q, %v", out, err)
		}
		return ""
	})
	if out, err := c.cli(t, "confirm", "canary", "edge-job"); err != nil || !strings.Contains(out, "confirmed for edge-job") {
		t.Errorf("drover confirm = %q, %v", out, err)
	}
	testkit.Eventually(t, defaultTimeout, func() string {
		out, err := c.cli(t, "describe", "nodeupgradejob", "canary")
		if err != nil || !strings.Contains(out, "Phase:       Failure") || !regexp.MustCompile(`edge-job\s+Failure\s+RollBack`).MatchString(out) || !strings.Contains(out, "rolled back to v0.0.1-e2e") {
			return fmt.Sprintf("drover describe = %q, %v", out, err)
		}
		return ""
	})
	out, err := c.cli(t, "watch", "nuj", "canary", "--timeout", "10s")
	if err == nil || !strings.Contains(out, "Failure") || !strings.Contains(out, "edge-job Failure at RollBack") {
		t.Errorf("drover watch on a failed job = %q, %v; want the failures and a non-zero exit", out, err)
	}
	if out, err := c.cli(t, "abort", "nuj", "canary"); err == nil || !strings.Contains(out, "already ended") {
		t.Errorf("drover abort of an ended job = %q, %v", out, err)
	}
	if out, err := c.cli(t, "describe", "nuj", "nope"); err == nil || !strings.Contains(out, "not found") {
		t.Errorf("drover describe of a missing job = %q, %v", out, err)
	}
}
