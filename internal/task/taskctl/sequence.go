package taskctl

import (
	"fmt"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
)

// Sequencing of a multi-task group's instance (TaskGroup spec.tasks).
// It lives in the manager, not on the agent: the controller creates every
// task of an instance at once (so that the scheduler sees, and holds room
// for, the whole instance), gates the ones whose turn has not come with
// schedulingGates, removes a gate once the inits before it completed, and
// deletes the sidecars once every main ended. The agent runs each Task as
// it runs any other, so it needs no change, and an instance survives a
// manager or hub restart because its state is the Tasks' state.
//
//	inits[0] ─ok→ inits[1] ─ok→ … ─ok→ mains + sidecars ─mains ended→ sidecars stopped
//	   │fail         │fail                 │
//	   └─────────────┴──→ Failed (InitFailed): the rest never start
//	                                        instance result = its mains' result

// gateInit is the schedulingGate of a task waiting for its instance's inits.
const gateInit = "batch.drover.io/" + batchv1.ReasonWaitingForInit

// memberObs is what the controller sees of one task of an instance.
type memberObs struct {
	exists      bool
	terminating bool // being deleted (its replacement waits until it is gone)
	// state counts a failed attempt that will be restarted as Pending.
	state batchv1.TaskState
	gated bool
}

// progress is where one task of an instance is, for the group's status.
type progress int

const (
	progWaiting progress = iota
	progActive
	progCompleted
	progFailed
	progStopped
)

// instanceStep is what to do for an instance, and where it is.
type instanceStep struct {
	// create: tasks to make, each gated or not.
	create map[string]bool
	// ungate: tasks whose turn came.
	ungate []string
	// stop: tasks to delete, with the reason (SidecarStopped, InitFailed).
	stop []string
	// stopReason is why stop is stopped.
	stopReason string
	// state of the instance: Pending, Running, Completed or Failed.
	state batchv1.TaskState
	// reason and message of a failed instance (InitFailed or TasksFailed).
	reason, message string
	// members' progress, by name.
	members map[string]progress
}

// stepInstance decides one instance of defs from what is observed of its
// tasks (by name). It is pure: no I/O, no clock.
func stepInstance(defs []batchv1.GroupTask, obs map[string]memberObs) instanceStep {
	st := instanceStep{create: map[string]bool{}, members: map[string]progress{}, state: batchv1.TaskPending}
	// The first init not Completed gates everything after it; one that
	// failed for good fails the instance.
	blocking, failedInit := -1, ""
	for i := range defs {
		d := &defs[i]
		if d.Role() != batchv1.LifecycleInit || blocking >= 0 {
			continue
		}
		if o := obs[d.Name]; !o.exists || o.state != batchv1.TaskCompleted {
			blocking = i
			if o.exists && o.state == batchv1.TaskFailed {
				failedInit = d.Name
			}
		}
	}
	mainsEnded, mainFailed, mainsCompleted, mains := true, "", 0, 0
	for i := range defs {
		d := &defs[i]
		if d.Role() != batchv1.LifecycleMain {
			continue
		}
		mains++
		o := obs[d.Name]
		switch {
		case !o.exists:
			mainsEnded = false
		case o.state == batchv1.TaskFailed:
			if mainFailed == "" {
				mainFailed = d.Name
			}
		case o.state == batchv1.TaskCompleted:
			mainsCompleted++
		default:
			mainsEnded = false
		}
	}
	sidecarsRunning := false
	started := false
	for i := range defs {
		d := &defs[i]
		o := obs[d.Name]
		if o.exists && (o.state.Holds() || o.state.Final()) {
			started = true
		}
		// gated: an init before d has not completed.
		gated := blocking >= 0 && (i > blocking || d.Role() != batchv1.LifecycleInit)
		switch {
		case failedInit != "":
			// Nothing more starts; what has not ended is stopped.
			if o.exists && !o.terminating && !o.state.Final() {
				st.stop = append(st.stop, d.Name)
			}
		case mainsEnded && d.Role() == batchv1.LifecycleSidecar:
			// One being deleted may run until its hub stopped it.
			if o.terminating || o.exists && !o.state.Final() {
				sidecarsRunning = true
			}
			if o.exists && !o.terminating && !o.state.Final() {
				st.stop = append(st.stop, d.Name)
			}
		case !o.exists && !o.terminating:
			st.create[d.Name] = gated
		case o.exists && o.gated && !gated:
			st.ungate = append(st.ungate, d.Name)
		}
		st.members[d.Name] = memberProgress(d, o, failedInit != "", mainsEnded)
	}
	switch {
	case failedInit != "":
		st.state, st.reason = batchv1.TaskFailed, batchv1.ReasonInitFailed
		st.message = fmt.Sprintf("init task %s failed", failedInit)
		st.stopReason = batchv1.ReasonInitFailed
		st.create = map[string]bool{}
	case mainsEnded && !sidecarsRunning:
		st.state = batchv1.TaskCompleted
		if mainFailed != "" {
			st.state, st.reason = batchv1.TaskFailed, ReasonTasksFailed
			st.message = fmt.Sprintf("main task %s failed (%d/%d mains completed)", mainFailed, mainsCompleted, mains)
		}
		st.create = map[string]bool{}
	case mainsEnded:
		st.state, st.stopReason = batchv1.TaskRunning, batchv1.ReasonSidecarStopped
		st.create = map[string]bool{}
	case started:
		st.state = batchv1.TaskRunning
	}
	return st
}

func memberProgress(d *batchv1.GroupTask, o memberObs, initFailed, mainsEnded bool) progress {
	switch {
	case o.exists && o.state == batchv1.TaskCompleted:
		return progCompleted
	case o.exists && o.state == batchv1.TaskFailed:
		return progFailed
	case initFailed, mainsEnded && d.Role() == batchv1.LifecycleSidecar:
		return progStopped
	case o.exists && o.state.Holds() && !o.terminating:
		return progActive
	}
	return progWaiting
}
