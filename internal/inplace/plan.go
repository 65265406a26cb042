package inplace

import (
	"fmt"
	"sort"
	"strings"
	"time"

	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
)

// WaitRequeue is how often a plan waiting for another one looks again.
const WaitRequeue = 10 * time.Second

// PoolState is what a plan knows of one of its pools.
type PoolState struct {
	Name     string
	Sequence int32
	// Exists: the NodePool exists.
	Exists bool
	// Plan is the pool's update-task-name label.
	Plan         string
	Phase        updatev1.UpdatePhase
	UpdateStatus updatev1.UpdateStatus
	// Observed: the pool's status was computed for its current spec
	// (status.observedGeneration == metadata.generation); otherwise its
	// updateStatus may be a previous plan's and is not trusted.
	Observed bool
	// Reason, Message: the pool's InPlaceUpdate condition (a failure names
	// node, updater and reason).
	Reason, Message string
}

// PlanInput is one plan's state for StepPlan.
type PlanInput struct {
	Name  string
	Phase updatev1.UpdatePhase
	Pools []PoolState
	// Holders maps another plan holding one of this plan's pools to
	// whether it has ended.
	Holders map[string]bool
	// Newer: this plan was created after every holder: a new change
	// aborts the running plan, then waits for it to end.
	Newer bool
	// Done: the plan already ended (updated, aborted or failed).
	Done updatev1.UpdateStatus
}

// SequenceCondition is the type of the plan condition for one pool sequence.
func SequenceCondition(seq int32) string { return fmt.Sprintf("Sequence%dUpdate", seq) }

// SequenceState is one pool sequence's aggregate.
type SequenceState struct {
	Sequence int32
	Status   updatev1.UpdateStatus // "" = not started
	Message  string
}

// PlanDecision is what a plan does next.
type PlanDecision struct {
	// Label: pools to label with the plan. Release: pools whose label and
	// updatePhase the plan removes.
	Label, Release []string
	// SetPhase: pools whose spec.updatePhase to set.
	SetPhase map[string]updatev1.UpdatePhase
	// AbortPlans: running plans to set aborting (this one is newer).
	AbortPlans []string
	Status     updatev1.UpdateStatus
	Current    int32
	Sequences  []SequenceState
	// Waiting says which plan this one waits for ("" when it runs).
	Waiting string
	// Failure: the failing pool's message (node, updater, reason).
	Failure      string
	RequeueAfter time.Duration
}

// StepPlan decides a plan's next step.
func StepPlan(in PlanInput) PlanDecision {
	d := PlanDecision{SetPhase: map[string]updatev1.UpdatePhase{}}
	if in.Done.Done() {
		d.Status = in.Done
		for _, p := range in.Pools {
			if p.Plan == in.Name {
				d.Release = append(d.Release, p.Name)
			}
		}
		return d
	}
	var running []string
	for h, ended := range in.Holders {
		if !ended {
			running = append(running, h)
		}
	}
	sort.Strings(running)
	if len(running) > 0 {
		if in.Phase == updatev1.PhaseAborting {
			// Nothing of ours started; aborting a plan that waits ends it.
			d.Status = updatev1.StatusAborted
			return d
		}
		if in.Newer {
			d.AbortPlans = running
		}
		d.Waiting = strings.Join(running, ", ")
		d.RequeueAfter = WaitRequeue
		return d
	}

	pools := append([]PoolState(nil), in.Pools...)
	sort.SliceStable(pools, func(i, j int) bool { return pools[i].Sequence < pools[j].Sequence })
	for _, p := range pools {
		if p.Exists && p.Plan != in.Name {
			d.Label = append(d.Label, p.Name)
		}
	}
	bySeq := map[int32][]PoolState{}
	var seqs []int32
	for _, p := range pools {
		if _, ok := bySeq[p.Sequence]; !ok {
			seqs = append(seqs, p.Sequence)
		}
		bySeq[p.Sequence] = append(bySeq[p.Sequence], p)
	}
	for _, s := range seqs {
		d.Sequences = append(d.Sequences, aggregate(s, bySeq[s]))
	}

	if in.Phase == updatev1.PhaseAborting {
		anyAborting := false
		for _, p := range pools {
			if p.Phase == updatev1.PhaseUpdating {
				d.SetPhase[p.Name] = updatev1.PhaseAborting
				anyAborting = true
			}
			if p.Phase == updatev1.PhaseAborting && (!p.Observed || !p.UpdateStatus.Done()) {
				anyAborting = true
			}
		}
		d.Label = nil
		if anyAborting {
			d.Status = updatev1.StatusAborting
			return d
		}
		d.Status = updatev1.StatusAborted
		for _, p := range pools {
			if p.Plan == in.Name {
				d.Release = append(d.Release, p.Name)
			}
		}
		return d
	}

	for _, s := range d.Sequences {
		switch s.Status {
		case updatev1.StatusUpdated:
			continue
		case updatev1.StatusFailed:
			d.Status, d.Current, d.Failure = updatev1.StatusFailed, s.Sequence, s.Message
			for _, p := range pools {
				if p.Plan == in.Name {
					d.Release = append(d.Release, p.Name)
				}
			}
			return d
		}
		d.Current = s.Sequence
		d.Status = updatev1.StatusUpdating
		for _, p := range bySeq[s.Sequence] {
			if !p.Exists {
				d.Status, d.Failure = updatev1.StatusFailed, "pool "+p.Name+" does not exist"
				return d
			}
			if p.Phase != updatev1.PhaseUpdating {
				d.SetPhase[p.Name] = updatev1.PhaseUpdating
			}
			if p.Observed && p.Reason == updatev1.ReasonUpdaterFailed {
				// Failing, with tasks still running: no new picks already.
				d.Failure = "pool " + p.Name + ": " + p.Message
			}
		}
		return d
	}
	d.Status = updatev1.StatusUpdated
	for _, p := range pools {
		if p.Plan == in.Name {
			d.Release = append(d.Release, p.Name)
		}
	}
	return d
}

// aggregate is a pool sequence's status: failed if a pool failed, updated
// when all are, not started while none was asked, else updating.
func aggregate(seq int32, pools []PoolState) SequenceState {
	st := SequenceState{Sequence: seq}
	updated, started := 0, 0
	for _, p := range pools {
		if p.Phase != "" {
			started++
		}
		if !p.Observed {
			continue
		}
		switch p.UpdateStatus {
		case updatev1.StatusFailed:
			st.Status = updatev1.StatusFailed
			st.Message = "pool " + p.Name + ": " + p.Message
			return st
		case updatev1.StatusUpdated:
			if p.Phase != "" {
				updated++
			}
		}
	}
	switch {
	case updated == len(pools):
		st.Status = updatev1.StatusUpdated
		st.Message = fmt.Sprintf("%d pool(s) updated", len(pools))
	case started == 0:
		st.Message = "waiting for the sequences before it"
	default:
		st.Status = updatev1.StatusUpdating
		st.Message = fmt.Sprintf("%d of %d pool(s) updated", updated, len(pools))
	}
	return st
}
