package taskhub

import (
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	"github.com/drover-fleet/drover/internal/task/taskwire"
)

// applyReports is apply on t's status, with the Complete and Failed
// conditions set to match an end it wrote (in the same write).
func applyReports(t *batchv1.Task, p *pending, hub string, now time.Time) bool {
	if !apply(&t.Status, p, hub, now) {
		return false
	}
	batchv1.SetEndConditions(t, false, now)
	return true
}

// apply moves st along by what p says of attempt p.attempt on p.node, and
// reports whether it changed. Anything about another attempt or node is
// ignored; a task never moves back.
func apply(st *batchv1.TaskStatus, p *pending, hub string, now time.Time) bool {
	if st.Attempt != p.attempt || st.NodeName != p.node {
		return false
	}
	changed := false
	set := func(s batchv1.TaskState, reason, msg string) {
		st.State, st.Reason, st.Message = s, reason, msg
		changed = true
	}
	if p.dispatched && st.State == batchv1.TaskScheduled {
		set(batchv1.TaskDispatching, ReasonDispatched, fmt.Sprintf("sent to node %s by hub %s", p.node, hub))
	}
	for _, rp := range p.reports {
		switch rp.phase {
		case agentPending:
			if st.State == batchv1.TaskScheduled {
				set(batchv1.TaskDispatching, ReasonDispatched, fmt.Sprintf("node %s has it", p.node))
			}
		case taskwire.PhaseRunning:
			if st.State == batchv1.TaskScheduled || st.State == batchv1.TaskDispatching {
				set(batchv1.TaskRunning, ReasonStarted, rp.r.Message)
			}
			changed = setTime(&st.StartTime, rp.r.StartTime) || changed
		case taskwire.PhaseSucceeded, taskwire.PhaseFailed, taskwire.PhaseCancelled:
			s, reason := batchv1.TaskFailed, rp.reason
			if rp.phase == taskwire.PhaseSucceeded {
				s, reason = batchv1.TaskCompleted, ReasonCompleted
			}
			msg := rp.r.Message
			if reason == "" {
				reason = rp.phase
			} else if strings.ContainsAny(reason, " :") {
				// A sentence (the agent's own, e.g. after a restart): the
				// reason stays a word, the sentence goes into the message.
				if msg == "" {
					msg = reason
				}
				reason = rp.phase
			}
			switch {
			case !st.State.Final():
				set(s, reason, msg)
				if st.FinishTime == nil && rp.r.FinishTime == "" {
					t := metav1.NewTime(now)
					st.FinishTime = &t
				}
			case st.State != s || !rp.full:
				continue
			}
			// A report after a NodeState's bare phase fills in the details.
			changed = setTime(&st.StartTime, rp.r.StartTime) || changed
			changed = setTime(&st.FinishTime, rp.r.FinishTime) || changed
			if rp.r.ExitCode != nil && (st.ExitCode == nil || *st.ExitCode != *rp.r.ExitCode) {
				st.ExitCode = rp.r.ExitCode
				changed = true
			} else if rp.phase == taskwire.PhaseSucceeded && st.ExitCode == nil {
				zero := int32(0)
				st.ExitCode = &zero
				changed = true
			}
			if rp.r.OutputTail != "" && st.OutputTail != rp.r.OutputTail {
				st.OutputTail = rp.r.OutputTail
				changed = true
			}
			if rp.r.Message != "" && st.Message != rp.r.Message {
				st.Message = rp.r.Message
				changed = true
			}
		}
	}
	return changed
}

// agentPending is the phase of an item the agent holds but has not started.
const agentPending = "Pending"

// setTime sets *dst from an RFC 3339 string if it differs; it reports
// whether it changed.
func setTime(dst **metav1.Time, s string) bool {
	if s == "" {
		return false
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return false
	}
	// The API keeps seconds.
	if *dst != nil && (*dst).Time.Truncate(time.Second).Equal(t.Truncate(time.Second)) {
		return false
	}
	mt := metav1.NewTime(t)
	*dst = &mt
	return true
}
