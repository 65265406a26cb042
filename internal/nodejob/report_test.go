package nodejob

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
)

func TestApplyReportFollowsTheFlow(t *testing.T) {
	e := opsv1.NodeTaskStatus{NodeName: "n", Phase: opsv1.NodeTaskPhaseInProgress}
	steps := []struct {
		phase   string
		r       nodejobwire.Report
		want    opsv1.NodeTaskPhase
		changed bool
	}{
		{nodejobwire.PhaseRunning, nodejobwire.Report{Action: nodejobwire.Check, Success: true, Time: t0}, opsv1.NodeTaskPhaseInProgress, true},
		{nodejobwire.PhaseRunning, nodejobwire.Report{Action: nodejobwire.Check, Success: true, Time: t0}, opsv1.NodeTaskPhaseInProgress, false}, // re-sent
		{nodejobwire.PhaseRunning, nodejobwire.Report{Action: nodejobwire.BackUp, Success: true, Time: t0.Add(time.Second)}, opsv1.NodeTaskPhaseInProgress, true},
		{nodejobwire.PhaseRunning, nodejobwire.Report{Action: nodejobwire.Upgrade, Running: true, Time: t0.Add(2 * time.Second)}, opsv1.NodeTaskPhaseInProgress, true},
		{nodejobwire.PhaseRunning, nodejobwire.Report{Action: nodejobwire.Upgrade, Success: false, Reason: "digest mismatch", Time: t0.Add(3 * time.Second)}, opsv1.NodeTaskPhaseInProgress, true},
		{nodejobwire.PhaseFailed, nodejobwire.Report{Action: nodejobwire.RollBack, Success: true, Reason: "rolled back to v1.0.0", Time: t0.Add(4 * time.Second), CurrentVersion: "v1.0.0"}, opsv1.NodeTaskPhaseFailure, true},
	}
	for i, s := range steps {
		changed := ApplyReport(&e, s.phase, s.r, t0.Add(time.Duration(i)*time.Second), false)
		if changed != s.changed || e.Phase != s.want || e.Action != s.r.Action {
			t.Fatalf("step %d (%s %s): changed=%v phase=%s action=%s; want changed=%v phase=%s", i, s.phase, s.r.Action, changed, e.Phase, e.Action, s.changed, s.want)
		}
	}
	if len(e.ActionFlow) != 4 || e.ActionFlow[2].Action != nodejobwire.Upgrade || e.ActionFlow[2].Status != metav1.ConditionFalse {
		t.Errorf("action flow = %+v; want Check, BackUp, Upgrade(False), RollBack", e.ActionFlow)
	}
	if e.Reason != "RollBack: rolled back to v1.0.0" || e.CurrentVersion != "v1.0.0" {
		t.Errorf("reason %q version %q", e.Reason, e.CurrentVersion)
	}
	// A late report never revives a finished node.
	if ApplyReport(&e, nodejobwire.PhaseSucceeded, nodejobwire.Report{Action: nodejobwire.Upgrade, Success: true, Time: t0.Add(time.Hour)}, t0.Add(time.Hour), false); e.Phase != opsv1.NodeTaskPhaseFailure {
		t.Errorf("late success moved a failed node to %s", e.Phase)
	}
}

func TestApplyReportToAnUnknownNode(t *testing.T) {
	late := nodejobwire.Report{Action: nodejobwire.Pull, Success: true, Time: t0, Images: []nodejobwire.ImageResult{{Image: "nginx", Success: true}}}
	t.Run("job final: the phase stays, the detail is recorded", func(t *testing.T) {
		e := opsv1.NodeTaskStatus{NodeName: "n", Phase: opsv1.NodeTaskPhaseUnknown, Reason: "no report within 5m"}
		if !ApplyReport(&e, nodejobwire.PhaseSucceeded, late, t0, true) {
			t.Fatal("late report not recorded")
		}
		if e.Phase != opsv1.NodeTaskPhaseUnknown || e.Reason == "" || len(e.ImageStatus) != 1 || len(e.ActionFlow) != 1 {
			t.Errorf("entry = %+v", e)
		}
	})
	t.Run("job not final: the node follows the report", func(t *testing.T) {
		for _, tc := range []struct {
			phase string
			want  opsv1.NodeTaskPhase
		}{
			{nodejobwire.PhaseSucceeded, opsv1.NodeTaskPhaseSuccessful},
			{nodejobwire.PhaseRunning, opsv1.NodeTaskPhaseInProgress},
		} {
			e := opsv1.NodeTaskStatus{NodeName: "n", Phase: opsv1.NodeTaskPhaseUnknown, Reason: "no report within 5m0s of action Check"}
			if !ApplyReport(&e, tc.phase, late, t0.Add(time.Second), false) {
				t.Fatal("late report not applied")
			}
			if e.Phase != tc.want || e.Reason != "" || e.Action != nodejobwire.Pull || e.UpdateTime == nil || !e.UpdateTime.Time.Equal(t0.Add(time.Second)) {
				t.Errorf("%s: entry = %+v; want %s with the timeout's reason cleared", tc.phase, e, tc.want)
			}
		}
	})
}

func TestApplyReportRecordsConfirm(t *testing.T) {
	e := opsv1.NodeTaskStatus{NodeName: "n", Phase: opsv1.NodeTaskPhaseInProgress}
	ApplyReport(&e, nodejobwire.PhaseRunning, nodejobwire.Report{Action: nodejobwire.Check, Success: true, Time: t0}, t0, false)
	ApplyReport(&e, nodejobwire.PhaseRunning, nodejobwire.Report{Action: nodejobwire.Confirm, Running: true, Success: true, Reason: "waiting for confirmation", Time: t0.Add(time.Second)}, t0, false)
	done := nodejobwire.Report{Action: nodejobwire.Confirm, Success: true, Reason: "confirmed by alice", By: "alice", Time: t0.Add(time.Hour)}
	ApplyReport(&e, nodejobwire.PhaseRunning, done, t0.Add(time.Hour), false)
	if ApplyReport(&e, nodejobwire.PhaseRunning, done, t0.Add(time.Hour), false) {
		t.Error("the same end twice changed the entry")
	}
	if len(e.ActionFlow) != 2 {
		t.Fatalf("action flow = %+v; want Check, Confirm", e.ActionFlow)
	}
	c := e.ActionFlow[1]
	if c.Action != nodejobwire.Confirm || c.Status != metav1.ConditionTrue || c.By != "alice" || c.StartTime == nil ||
		!c.StartTime.Time.Equal(t0.Add(time.Second)) || !c.Time.Time.Equal(t0.Add(time.Hour)) {
		t.Errorf("Confirm record = %+v; want True, by alice, from t0+1s to t0+1h", c)
	}
}

func TestApplyReportBoundsTheRecord(t *testing.T) {
	e := opsv1.NodeTaskStatus{NodeName: "n", Phase: opsv1.NodeTaskPhaseInProgress}
	for i := range 20 {
		ApplyReport(&e, nodejobwire.PhaseRunning, nodejobwire.Report{Action: nodejobwire.Check, Success: i%2 == 0, Time: t0.Add(time.Duration(i) * time.Second)}, t0, false)
	}
	if len(e.ActionFlow) != maxActionRecords || !e.ActionFlow[0].Time.Equal(&metav1.Time{Time: t0}) {
		t.Errorf("len %d first %v", len(e.ActionFlow), e.ActionFlow[0].Time)
	}
}
