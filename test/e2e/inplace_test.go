package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
	"github.com/drover-fleet/drover/internal/testenv"
	"github.com/drover-fleet/drover/internal/testkit"
)

// planTimeout bounds a plan over two nodes updated one after another, each
// a real agent upgrade (download, swap, re-exec, reconnect).
const planTimeout = 3 * jobTimeout

// TestInPlaceAgentUpgrade runs an InPlaceUpdatePlan over two pools of real
// agents with the built-in agent-version updater: pool a, then pool b, each
// node upgraded in place through a one-node NodeUpgradeJob; then a plan
// whose artifact is corrupt fails naming node, updater and reason, and
// leaves the node at its version.
func TestInPlaceAgentUpgrade(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	v2 := testenv.Binary(t, "./cmd/drover-agent", "-X github.com/drover-fleet/drover/internal/agent/cmd.Version=v0.0.2-e2e")
	srv := httptest.NewServer(http.FileServer(http.Dir(filepath.Dir(v2))))
	t.Cleanup(srv.Close)

	agent := func(name, site string) string {
		dir := t.TempDir()
		bin := copyBinary(t, c.agent, dir)
		start(t, "drover-agent "+name, bin, "--node", name, "--state-dir", filepath.Join(dir, "state"), "--ca-file", c.ca,
			"--heartbeat-interval", heartbeatInterval.String(), "--hub", c.hub, "--token", c.token(t, true, time.Hour), "--labels", "site="+site)
		return bin
	}
	binA, binB := agent("ip-a-1", "ip-a"), agent("ip-b-1", "ip-b")
	binC := agent("ip-c-1", "ip-c")
	for _, n := range []string{"ip-a-1", "ip-b-1", "ip-c-1"} {
		c.waitPhase(t, n, fleetv1.FleetNodeOnline, defaultTimeout)
	}
	for _, site := range []string{"ip-a", "ip-b", "ip-c"} {
		if err := c.client.Create(ctx, &updatev1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: site},
			Spec: updatev1.NodePoolSpec{Selector: metav1.LabelSelector{MatchLabels: map[string]string{"site": site}}}}); err != nil {
			t.Fatal(err)
		}
	}
	template := func(name, sha string) updatev1.ObjectRef {
		tmpl := &updatev1.AgentVersionUpdateTaskTemplate{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: updatev1.AgentVersionUpdateTaskTemplateSpec{Template: updatev1.AgentVersionUpdateTaskTemplateResource{Spec: updatev1.AgentVersionUpdate{
				Version: "v0.0.2-e2e", Artifact: opsv1.AgentArtifact{URL: srv.URL + "/" + filepath.Base(v2), SHA256: sha}}}}}
		if err := c.client.Create(ctx, tmpl); err != nil {
			t.Fatal(err)
		}
		return updatev1.ObjectRef{APIVersion: updatev1.GroupVersion.String(), Kind: "AgentVersionUpdateTaskTemplate", Name: name}
	}
	waitPlan := func(name string) *updatev1.InPlaceUpdatePlan {
		p := &updatev1.InPlaceUpdatePlan{}
		testkit.Eventually(t, planTimeout, func() string {
			if err := c.client.Get(ctx, client.ObjectKey{Name: name}, p); err != nil {
				return err.Error()
			}
			if !p.Status.UpdateStatus.Done() {
				out, _ := c.cli(t, "describe", "plan", name)
				return "plan not ended:\n" + out
			}
			return ""
		})
		return p
	}

	t.Run("two pools in sequence, each node upgraded in place", func(t *testing.T) {
		ref := template("agent-v2", sha256File(t, v2))
		p := &updatev1.InPlaceUpdatePlan{ObjectMeta: metav1.ObjectMeta{Name: "agents-v2"}, Spec: updatev1.InPlaceUpdatePlanSpec{
			Pools:    []updatev1.PlanPool{{Name: "ip-a", Sequence: 1}, {Name: "ip-b", Sequence: 2}},
			Updaters: []updatev1.Updater{{Name: "agent", Sequence: 1, UpdaterUpdateTemplateRef: ref}},
		}}
		if err := c.client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		p = waitPlan("agents-v2")
		out, _ := c.cli(t, "describe", "plan", "agents-v2")
		if p.Status.UpdateStatus != updatev1.StatusUpdated || p.Status.Nodes.Updated != 2 {
			t.Fatalf("plan ended %s with %+v:\n%s", p.Status.UpdateStatus, p.Status.Nodes, out)
		}
		for _, want := range []string{"sequence 1", "pool ip-a: updated", "node ip-a-1: updated", "agent AgentVersionUpdateTask/", "sequence 2", "node ip-b-1: updated"} {
			if !strings.Contains(out, want) {
				t.Errorf("describe plan does not show %q:\n%s", want, out)
			}
		}
		for node, bin := range map[string]string{"ip-a-1": binA, "ip-b-1": binB} {
			if sha256File(t, bin) != sha256File(t, v2) {
				t.Errorf("%s: the binary on disk is not the new version", node)
			}
			testkit.Eventually(t, defaultTimeout, func() string {
				n, _ := c.node(t, node)
				if n.Status.AgentVersion != "v0.0.2-e2e" || n.Status.Phase != fleetv1.FleetNodeOnline || n.Spec.Unschedulable {
					return fmt.Sprintf("%s: version %q phase %s unschedulable %v", node, n.Status.AgentVersion, n.Status.Phase, n.Spec.Unschedulable)
				}
				return ""
			})
		}
		// Pool a finished before pool b started: its task ended first.
		var tasks updatev1.AgentVersionUpdateTaskList
		if err := c.client.List(ctx, &tasks, client.MatchingLabels{updatev1.LabelUpdateTaskName: "agents-v2"}); err != nil {
			t.Fatal(err)
		}
		var aEnd, bStart time.Time
		for _, tk := range tasks.Items {
			switch tk.Labels[updatev1.LabelNode] {
			case "ip-a-1":
				if cond := findCondition(tk.Status.Conditions, "Ready"); cond != nil {
					aEnd = cond.LastTransitionTime.Time
				}
			case "ip-b-1":
				bStart = tk.CreationTimestamp.Time
			}
		}
		if len(tasks.Items) != 2 || aEnd.IsZero() || bStart.Before(aEnd.Truncate(time.Second)) {
			t.Errorf("tasks %d; pool a's task ended %v, pool b's began %v: want b after a", len(tasks.Items), aEnd, bStart)
		}
	})

	t.Run("a corrupt artifact fails the plan naming node, updater and reason", func(t *testing.T) {
		ref := template("agent-corrupt", strings.Repeat("0", 64))
		p := &updatev1.InPlaceUpdatePlan{ObjectMeta: metav1.ObjectMeta{Name: "agents-corrupt"}, Spec: updatev1.InPlaceUpdatePlanSpec{
			Pools:    []updatev1.PlanPool{{Name: "ip-c", Sequence: 1}},
			Updaters: []updatev1.Updater{{Name: "agent", Sequence: 1, UpdaterUpdateTemplateRef: ref}},
		}}
		if err := c.client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		p = waitPlan("agents-corrupt")
		out, _ := c.cli(t, "describe", "plan", "agents-corrupt")
		cond := findCondition(p.Status.Conditions, updatev1.FailedCondition)
		if p.Status.UpdateStatus != updatev1.StatusFailed || cond == nil {
			t.Fatalf("plan ended %s (Failed condition %+v):\n%s", p.Status.UpdateStatus, cond, out)
		}
		for _, want := range []string{"ip-c-1", "agent", "digest mismatch"} {
			if !strings.Contains(cond.Message+out, want) {
				t.Errorf("the plan's Failed condition and describe do not name %q: %q\n%s", want, cond.Message, out)
			}
		}
		if sha256File(t, binC) != sha256File(t, c.agent) {
			t.Error("a corrupt download changed the binary")
		}
		n, _ := c.node(t, "ip-c-1")
		if n.Status.AgentVersion != "v0.0.1-e2e" {
			t.Errorf("node version %q, want v0.0.1-e2e kept", n.Status.AgentVersion)
		}
	})
}

func findCondition(conds []metav1.Condition, typ string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == typ {
			return &conds[i]
		}
	}
	return nil
}
