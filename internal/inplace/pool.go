package inplace

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"

	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
)

// PreflightRequeue is how often a pool whose preflight check fails looks again.
const PreflightRequeue = 30 * time.Second

// Overlap is two pools selecting one node.
type Overlap struct {
	PoolA, PoolB, Node string
}

func (o Overlap) Error() string {
	return fmt.Sprintf("pools %s and %s both select node %s: a node belongs to at most one pool", o.PoolA, o.PoolB, o.Node)
}

// FindOverlaps returns, for each node selected by more than one pool, the
// first two pools (sorted by name). members maps a pool to its nodes.
func FindOverlaps(members map[string][]string) []Overlap {
	pools := make([]string, 0, len(members))
	for p := range members {
		pools = append(pools, p)
	}
	sort.Strings(pools)
	first := map[string]string{}
	var out []Overlap
	reported := map[string]bool{}
	for _, p := range pools {
		for _, n := range members[p] {
			if q, ok := first[n]; ok {
				if !reported[n] {
					out = append(out, Overlap{PoolA: q, PoolB: p, Node: n})
					reported[n] = true
				}
				continue
			}
			first[n] = p
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
}

// NodeView is what a pool knows of one of its nodes.
type NodeView struct {
	Name string
	// Ready: the node's Ready condition is True.
	Ready bool
	// Unhealthy: a NodeHealthCheck set HealthCheckSucceeded False.
	Unhealthy bool
	// Plan is the node's update-task-name label: the plan updating it.
	Plan string
	// AtRevision: the node carries the pool's update revision.
	AtRevision   bool
	UpdatePhase  updatev1.UpdatePhase
	UpdateStatus updatev1.UpdateStatus
	// Remediated: remediation ended after this node's update failed: its
	// update runs again.
	Remediated bool
	// FailedUpdater, FailedReason: set when UpdateStatus is failed.
	FailedUpdater, FailedReason string
	// CordonedByUpdate: the pool cordoned the node for its update (an
	// operator's own cordon is not marked, and stays).
	CordonedByUpdate bool
	// StaleStatus: the node was picked again and its update controller has
	// not answered the pick yet: UpdateStatus is an earlier pick's.
	StaleStatus bool
	// Started is when the node's current update started (zero if none):
	// the rollout rate counts the plan's recent starts.
	Started time.Time
}

// inFlight: the pool asked the node to update or abort and it has not ended.
func (n NodeView) inFlight() bool {
	return n.UpdatePhase != "" && (!n.UpdateStatus.Done() || n.StaleStatus)
}

// failed: a terminal updater failure in plan, not yet remediated.
func (n NodeView) failed(plan string) bool {
	return n.UpdateStatus == updatev1.StatusFailed && n.Plan == plan && !n.Remediated
}

// PoolInput is one pool's state for StepPool.
type PoolInput struct {
	Plan     string
	Phase    updatev1.UpdatePhase
	Strategy updatev1.UpdateStrategy
	Nodes    []NodeView
	// Budget caps how many more nodes may start (the plan's maxInFlight
	// left); negative means no cap.
	Budget int
	// Window is the pool's maintenance windows at Now (nil: none set).
	Window *WindowState
	// Rollout is the pool's rollout rate and abort threshold (nil: none).
	Rollout *updatev1.Rollout
	Now     time.Time
}

// PoolDecision is what a pool does next.
type PoolDecision struct {
	// Start: nodes to label, cordon and set updating. Abort: nodes to set
	// aborting. Release: done nodes whose phase and label the pool clears.
	// Uncordon: nodes the pool cordoned whose update ended updated or
	// aborted, or that it releases (a failed node stays cordoned while its
	// plan runs).
	Start, Abort, Release, Uncordon []string
	Status                          updatev1.UpdateStatus
	Reason                          string
	Message                         string
	// Blocked is the preflight check's reason ("" when it passed or was
	// not needed).
	Blocked                  string
	BlockedWhy               string
	RequeueAfter             time.Duration
	Nodes, Updated, Updating int32
}

// MaxUnavailable scales the strategy's limit to n nodes: a percentage
// rounds down, and at least one node may update.
func MaxUnavailable(s updatev1.UpdateStrategy, n int) int {
	if s.Type != updatev1.StrategyMaxUnavailable || s.MaxUnavailable == nil {
		return 1
	}
	v, err := intstr.GetScaledValueFromIntOrPercent(s.MaxUnavailable, n, false)
	if err != nil || v < 1 {
		return 1
	}
	return v
}

// StepPool decides a pool's next step.
func StepPool(in PoolInput) PoolDecision {
	d := PoolDecision{Nodes: int32(len(in.Nodes))}
	nodes := append([]NodeView(nil), in.Nodes...)
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	for _, n := range nodes {
		ended := n.UpdateStatus == updatev1.StatusUpdated || n.UpdateStatus == updatev1.StatusAborted
		if n.CordonedByUpdate && !n.inFlight() && (ended || in.Phase == "") {
			d.Uncordon = append(d.Uncordon, n.Name)
		}
	}

	var inFlight, other, failed, planUpdated int
	var failure *NodeView
	var started []time.Time
	for i, n := range nodes {
		if n.Plan == in.Plan && in.Plan != "" {
			switch {
			case !n.Started.IsZero():
				started = append(started, n.Started)
			case n.inFlight():
				// Picked, and its node controller has not stamped the
				// start yet: it counts as started now.
				started = append(started, in.Now)
			}
			if n.UpdateStatus == updatev1.StatusUpdated && n.AtRevision {
				planUpdated++
			}
		}
		switch {
		case n.AtRevision && !n.inFlight():
			d.Updated++
		case n.inFlight():
			d.Updating++
			if n.Plan == in.Plan {
				inFlight++
			} else {
				// Another plan's node: preflight refuses picks below.
				other++
			}
		}
		if n.failed(in.Plan) {
			failed++
			if failure == nil {
				failure = &nodes[i]
			}
		}
	}

	switch in.Phase {
	case "":
		// No plan runs on the pool: keep its status, and release nodes a
		// plan left labelled once they ended.
		for _, n := range nodes {
			if (n.UpdatePhase != "" || n.Plan != "") && !n.inFlight() {
				d.Release = append(d.Release, n.Name)
			}
		}
		return d
	case updatev1.PhaseAborting:
		for _, n := range nodes {
			if n.UpdatePhase == updatev1.PhaseUpdating && !n.UpdateStatus.Done() {
				d.Abort = append(d.Abort, n.Name)
			}
		}
		if inFlight > 0 {
			d.Status, d.Reason = updatev1.StatusAborting, updatev1.ReasonAborting
			d.Message = fmt.Sprintf("%d node(s) still aborting", inFlight)
			return d
		}
		d.Status, d.Reason = updatev1.StatusAborted, updatev1.ReasonAborted
		d.Message = fmt.Sprintf("%d of %d node(s) updated, the rest aborted or not started", d.Updated, d.Nodes)
		return d
	}

	// updating
	if stop, why := OverAbortThreshold(in.Rollout, failed, planUpdated+failed); stop {
		// A terminal failure (or, with a rollout, enough of them) stops
		// new picks; what runs finishes.
		d.Reason = updatev1.ReasonUpdaterFailed
		d.Message = fmt.Sprintf("node %s: updater %s failed: %s", failure.Name, failure.FailedUpdater, failure.FailedReason)
		if why != "" {
			d.Reason, d.Message = updatev1.ReasonAbortThreshold, why+"; first: "+d.Message
		}
		if inFlight > 0 {
			d.Status = updatev1.StatusUpdating
		} else {
			d.Status = updatev1.StatusFailed
		}
		return d
	}
	var candidates []string
	for _, n := range nodes {
		// A node failed in this plan is picked again only once remediated.
		if !n.AtRevision && !n.inFlight() && !(n.UpdateStatus == updatev1.StatusFailed && n.Plan == in.Plan && !n.Remediated) {
			candidates = append(candidates, n.Name)
		}
	}
	if len(candidates) == 0 && inFlight == 0 {
		d.Status, d.Reason = updatev1.StatusUpdated, updatev1.ReasonUpdated
		d.Message = fmt.Sprintf("%d node(s) at the pool's template", d.Nodes)
		if failed > 0 {
			d.Message = fmt.Sprintf("%d of %d node(s) at the pool's template; %d failed, under the rollout's abort threshold (first: node %s, updater %s: %s)",
				d.Updated, d.Nodes, failed, failure.Name, failure.FailedUpdater, failure.FailedReason)
		}
		return d
	}
	d.Status, d.Reason = updatev1.StatusUpdating, updatev1.ReasonUpdating
	d.Message = fmt.Sprintf("%d of %d node(s) updated, %d updating", d.Updated, d.Nodes, d.Updating)
	if len(candidates) == 0 {
		return d
	}
	limit := MaxUnavailable(in.Strategy, len(nodes))
	free := limit - inFlight
	if other > 0 && free <= 0 {
		free = 1 // let preflight say why
	}
	if in.Budget >= 0 && in.Budget < free {
		free = in.Budget
	}
	if free <= 0 {
		return d
	}
	if in.Window != nil {
		if reason, why, after := in.Window.Blocked(in.Now); reason != "" {
			d.Blocked, d.BlockedWhy, d.RequeueAfter = reason, why, after
			return d
		}
	}
	if reason, why := preflight(nodes, in.Plan); reason != "" {
		d.Blocked, d.BlockedWhy, d.RequeueAfter = reason, why, PreflightRequeue
		return d
	}
	if in.Rollout != nil {
		allowed, rate, after := RolloutAllowance(in.Rollout, in.Now, started, planUpdated)
		if allowed == 0 {
			d.Blocked, d.RequeueAfter = updatev1.ReasonRolloutRate, after
			d.BlockedWhy = fmt.Sprintf("rollout rate of %d node(s) per minute (after %d updated) reached; the next may start in %s", rate, planUpdated, after.Round(time.Second))
			return d
		}
		free = min(free, allowed)
	}
	if len(candidates) > free {
		candidates = candidates[:free]
	}
	d.Start = candidates
	d.Updating += int32(len(candidates))
	return d
}

// preflight checks that the pool may pick a node: every node Ready and not
// failing a health check, none updated by another plan. A node the plan
// itself is updating may be not Ready (an update may restart it).
func preflight(nodes []NodeView, plan string) (reason, why string) {
	var notReady, unhealthy, other []string
	for _, n := range nodes {
		ours := n.inFlight() && n.Plan == plan
		if n.Plan != "" && n.Plan != plan && n.inFlight() {
			other = append(other, n.Name+" ("+n.Plan+")")
		}
		if ours {
			continue
		}
		if !n.Ready {
			notReady = append(notReady, n.Name)
		}
		if n.Unhealthy {
			unhealthy = append(unhealthy, n.Name)
		}
	}
	switch {
	case len(other) > 0:
		return updatev1.ReasonOtherUpdate, "another update runs on " + strings.Join(other, ", ")
	case len(unhealthy) > 0:
		return updatev1.ReasonNodeUnhealthy, "health check failing on " + strings.Join(unhealthy, ", ")
	case len(notReady) > 0:
		return updatev1.ReasonNodeNotReady, "not Ready: " + strings.Join(notReady, ", ")
	}
	return "", ""
}
