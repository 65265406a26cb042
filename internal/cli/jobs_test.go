package cli

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
)

// describe shows Confirm as an action of the flow: its wait, its end and
// who confirmed.
func TestActionLineShowsConfirm(t *testing.T) {
	start := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	end := metav1.NewTime(start.Add(time.Hour))
	tests := []struct {
		a    opsv1.ActionStatus
		want []string
	}{
		{opsv1.ActionStatus{Action: "Confirm", Status: "Unknown", Reason: "waiting for confirmation", Time: start},
			[]string{"Confirm", "waiting", "since 2026-01-02T03:04:05Z"}},
		{opsv1.ActionStatus{Action: "Confirm", Status: "True", Reason: "confirmed by alice", Time: end, StartTime: &start, By: "alice"},
			[]string{"Confirm", "succeeded", "2026-01-02T03:04:05Z → 2026-01-02T04:04:05Z", "by alice"}},
		{opsv1.ActionStatus{Action: "Check", Status: "False", Reason: "disk 95% > 90%", Time: start},
			[]string{"Check", "failed", "at 2026-01-02T03:04:05Z", "disk 95%"}},
	}
	for _, tt := range tests {
		got := actionLine(tt.a)
		for _, w := range tt.want {
			if !strings.Contains(got, w) {
				t.Errorf("actionLine(%s %s) = %q; want it to contain %q", tt.a.Action, tt.a.Status, got, w)
			}
		}
	}
}
