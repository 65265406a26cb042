package taskhub

import (
	"testing"
	"time"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	"github.com/drover-fleet/drover/internal/task/taskwire"
)

func TestApply(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	three := int32(3)
	started := now.Add(-time.Minute).Format(time.RFC3339Nano)
	full := func(phase, reason string, r taskwire.Report) report {
		return report{phase: phase, reason: reason, r: r, full: true}
	}
	bare := func(phase, reason string) report { return report{phase: phase, reason: reason} }
	tests := []struct {
		name    string
		st      batchv1.TaskStatus
		p       pending
		changed bool
		want    batchv1.TaskState
		check   func(t *testing.T, st batchv1.TaskStatus)
	}{
		{"dispatched", batchv1.TaskStatus{State: batchv1.TaskScheduled, NodeName: "n", Attempt: 1},
			pending{node: "n", attempt: 1, dispatched: true}, true, batchv1.TaskDispatching, nil},
		{"another attempt's report", batchv1.TaskStatus{State: batchv1.TaskScheduled, NodeName: "n", Attempt: 2},
			pending{node: "n", attempt: 1, reports: []report{full(taskwire.PhaseFailed, taskwire.ReasonExitCode, taskwire.Report{ExitCode: &three})}}, false, batchv1.TaskScheduled, nil},
		{"another node's report", batchv1.TaskStatus{State: batchv1.TaskRunning, NodeName: "m", Attempt: 1},
			pending{node: "n", attempt: 1, reports: []report{full(taskwire.PhaseSucceeded, "", taskwire.Report{})}}, false, batchv1.TaskRunning, nil},
		{"running then failed in one write", batchv1.TaskStatus{State: batchv1.TaskDispatching, NodeName: "n", Attempt: 1},
			pending{node: "n", attempt: 1, reports: []report{
				full(taskwire.PhaseRunning, "Started", taskwire.Report{StartTime: started}),
				full(taskwire.PhaseFailed, taskwire.ReasonExitCode, taskwire.Report{ExitCode: &three, OutputTail: "oops", Message: "exited with code 3"}),
			}}, true, batchv1.TaskFailed, func(t *testing.T, st batchv1.TaskStatus) {
				if st.ExitCode == nil || *st.ExitCode != 3 || st.Reason != taskwire.ReasonExitCode || st.OutputTail != "oops" || st.StartTime == nil || st.FinishTime == nil {
					t.Errorf("status %+v", st)
				}
			}},
		{"no going back", batchv1.TaskStatus{State: batchv1.TaskCompleted, NodeName: "n", Attempt: 1},
			pending{node: "n", attempt: 1, dispatched: true, reports: []report{full(taskwire.PhaseRunning, "Started", taskwire.Report{})}}, false, batchv1.TaskCompleted, nil},
		{"a bare end, then its report fills in", batchv1.TaskStatus{State: batchv1.TaskRunning, NodeName: "n", Attempt: 1},
			pending{node: "n", attempt: 1, reports: []report{
				bare(taskwire.PhaseFailed, taskwire.ReasonExitCode),
				full(taskwire.PhaseFailed, taskwire.ReasonExitCode, taskwire.Report{ExitCode: &three}),
			}}, true, batchv1.TaskFailed, func(t *testing.T, st batchv1.TaskStatus) {
				if st.ExitCode == nil || *st.ExitCode != 3 {
					t.Errorf("exit code %v, want 3 from the later report", st.ExitCode)
				}
			}},
		{"an agent's sentence is a message", batchv1.TaskStatus{State: batchv1.TaskRunning, NodeName: "n", Attempt: 1},
			pending{node: "n", attempt: 1, reports: []report{bare(taskwire.PhaseFailed, "the agent restarted while the work was running")}},
			true, batchv1.TaskFailed, func(t *testing.T, st batchv1.TaskStatus) {
				if st.Reason != taskwire.PhaseFailed || st.Message != "the agent restarted while the work was running" {
					t.Errorf("reason %q, message %q", st.Reason, st.Message)
				}
			}},
		{"succeeded without an exit code means 0", batchv1.TaskStatus{State: batchv1.TaskRunning, NodeName: "n", Attempt: 1},
			pending{node: "n", attempt: 1, reports: []report{full(taskwire.PhaseSucceeded, "", taskwire.Report{})}}, true, batchv1.TaskCompleted,
			func(t *testing.T, st batchv1.TaskStatus) {
				if st.ExitCode == nil || *st.ExitCode != 0 || st.Reason != ReasonCompleted {
					t.Errorf("exit code %v, reason %q", st.ExitCode, st.Reason)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := tt.st
			p := tt.p
			if got := apply(&st, &p, "hub-1", now); got != tt.changed {
				t.Errorf("changed = %v, want %v", got, tt.changed)
			}
			if st.State != tt.want {
				t.Errorf("state %s, want %s", st.State, tt.want)
			}
			if tt.check != nil {
				tt.check(t, st)
			}
		})
	}
}
