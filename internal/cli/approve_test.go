package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
)

// TestPrintNodesWideShowsTheKey: `drover get nodes -o wide` shows the key
// each node registered with, for comparing with what its agent logs.
func TestPrintNodesWideShowsTheKey(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	const key = "3f2a9c0d5e6b7a8190aabbccddeeff00112233445566778899aabbccddeeff00"
	nodes := []fleetv1.FleetNode{
		{ObjectMeta: metav1.ObjectMeta{Name: "edge-1", CreationTimestamp: metav1.NewTime(now.Add(-time.Hour)),
			Annotations: map[string]string{fleetv1.AnnotationRegistrationKey: key}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "edge-0", CreationTimestamp: metav1.NewTime(now.Add(-time.Hour))}},
	}
	var out bytes.Buffer
	printNodes(&out, nodes, now, true)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.HasSuffix(lines[0], "KEY-SHA256") || !strings.HasSuffix(lines[1], "<not recorded>") || !strings.HasSuffix(lines[2], key) {
		t.Errorf("got\n%s", out.String())
	}
	out.Reset()
	printNodes(&out, nodes, now, false)
	if strings.Contains(out.String(), "KEY") {
		t.Errorf("the narrow list shows keys:\n%s", out.String())
	}
}
