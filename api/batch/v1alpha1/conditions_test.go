package v1alpha1_test

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
)

func TestSetEndConditions(t *testing.T) {
	now := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name                   string
		policy                 batchv1.RestartPolicy
		maxAttempts, attempt   int32
		state                  batchv1.TaskState
		reason                 string
		final                  bool
		wantComplete, wantFail bool
		wantReason             string
	}{
		{"completed", "", 0, 1, batchv1.TaskCompleted, "Completed", false, true, false, "Completed"},
		{"failed, restart Never", batchv1.RestartNever, 3, 1, batchv1.TaskFailed, "ExitCode", false, false, true, "ExitCode"},
		{"failed, unset policy is Never", "", 0, 1, batchv1.TaskFailed, "timeout", false, false, true, "timeout"},
		{"failed with attempts left: not yet", batchv1.RestartOnFailure, 3, 2, batchv1.TaskFailed, "ExitCode", false, false, false, ""},
		{"failed, last attempt", batchv1.RestartOnFailure, 3, 3, batchv1.TaskFailed, "ExitCode", false, false, true, "ExitCode"},
		{"failed, default of 3 attempts", batchv1.RestartOnFailure, 0, 3, batchv1.TaskFailed, "Signal", false, false, true, "Signal"},
		{"the manager gave up", batchv1.RestartOnFailure, 3, 1, batchv1.TaskFailed, "NodeLost", true, false, true, "NodeLost"},
		{"a reason no condition may hold", "", 0, 1, batchv1.TaskFailed, "not a word", false, false, true, "Failed"},
		{"running", "", 0, 1, batchv1.TaskRunning, "Started", false, false, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tk := &batchv1.Task{Spec: batchv1.TaskSpec{RestartPolicy: tt.policy, MaxAttempts: tt.maxAttempts},
				Status: batchv1.TaskStatus{State: tt.state, Reason: tt.reason, Attempt: tt.attempt,
					// Left by an earlier end: must go when it no longer holds.
					Conditions: []metav1.Condition{{Type: batchv1.ConditionComplete, Status: metav1.ConditionTrue, Reason: "Old"}}}}
			batchv1.SetEndConditions(tk, tt.final, now)
			if got := meta.IsStatusConditionTrue(tk.Status.Conditions, batchv1.ConditionComplete); got != tt.wantComplete {
				t.Errorf("Complete = %v, want %v", got, tt.wantComplete)
			}
			f := meta.FindStatusCondition(tk.Status.Conditions, batchv1.ConditionFailed)
			if (f != nil) != tt.wantFail || f != nil && (f.Status != metav1.ConditionTrue || f.Reason != tt.wantReason) {
				t.Errorf("Failed = %+v, want present %v with reason %q", f, tt.wantFail, tt.wantReason)
			}
			if batchv1.SetEndConditions(tk, tt.final, now.Add(time.Minute)) {
				t.Error("a second call changed the conditions again")
			}
		})
	}
}
