package inplace

import (
	"reflect"
	"strings"
	"testing"
	"time"

	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
)

// now is the fake clock's time for the pure rules: they take it as input.
var now = time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)

var updaters = []updatev1.Updater{{Name: "version", Sequence: 3}, {Name: "os", Sequence: 1}, {Name: "ntp", Sequence: 2}}

func TestStepNode(t *testing.T) {
	upd := func(s updatev1.UpdateStatus) TaskView {
		return TaskView{UpdatePhase: updatev1.PhaseUpdating, UpdateStatus: s}
	}
	tests := []struct {
		name       string
		in         NodeInput
		wantCreate string
		wantAbort  []string
		wantStatus updatev1.UpdateStatus
		wantReason string
		wantMsg    string
	}{
		{"updaters start by sequence, lowest first", NodeInput{Phase: updatev1.PhaseUpdating, Updaters: updaters},
			"os", nil, updatev1.StatusUpdating, updatev1.ReasonUpdating, ""},
		{"the next updater waits for the one before", NodeInput{Phase: updatev1.PhaseUpdating, Updaters: updaters, Tasks: map[string]TaskView{"os": upd(updatev1.StatusUpdating)}},
			"", nil, updatev1.StatusUpdating, updatev1.ReasonUpdating, ""},
		{"then starts", NodeInput{Phase: updatev1.PhaseUpdating, Updaters: updaters, Tasks: map[string]TaskView{"os": upd(updatev1.StatusUpdated)}},
			"ntp", nil, updatev1.StatusUpdating, updatev1.ReasonUpdating, ""},
		{"every task updated: the node is updated", NodeInput{Phase: updatev1.PhaseUpdating, Updaters: updaters, Tasks: map[string]TaskView{"os": upd(updatev1.StatusUpdated), "ntp": upd(updatev1.StatusUpdated), "version": upd(updatev1.StatusUpdated)}},
			"", nil, updatev1.StatusUpdated, updatev1.ReasonUpdated, ""},
		{"a terminal failure fails the node naming updater and reason", NodeInput{Phase: updatev1.PhaseUpdating, Updaters: updaters, Tasks: map[string]TaskView{"os": upd(updatev1.StatusUpdated), "ntp": {UpdatePhase: updatev1.PhaseUpdating, UpdateStatus: updatev1.StatusFailed, Reason: "ServerUnreachable", Message: "no NTP server answers"}}},
			"", nil, updatev1.StatusFailed, updatev1.ReasonUpdaterFailed, "updater ntp failed: ServerUnreachable"},
		{"aborting aborts the running task", NodeInput{Phase: updatev1.PhaseAborting, Updaters: updaters, Now: now, AbortingSince: now, Tasks: map[string]TaskView{"os": upd(updatev1.StatusUpdated), "ntp": upd(updatev1.StatusUpdating)}},
			"", []string{"ntp"}, updatev1.StatusAborting, updatev1.ReasonAborting, ""},
		{"aborted once every task ended", NodeInput{Phase: updatev1.PhaseAborting, Updaters: updaters, Now: now, AbortingSince: now, Tasks: map[string]TaskView{"os": upd(updatev1.StatusUpdated), "ntp": {UpdatePhase: updatev1.PhaseAborting, UpdateStatus: updatev1.StatusAborted}}},
			"", nil, updatev1.StatusAborted, updatev1.ReasonAborted, ""},
		{"every updater done before the abort: updated, never half", NodeInput{Phase: updatev1.PhaseAborting, Updaters: updaters, Now: now, AbortingSince: now, Tasks: map[string]TaskView{"os": upd(updatev1.StatusUpdated), "ntp": upd(updatev1.StatusUpdated), "version": upd(updatev1.StatusUpdated)}},
			"", nil, updatev1.StatusUpdated, updatev1.ReasonUpdated, ""},
		{"a task that does not abort within the timeout ends aborted, AbortTimeout", NodeInput{Phase: updatev1.PhaseAborting, Updaters: updaters, Now: now.Add(DefaultAbortTimeout), AbortingSince: now, Tasks: map[string]TaskView{"os": {UpdatePhase: updatev1.PhaseAborting, UpdateStatus: updatev1.StatusAborting}}},
			"", nil, updatev1.StatusAborted, updatev1.ReasonAbortTimeout, "did not report aborted within 10m0s"},
		{"no task yet: aborted at once", NodeInput{Phase: updatev1.PhaseAborting, Updaters: updaters, Now: now},
			"", nil, updatev1.StatusAborted, updatev1.ReasonAborted, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := StepNode(tt.in)
			if d.Create != tt.wantCreate || !reflect.DeepEqual(d.Abort, tt.wantAbort) || d.Status != tt.wantStatus || d.Reason != tt.wantReason || !strings.Contains(d.Message, tt.wantMsg) {
				t.Errorf("StepNode() = create %q abort %v status %q reason %q (%s), want %q %v %q %q (%s)",
					d.Create, d.Abort, d.Status, d.Reason, d.Message, tt.wantCreate, tt.wantAbort, tt.wantStatus, tt.wantReason, tt.wantMsg)
			}
		})
	}
}

func TestStepNodeAbortingRequeuesAtTheTimeout(t *testing.T) {
	d := StepNode(NodeInput{Phase: updatev1.PhaseAborting, Updaters: updaters, Now: now.Add(4 * time.Minute), AbortingSince: now,
		Tasks: map[string]TaskView{"os": {UpdatePhase: updatev1.PhaseAborting, UpdateStatus: updatev1.StatusAborting}}})
	if d.RequeueAfter != 6*time.Minute {
		t.Errorf("RequeueAfter = %v, want 6m", d.RequeueAfter)
	}
}

func TestStepNodeDrains(t *testing.T) {
	running := []string{"team-a/sim-1", "team-b/build-7"}
	tests := []struct {
		name       string
		in         NodeInput
		wantCreate string
		wantStatus updatev1.UpdateStatus
		wantReason string
		wantMsg    string
		wantAfter  time.Duration
	}{
		{"tasks running: the first updater waits", NodeInput{Drain: &DrainView{Running: running, Since: now.Add(-time.Minute), Timeout: 10 * time.Minute}},
			"", updatev1.StatusUpdating, updatev1.ReasonDraining, "waiting for 2 task(s) to end before the update (drain timeout 10m0s): [team-a/sim-1 team-b/build-7]", DrainPoll},
		{"near the timeout it looks again at the timeout", NodeInput{Drain: &DrainView{Running: running, Since: now.Add(-10*time.Minute + 2*time.Second), Timeout: 10 * time.Minute}},
			"", updatev1.StatusUpdating, updatev1.ReasonDraining, "", 2 * time.Second},
		{"the timeout fails the node and stops nothing", NodeInput{Drain: &DrainView{Running: running, Since: now.Add(-11 * time.Minute)}},
			"", updatev1.StatusFailed, updatev1.ReasonDrainTimeout, "2 task(s) still running after the pool's drain timeout of 10m0s", 0},
		{"drained: the first updater starts", NodeInput{Drain: &DrainView{Since: now.Add(-time.Minute)}},
			"os", updatev1.StatusUpdating, updatev1.ReasonUpdating, "", 0},
		{"once an updater started, tasks no longer hold it", NodeInput{Drain: &DrainView{Running: running, Since: now.Add(-time.Hour)}, Tasks: map[string]TaskView{"os": {UpdatePhase: updatev1.PhaseUpdating, UpdateStatus: updatev1.StatusUpdated}}},
			"ntp", updatev1.StatusUpdating, updatev1.ReasonUpdating, "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.in
			in.Phase, in.Updaters, in.Now = updatev1.PhaseUpdating, updaters, now
			d := StepNode(in)
			if d.Create != tt.wantCreate || d.Status != tt.wantStatus || d.Reason != tt.wantReason || !strings.Contains(d.Message, tt.wantMsg) || d.RequeueAfter != tt.wantAfter {
				t.Errorf("StepNode() = create %q status %s reason %s after %s message %q; want %q %s %s %s containing %q",
					d.Create, d.Status, d.Reason, d.RequeueAfter, d.Message, tt.wantCreate, tt.wantStatus, tt.wantReason, tt.wantAfter, tt.wantMsg)
			}
		})
	}
}
