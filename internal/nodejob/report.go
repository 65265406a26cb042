package nodejob

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
)

// maxActionRecords is NodeTaskStatus.ActionFlow's MaxItems.
const maxActionRecords = 8

// ApplyReport merges one agent report into a node's entry and reports
// whether it changed anything. phase is the WorkStatus phase (nodejobwire.Phase*).
//
// A report is applied at least once, maybe twice: the same report again
// changes nothing. A node already Successful or Failure keeps its phase,
// and so does an Unknown one (the manager gave up on it and counted it), but
// its record of actions still takes late reports: the detail stays true.
func ApplyReport(e *opsv1.NodeTaskStatus, phase string, r nodejobwire.Report, now time.Time) bool {
	at := metav1.NewTime(r.Time.Truncate(time.Second))
	if r.Time.IsZero() {
		at = metav1.NewTime(now.Truncate(time.Second))
	}
	status := metav1.ConditionTrue
	switch {
	case r.Running:
		status = metav1.ConditionUnknown
	case !r.Success:
		status = metav1.ConditionFalse
	}
	rec := opsv1.ActionStatus{Action: r.Action, Status: status, Reason: nodejobwire.Clip(r.Reason, 256), Time: at}
	changed := false
	n := len(e.ActionFlow)
	switch {
	case n > 0 && e.ActionFlow[n-1].Action == r.Action && e.ActionFlow[n-1].Status == metav1.ConditionUnknown:
		// The action that was running ended (or reports again while running).
		if e.ActionFlow[n-1] != rec {
			e.ActionFlow[n-1] = rec
			changed = true
		}
	case n > 0 && e.ActionFlow[n-1] == rec:
		// A re-sent report.
	default:
		e.ActionFlow = append(e.ActionFlow, rec)
		if len(e.ActionFlow) > maxActionRecords {
			// Keep the first action (where it started) and the latest ones.
			e.ActionFlow = append(e.ActionFlow[:1], e.ActionFlow[len(e.ActionFlow)-maxActionRecords+1:]...)
		}
		changed = true
	}
	set := func(dst *string, v string) {
		if v != "" && *dst != v {
			*dst, changed = v, true
		}
	}
	set(&e.CurrentVersion, r.CurrentVersion)
	set(&e.HistoricVersion, r.HistoricVersion)
	if len(r.Images) > 0 {
		imgs := make([]opsv1.ImageStatus, 0, len(r.Images))
		for _, im := range r.Images {
			st := metav1.ConditionTrue
			if !im.Success {
				st = metav1.ConditionFalse
			}
			imgs = append(imgs, opsv1.ImageStatus{Image: im.Image, Status: st, Reason: nodejobwire.Clip(im.Reason, 256)})
		}
		if !equalImages(e.ImageStatus, imgs) {
			e.ImageStatus, changed = imgs, true
		}
	}
	if e.Phase != opsv1.NodeTaskPhaseInProgress && e.Phase != opsv1.NodeTaskPhasePending {
		return changed
	}
	next := opsv1.NodeTaskPhaseInProgress
	reason := ""
	switch phase {
	case nodejobwire.PhaseSucceeded:
		next = opsv1.NodeTaskPhaseSuccessful
	case nodejobwire.PhaseFailed:
		next, reason = opsv1.NodeTaskPhaseFailure, nodejobwire.Clip(r.Action+": "+r.Reason, 512)
	}
	if e.Phase != next || e.Action != r.Action || (reason != "" && e.Reason != reason) || (next == opsv1.NodeTaskPhaseInProgress && e.Reason != "") {
		e.Phase, e.Action, e.Reason = next, r.Action, reason
		changed = true
	}
	if changed {
		t := metav1.NewTime(now.Truncate(time.Second))
		e.UpdateTime = &t
	}
	return changed
}

func equalImages(a, b []opsv1.ImageStatus) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
