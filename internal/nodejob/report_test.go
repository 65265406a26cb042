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
		changed := ApplyReport(&e, s.phase, s.r, t0.Add(time.Duration(i)*time.Second))
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
	if ApplyReport(&e, nodejobwire.PhaseSucceeded, nodejobwire.Report{Action: nodejobwire.Upgrade, Success: true, Time: t0.Add(time.Hour)}, t0.Add(time.Hour)); e.Phase != opsv1.NodeTaskPhaseFailure {
		t.Errorf("late success moved a failed node to %s", e.Phase)
	}
}

func TestApplyReportKeepsUnknownButRecordsDetail(t *testing.T) {
	e := opsv1.NodeTaskStatus{NodeName: "n", Phase: opsv1.NodeTaskPhaseUnknown, Reason: "no report within 5m"}
	if !ApplyReport(&e, nodejobwire.PhaseSucceeded, nodejobwire.Report{Action: nodejobwire.Pull, Success: true, Time: t0, Images: []nodejobwire.ImageResult{{Image: "nginx", Success: true}}}, t0) {
		t.Fatal("late report not recorded")
	}
	if e.Phase != opsv1.NodeTaskPhaseUnknown || len(e.ImageStatus) != 1 || len(e.ActionFlow) != 1 {
		t.Errorf("entry = %+v", e)
	}
}

func TestApplyReportBoundsTheRecord(t *testing.T) {
	e := opsv1.NodeTaskStatus{NodeName: "n", Phase: opsv1.NodeTaskPhaseInProgress}
	for i := range 20 {
		ApplyReport(&e, nodejobwire.PhaseRunning, nodejobwire.Report{Action: nodejobwire.Check, Success: i%2 == 0, Time: t0.Add(time.Duration(i) * time.Second)}, t0)
	}
	if len(e.ActionFlow) != maxActionRecords || !e.ActionFlow[0].Time.Equal(&metav1.Time{Time: t0}) {
		t.Errorf("len %d first %v", len(e.ActionFlow), e.ActionFlow[0].Time)
	}
}
