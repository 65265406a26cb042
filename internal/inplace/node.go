package inplace

import (
	"fmt"
	"sort"
	"time"

	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
)

// DefaultDrainTimeout bounds a node's wait for its running tasks before
// its update.
const DefaultDrainTimeout = 10 * time.Minute

// DrainPoll is how often a draining node looks at its tasks again.
const DrainPoll = 5 * time.Second

// DrainView is what a node waits for before its first updater task.
type DrainView struct {
	// Running: the tasks still running on the node (namespace/name).
	Running []string
	// Since is when the node's update started (zero: now).
	Since   time.Time
	Timeout time.Duration
}

// DefaultAbortTimeout is how long a node waits for its tasks to report
// aborted before it ends aborted anyway (reason AbortTimeout).
const DefaultAbortTimeout = 10 * time.Minute

// TaskView is one updater task's state, as the contract exposes it.
type TaskView struct {
	UpdatePhase  updatev1.UpdatePhase
	UpdateStatus updatev1.UpdateStatus
	// Reason, Message: of the task's condition that says why (the
	// contract's SHALL).
	Reason, Message string
}

// NodeInput is one node's state for StepNode.
type NodeInput struct {
	Phase updatev1.UpdatePhase
	// Updaters of the plan; StepNode orders them by sequence.
	Updaters []updatev1.Updater
	// Tasks by updater name; absent = not created yet.
	Tasks map[string]TaskView
	Now   time.Time
	// AbortingSince is when the node started aborting (zero if it is not).
	AbortingSince time.Time
	AbortTimeout  time.Duration
	// Drain, when set, holds the first updater task until no task runs on
	// the node (nil: the pool does not drain).
	Drain *DrainView
}

// NodeDecision is what a node does next.
type NodeDecision struct {
	// Create: the updater whose task to create now ("" for none).
	Create string
	// Abort: updaters whose tasks to set aborting.
	Abort   []string
	Status  updatev1.UpdateStatus
	Reason  string
	Message string
	// FailedUpdater is the updater whose task failed.
	FailedUpdater string
	// AbortTimedOut: the node ended aborted by AbortTimeout (record an Event).
	AbortTimedOut bool
	RequeueAfter  time.Duration
}

// StepNode decides a node's next step: on updating, create the tasks one
// after another by sequence and aggregate them; on aborting, abort the
// running ones and wait for them, at most AbortTimeout.
func StepNode(in NodeInput) NodeDecision {
	ups := append([]updatev1.Updater(nil), in.Updaters...)
	sort.SliceStable(ups, func(i, j int) bool { return ups[i].Sequence < ups[j].Sequence })
	switch in.Phase {
	case updatev1.PhaseUpdating:
		if len(in.Tasks) == 0 && in.Drain != nil && len(in.Drain.Running) > 0 {
			return drain(*in.Drain, in.Now)
		}
		// One message while updating, not one per updater or step: each
		// message is a write of the node, on every node of the fleet; the
		// updater tasks (labelled with the node) say how far each is.
		running := fmt.Sprintf("%d updater(s) run one after another", len(ups))
		for _, u := range ups {
			t, ok := in.Tasks[u.Name]
			if !ok {
				return NodeDecision{Create: u.Name, Status: updatev1.StatusUpdating, Reason: updatev1.ReasonUpdating, Message: running}
			}
			switch t.UpdateStatus {
			case updatev1.StatusUpdated:
				continue
			case updatev1.StatusFailed:
				return NodeDecision{Status: updatev1.StatusFailed, Reason: updatev1.ReasonUpdaterFailed, FailedUpdater: u.Name,
					Message: fmt.Sprintf("updater %s failed: %s: %s", u.Name, orUnknown(t.Reason), t.Message)}
			case updatev1.StatusAborted:
				// Aborted without being asked (e.g. by its own controller):
				// the node cannot be updated; it ends aborted, consistent.
				return NodeDecision{Status: updatev1.StatusAborted, Reason: updatev1.ReasonAborted,
					Message: fmt.Sprintf("updater %s aborted: %s", u.Name, orUnknown(t.Reason))}
			default:
				return NodeDecision{Status: updatev1.StatusUpdating, Reason: updatev1.ReasonUpdating, Message: running}
			}
		}
		return NodeDecision{Status: updatev1.StatusUpdated, Reason: updatev1.ReasonUpdated, Message: fmt.Sprintf("%d updater(s) done", len(ups))}
	case updatev1.PhaseAborting:
		d := NodeDecision{}
		var running []string
		allUpdated := len(ups) > 0
		for _, u := range ups {
			t, ok := in.Tasks[u.Name]
			if !ok || t.UpdateStatus != updatev1.StatusUpdated {
				allUpdated = false
			}
			if !ok || t.UpdateStatus.Done() {
				continue
			}
			running = append(running, u.Name)
			if t.UpdatePhase != updatev1.PhaseAborting {
				d.Abort = append(d.Abort, u.Name)
			}
		}
		switch {
		case allUpdated:
			// Every updater finished before the abort reached it: the node
			// is updated, never half of it.
			d.Status, d.Reason, d.Message = updatev1.StatusUpdated, updatev1.ReasonUpdated, "updated before the abort"
		case len(running) == 0:
			d.Status, d.Reason, d.Message = updatev1.StatusAborted, updatev1.ReasonAborted, "every updater task ended"
		default:
			timeout := in.AbortTimeout
			if timeout <= 0 {
				timeout = DefaultAbortTimeout
			}
			if left := in.AbortingSince.Add(timeout).Sub(in.Now); !in.AbortingSince.IsZero() && left <= 0 {
				d.Status, d.Reason, d.AbortTimedOut = updatev1.StatusAborted, updatev1.ReasonAbortTimeout, true
				d.Message = fmt.Sprintf("updater task(s) %v did not report aborted within %v", running, timeout)
				d.Abort = nil
			} else {
				d.Status, d.Reason = updatev1.StatusAborting, updatev1.ReasonAborting
				d.Message = fmt.Sprintf("waiting for updater task(s) %v to abort", running)
				d.RequeueAfter = left
				if in.AbortingSince.IsZero() {
					d.RequeueAfter = timeout
				}
			}
		}
		return d
	}
	return NodeDecision{}
}

// drain waits for the node's running tasks, at most their timeout.
func drain(d DrainView, now time.Time) NodeDecision {
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = DefaultDrainTimeout
	}
	since := d.Since
	if since.IsZero() {
		since = now
	}
	names := d.Running
	more := ""
	if len(names) > 5 {
		names, more = names[:5], fmt.Sprintf(" and %d more", len(d.Running)-5)
	}
	left := since.Add(timeout).Sub(now)
	if left <= 0 {
		return NodeDecision{Status: updatev1.StatusFailed, Reason: updatev1.ReasonDrainTimeout, FailedUpdater: "drain",
			Message: fmt.Sprintf("%d task(s) still running after the pool's drain timeout of %v: %v%s; nothing was stopped (end or delete them, or set the pool's drain policy to None)",
				len(d.Running), timeout, names, more)}
	}
	return NodeDecision{Status: updatev1.StatusUpdating, Reason: updatev1.ReasonDraining, RequeueAfter: min(left, DrainPoll),
		Message: fmt.Sprintf("waiting for %d task(s) to end before the update (drain timeout %v): %v%s", len(d.Running), timeout, names, more)}
}

func orUnknown(s string) string {
	if s == "" {
		return "no reason given"
	}
	return s
}
