package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
)

func TestLiveBarShowsProgressAndCounts(t *testing.T) {
	var out bytes.Buffer
	l := newLiveBar(context.Background(), &out, "agents-v2", 120)
	l.set(&opsv1.NodeJobStatus{Phase: opsv1.JobPhaseInProgress, Counts: opsv1.NodeTaskCounts{Total: 10, Successful: 3, InProgress: 7}})
	l.set(&opsv1.NodeJobStatus{Phase: opsv1.JobPhaseCompleted, Counts: opsv1.NodeTaskCounts{Total: 10, Successful: 9, Failure: 1}})
	l.stop()
	l.stop() // idempotent
	got := out.String()
	for _, want := range []string{"agents-v2", "10/10 nodes", "Completed", "9 ok, 1 failed"} {
		if !strings.Contains(got, want) {
			t.Errorf("bar output lacks %q:\n%s", want, got)
		}
	}
	if isTerminal(&out) {
		t.Error("a buffer taken for a terminal")
	}
}
