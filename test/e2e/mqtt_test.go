package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/testkit"
)

var mqttLineRE = regexp.MustCompile(`^\s+mqtt:\s+(ssl://\S+)$`)

// TestTaskOverMQTT: a real drover-agent with --transport mqtt, against the
// broker `drover server` embeds, goes Online, runs a task to its end, and
// serves its logs (log requests and chunks cross MQTT too).
func TestTaskOverMQTT(t *testing.T) {
	c := startCluster(t)
	broker := c.server.waitLine(t, mqttLineRE, defaultTimeout)[1]
	const node = "edge-mqtt"
	agent := c.startAgent(t, node, t.TempDir(), "--hub", c.hub, "--token", c.token(t, true, time.Hour),
		"--transport", "mqtt", "--mqtt-broker", broker)
	c.waitPhase(t, node, fleetv1.FleetNodeOnline, defaultTimeout)
	if !strings.Contains(agent.Output(), "mqtt connected") {
		t.Fatalf("the agent did not connect over MQTT; output:\n%s", tail(agent.Output(), 40))
	}

	ctx := context.Background()
	task := &batchv1.Task{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "mqtt-probe"},
		Spec: batchv1.TaskSpec{Command: []string{"echo", "hello over mqtt"}, NodeName: node}}
	if err := c.client.Create(ctx, task); err != nil {
		t.Fatal(err)
	}
	// drover server's manager schedules it on the pinned node, as attempt 1.
	testkit.Eventually(t, defaultTimeout, func() string {
		out, err := c.cli(t, "get", "tasks")
		if err != nil || !regexp.MustCompile(`mqtt-probe\s+Completed\s+`+node+`\s+1\s`).MatchString(out) {
			return fmt.Sprintf("drover get tasks = %q, %v", out, err)
		}
		return ""
	})
	out, err := c.cli(t, "logs", "mqtt-probe", "--ca-file", c.ca)
	if err != nil || !strings.Contains(out, "hello over mqtt") {
		t.Errorf("drover logs = %q, %v; want the task's output", out, err)
	}
}
