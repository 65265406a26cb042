package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
)

func TestPrintTasks(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	code := int32(3)
	tasks := []client.Object{
		&batchv1.Task{ObjectMeta: metav1.ObjectMeta{Namespace: "robots", Name: "b", CreationTimestamp: metav1.NewTime(now.Add(-2 * time.Minute))},
			Status: batchv1.TaskStatus{State: batchv1.TaskFailed, NodeName: "edge-1", Attempt: 2, ExitCode: &code, Reason: "ExitCode"}},
		&batchv1.Task{ObjectMeta: metav1.ObjectMeta{Namespace: "robots", Name: "a", CreationTimestamp: metav1.NewTime(now.Add(-time.Hour))}},
	}
	var out bytes.Buffer
	printBatch(&out, "Task", tasks, false, now)
	want := "NAME   STATE    NODE     ATTEMPT   EXIT     REASON     AGE\n" +
		"a      <none>   <none>   <none>    <none>   <none>     60m\n" +
		"b      Failed   edge-1   2         3        ExitCode   2m\n"
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
}

func TestDescribeTask(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	started := metav1.NewTime(now.Add(-time.Minute))
	code := int32(137)
	task := &batchv1.Task{
		ObjectMeta: metav1.ObjectMeta{Namespace: "robots", Name: "survey-3", Labels: map[string]string{batchv1.LabelTaskGroup: "survey"}},
		Spec: batchv1.TaskSpec{Command: []string{"/bin/sh", "-c", "echo $HOME; sleep 9"}, RestartPolicy: batchv1.RestartOnFailure,
			ReschedulePolicy: batchv1.RescheduleOnNodeLost, MaxAttempts: 3, Timeout: &metav1.Duration{Duration: time.Minute}},
		Status: batchv1.TaskStatus{State: batchv1.TaskRunning, NodeName: "edge-2", Attempt: 2, StartTime: &started,
			History:    []batchv1.TaskAttempt{{Attempt: 1, Node: "edge-1", State: batchv1.TaskFailed, Reason: "timeout", ExitCode: &code, OutputTail: "stuck\n"}},
			OutputTail: "first line\nsecond line\n"},
	}
	var out bytes.Buffer
	describeTask(&out, task, now)
	for _, want := range []string{
		"Name:            survey-3", "TaskGroup:       survey",
		`Command:         /bin/sh -c "echo $HOME; sleep 9"`,
		"Timeout:         1m0s",
		"OnFailure, reschedule OnNodeLost, at most 3 attempts",
		"  State:         Running", "  Node:          edge-2", "  Attempt:       2",
		"  1         edge-1   Failed    timeout   137",
		"  2 (now)   edge-2   Running   <none>",
		"  first line\n  second line\n",
		"Output of attempt 1 (tail; `drover logs --previous`):\n  stuck\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("describe lacks %q:\n%s", want, out.String())
		}
	}
}

func TestDescribeEvents(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	evs := []corev1.Event{
		{Type: "Normal", Reason: "CleanedUp", Message: "node edge-1 confirmed attempt 1 stopped", ReportingController: "drover-hub",
			EventTime: metav1.NewMicroTime(now.Add(-time.Second))},
		{Type: "Normal", Reason: "Cancelled", Message: "task deleted: asked node edge-1 to stop attempt 1", ReportingController: "drover-hub",
			EventTime: metav1.NewMicroTime(now.Add(-3 * time.Second))},
	}
	var out bytes.Buffer
	describeEvents(&out, evs, now)
	want := "Events:\n" +
		"  TYPE    REASON     AGE  FROM        MESSAGE\n" +
		"  Normal  Cancelled  3s   drover-hub  task deleted: asked node edge-1 to stop attempt 1\n" +
		"  Normal  CleanedUp  1s   drover-hub  node edge-1 confirmed attempt 1 stopped\n"
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
	out.Reset()
	describeEvents(&out, nil, now)
	if out.String() != "Events:  <none>\n" {
		t.Errorf("no events: %q", out.String())
	}
}

func TestPreviousOutput(t *testing.T) {
	tk := &batchv1.Task{ObjectMeta: metav1.ObjectMeta{Namespace: "robots", Name: "t"}, Status: batchv1.TaskStatus{Attempt: 1}}
	if _, err := previousOutput(tk); err == nil || !strings.Contains(err.Error(), "no previous attempt") {
		t.Errorf("first attempt: %v", err)
	}
	tk.Status.Attempt = 3
	tk.Status.History = []batchv1.TaskAttempt{{Attempt: 1, OutputTail: "old"}, {Attempt: 2, Node: "edge-1", State: batchv1.TaskFailed}}
	if _, err := previousOutput(tk); err == nil || !strings.Contains(err.Error(), "attempt 2 of task robots/t (Failed on node edge-1) left no output") {
		t.Errorf("no tail: %v", err)
	}
	tk.Status.History[1].OutputTail = "segfault\n"
	if out, err := previousOutput(tk); err != nil || out != "segfault\n" {
		t.Errorf("previousOutput = %q, %v", out, err)
	}
}
