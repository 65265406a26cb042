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
// whether it changed anything. phase is the WorkStatus phase
// (nodejobwire.Phase*); now is when the hub received the report: the
// entry's updateTime, from which the manager's timeout counts.
//
// A report is applied at least once, maybe twice: the same report again
// changes nothing. A node already Successful or Failure keeps its phase.
// An Unknown one (the manager gave up waiting) follows the report while
// the job is not final (jobFinal false): the node was slow, not lost, and
// the timeout's reason goes. Once the job is final the phase stays, but
// the record of actions still takes late reports: the detail stays true.
func ApplyReport(e *opsv1.NodeTaskStatus, phase string, r nodejobwire.Report, now time.Time, jobFinal bool) bool {
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
	rec := opsv1.ActionStatus{Action: r.Action, Status: status, Reason: nodejobwire.Clip(r.Reason, 256), Time: at, By: nodejobwire.Clip(r.By, 253)}
	changed := false
	n := len(e.ActionFlow)
	switch {
	case n > 0 && e.ActionFlow[n-1].Action == r.Action && e.ActionFlow[n-1].Status == metav1.ConditionUnknown:
		// The action that was running ended (or reports again while
		// running): an end keeps when it started.
		if old := e.ActionFlow[n-1]; status != metav1.ConditionUnknown {
			start := old.StartTime
			if start == nil && !old.Time.Equal(&rec.Time) {
				start = old.Time.DeepCopy()
			}
			rec.StartTime = start
		}
		if !sameRecord(e.ActionFlow[n-1], rec) {
			e.ActionFlow[n-1] = rec
			changed = true
		}
	case n > 0 && sameRecord(e.ActionFlow[n-1], rec), n > 0 && e.ActionFlow[n-1].Action == r.Action && sameEnd(e.ActionFlow[n-1], rec):
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
	follows := e.Phase == opsv1.NodeTaskPhaseInProgress || e.Phase == opsv1.NodeTaskPhasePending ||
		(e.Phase == opsv1.NodeTaskPhaseUnknown && !jobFinal)
	if follows {
		next := opsv1.NodeTaskPhaseInProgress
		reason := ""
		switch phase {
		case nodejobwire.PhaseSucceeded:
			next = opsv1.NodeTaskPhaseSuccessful
		case nodejobwire.PhaseFailed:
			next, reason = opsv1.NodeTaskPhaseFailure, nodejobwire.Clip(r.Action+": "+r.Reason, 512)
		}
		if e.Phase != next || e.Action != r.Action || e.Reason != reason {
			e.Phase, e.Action, e.Reason = next, r.Action, reason
			changed = true
		}
	}
	if changed && follows {
		// Microseconds, as the API stores them: the timeout is strict.
		t := metav1.NewMicroTime(now.Truncate(time.Microsecond))
		e.UpdateTime = &t
	}
	return changed
}

// sameRecord compares two action records by value.
func sameRecord(a, b opsv1.ActionStatus) bool {
	return a.Action == b.Action && a.Status == b.Status && a.Reason == b.Reason && a.Time.Equal(&b.Time) && a.By == b.By &&
		(a.StartTime == nil) == (b.StartTime == nil) && (a.StartTime == nil || a.StartTime.Equal(b.StartTime))
}

// sameEnd: b is a's end reported again (its start is already in a).
func sameEnd(a, b opsv1.ActionStatus) bool {
	return a.Status != metav1.ConditionUnknown && a.Status == b.Status && a.Reason == b.Reason && a.Time.Equal(&b.Time) && a.By == b.By
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
