package nodejob

import (
	"fmt"
	"sort"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
)

// NodeState is what the manager knows of a target node from its FleetNode.
type NodeState struct {
	// Exists is false when no FleetNode has the name.
	Exists bool
	// Phase is the FleetNode's phase: Pending, Online, Offline or Revoked.
	Phase string
	// Hub is the hub the node is connected to.
	Hub string
}

// Inputs are a job's knobs as the manager's step needs them.
type Inputs struct {
	Concurrency int
	Timeout     time.Duration
	Aborted     bool
}

// Change is one entry the step wants to rewrite: From is the entry as the
// step saw it, so a writer can apply To only if nobody changed it meanwhile.
type Change struct {
	From, To opsv1.NodeTaskStatus
}

// Result is the outcome of one manager step over a job's node tasks.
type Result struct {
	Changes []Change
	// RecheckAfter is when the earliest running node times out; 0 = none.
	RecheckAfter time.Duration
}

// Step is the manager's part of running a job, without I/O. Over the
// job's entries (any order) it, in this order:
//
//  1. marks Unknown the InProgress nodes whose last update (the hub's
//     receipt of their last report, to the microsecond) is strictly more
//     than the timeout ago (a node waiting for confirmation waits as long
//     as it takes), so that one silent node never wedges the job;
//  2. if the job is aborted, fails the nodes that have not started;
//  3. otherwise fails at once, with the reason, every Pending node that is
//     missing, revoked, not approved or not connected to a hub (it would
//     only time out), and admits Online ones, by name, while fewer than
//     Concurrency are InProgress: they become InProgress and their hubs
//     dispatch them.
func Step(now time.Time, in Inputs, entries []opsv1.NodeTaskStatus, nodes map[string]NodeState) Result {
	var res Result
	mtime := metav1.NewMicroTime(now.Truncate(time.Microsecond))
	change := func(from opsv1.NodeTaskStatus, mutate func(*opsv1.NodeTaskStatus)) opsv1.NodeTaskStatus {
		to := *from.DeepCopy()
		mutate(&to)
		to.UpdateTime = &mtime
		res.Changes = append(res.Changes, Change{From: from, To: to})
		return to
	}

	inFlight := 0
	var pending []int
	for i, e := range entries {
		switch e.Phase {
		case opsv1.NodeTaskPhaseInProgress:
			if waiting(e) {
				inFlight++
				continue
			}
			last := now
			if e.UpdateTime != nil {
				last = e.UpdateTime.Time
			}
			deadline := last.Add(in.Timeout)
			if now.Sub(last) > in.Timeout {
				what := "dispatch"
				if e.Action != "" {
					what = "action " + e.Action
				}
				change(e, func(t *opsv1.NodeTaskStatus) {
					t.Phase = opsv1.NodeTaskPhaseUnknown
					t.Reason = fmt.Sprintf("no report within %v of %s", in.Timeout, what)
				})
				continue
			}
			inFlight++
			// Just past the deadline: at it, the node is not late yet.
			if d := deadline.Sub(now) + time.Millisecond; res.RecheckAfter == 0 || d < res.RecheckAfter {
				res.RecheckAfter = d
			}
		case opsv1.NodeTaskPhasePending:
			pending = append(pending, i)
		}
	}
	sort.Slice(pending, func(a, b int) bool { return entries[pending[a]].NodeName < entries[pending[b]].NodeName })

	if in.Aborted {
		for _, i := range pending {
			change(entries[i], func(t *opsv1.NodeTaskStatus) {
				t.Phase = opsv1.NodeTaskPhaseFailure
				t.Reason = "job aborted before this node started"
			})
		}
		return res
	}
	for _, i := range pending {
		e := entries[i]
		n := nodes[e.NodeName]
		if why := unfit(e.NodeName, n); why != "" {
			change(e, func(t *opsv1.NodeTaskStatus) {
				t.Phase = opsv1.NodeTaskPhaseFailure
				t.Reason = why
			})
			continue
		}
		if inFlight >= in.Concurrency {
			continue
		}
		change(e, func(t *opsv1.NodeTaskStatus) {
			t.Phase = opsv1.NodeTaskPhaseInProgress
			t.Reason = "dispatched to hub " + n.Hub
		})
		inFlight++
		if d := in.Timeout + time.Millisecond; res.RecheckAfter == 0 || d < res.RecheckAfter {
			res.RecheckAfter = d
		}
	}
	return res
}

// waiting reports whether e's running action waits for an operator
// (Confirm, or an older agent's WaitingConfirmation).
func waiting(e opsv1.NodeTaskStatus) bool {
	if n := len(e.ActionFlow); n > 0 {
		last := e.ActionFlow[n-1]
		return nodejobwire.Waits(last.Action) && last.Status == metav1.ConditionUnknown
	}
	return nodejobwire.Waits(e.Action)
}

func unfit(name string, n NodeState) string {
	switch {
	case !n.Exists:
		return fmt.Sprintf("FleetNode %s does not exist", name)
	case n.Phase == "Revoked":
		return fmt.Sprintf("node %s is revoked", name)
	case n.Phase == "Pending":
		return fmt.Sprintf("node %s is not approved", name)
	case n.Phase != "Online" || n.Hub == "":
		return fmt.Sprintf("node %s is %s: not connected to any hub", name, orUnknown(n.Phase))
	}
	return ""
}

func orUnknown(s string) string {
	if s == "" {
		return "not connected yet"
	}
	return s
}

// Apply rewrites e with c.To if e is still what the step saw (c.From), and
// reports whether it did. Writers use it to merge a step into a fresh copy
// of a slice after a conflict.
func (c Change) Apply(e *opsv1.NodeTaskStatus) bool {
	if e.NodeName != c.From.NodeName || e.Phase != c.From.Phase || e.Action != c.From.Action || !sameTime(e.UpdateTime, c.From.UpdateTime) {
		return false
	}
	*e = *c.To.DeepCopy()
	return true
}

func sameTime(a, b *metav1.MicroTime) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.Equal(b)
}

// Failures returns the first max failed or Unknown entries, oldest first.
func Failures(entries []opsv1.NodeTaskStatus, max int) []opsv1.NodeTaskSummary {
	var f []opsv1.NodeTaskStatus
	for _, e := range entries {
		if e.Phase == opsv1.NodeTaskPhaseFailure || e.Phase == opsv1.NodeTaskPhaseUnknown {
			f = append(f, e)
		}
	}
	sort.Slice(f, func(i, j int) bool {
		ti, tj := f[i].UpdateTime, f[j].UpdateTime
		if ti != nil && tj != nil && !ti.Equal(tj) {
			return ti.Before(tj)
		}
		return f[i].NodeName < f[j].NodeName
	})
	out := make([]opsv1.NodeTaskSummary, 0, min(max, len(f)))
	for _, e := range f[:min(max, len(f))] {
		out = append(out, opsv1.NodeTaskSummary{NodeName: e.NodeName, Phase: e.Phase, Action: e.Action, Reason: e.Reason})
	}
	return out
}
