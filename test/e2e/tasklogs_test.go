package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/testkit"
)

// TestTaskCLI: a task scheduled onto a real agent through `drover server`
// ends, and `drover get tasks`, `drover describe task` and `drover logs`
// show it (logs through the hub that serves the node, found from the API),
// with the admin's client certificate and with a token kubeconfig, whose
// token reaches no hub.
func TestTaskCLI(t *testing.T) {
	c := startCluster(t)
	stateDir := t.TempDir()
	c.startAgent(t, "edge-task", stateDir, "--hub", c.hub, "--token", c.token(t, true, time.Hour))
	c.waitPhase(t, "edge-task", fleetv1.FleetNodeOnline, defaultTimeout)

	ctx := context.Background()
	task := &batchv1.Task{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "probe"},
		Spec: batchv1.TaskSpec{Command: []string{"true"}, NodeName: "edge-task"}}
	if err := c.client.Create(ctx, task); err != nil {
		t.Fatal(err)
	}
	// drover server's manager schedules it on the pinned node, as attempt 1.
	// The agent ends it (Completed with the exec driver; Failed, with the
	// reason, without one): either way the hub wrote the end.
	testkit.Eventually(t, defaultTimeout, func() string {
		out, err := c.cli(t, "get", "tasks")
		if err != nil || !regexp.MustCompile(`probe\s+(Completed|Failed)\s+edge-task\s+1\s`).MatchString(out) {
			return fmt.Sprintf("drover get tasks = %q, %v", out, err)
		}
		return ""
	})
	out, err := c.cli(t, "describe", "task", "probe")
	if err != nil || !strings.Contains(out, "Command:") || !regexp.MustCompile(`Node:\s+edge-task`).MatchString(out) {
		t.Errorf("drover describe task = %q, %v", out, err)
	}
	if out, err := c.cli(t, "logs", "probe", "--ca-file", c.ca); err != nil {
		t.Errorf("drover logs = %q, %v", out, err)
	}
	if out, err := c.cli(t, "logs", "nope", "--ca-file", c.ca); err == nil || !strings.Contains(out, "not found") {
		t.Errorf("drover logs of a missing task = %q, %v", out, err)
	}
	// With a token kubeconfig: the token goes to the signer only, never
	// to a hub.
	c.checkTokenNeverReachesHubs(t, "default", "probe")
	// Its task dir removed, as the agent's collector does after
	// --task-retention: `drover logs` says so rather than print nothing.
	if err := c.client.Get(ctx, client.ObjectKeyFromObject(task), task); err != nil {
		t.Fatal(err)
	}
	if task.Status.State == batchv1.TaskCompleted { // the exec driver ran it
		dirs, err := filepath.Glob(filepath.Join(stateDir, "tasks", "*"))
		if err != nil || len(dirs) == 0 {
			t.Fatalf("the agent's task dirs: %v, %v", dirs, err)
		}
		for _, d := range dirs {
			if err := os.RemoveAll(d); err != nil {
				t.Fatal(err)
			}
		}
		if out, err := c.cli(t, "logs", "probe", "--ca-file", c.ca); err == nil || !strings.Contains(out, "were removed from this node") {
			t.Errorf("drover logs of a task whose logs were removed = %q, %v", out, err)
		}
	}
}
