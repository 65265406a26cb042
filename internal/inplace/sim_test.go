package inplace

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"

	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
)

// simNode plays a node with two updaters whose tasks take two steps each.
type simNode struct {
	view  NodeView
	tasks map[string]TaskView
	steps map[string]int
	since time.Time
}

// TestAbortLeavesEveryNodeUpdatedOrAborted drives a pool and its nodes step
// by step with a fake clock, aborts in the middle, and checks that no node
// is left between states.
func TestAbortLeavesEveryNodeUpdatedOrAborted(t *testing.T) {
	for abortAt := 0; abortAt < 12; abortAt++ {
		t.Run(fmt.Sprintf("abort at step %d", abortAt), func(t *testing.T) {
			two := intstr.FromInt32(2)
			ups := []updatev1.Updater{{Name: "files", Sequence: 1}, {Name: "version", Sequence: 2}}
			nodes := map[string]*simNode{}
			var order []string
			for i := range 5 {
				n := fmt.Sprintf("n%d", i)
				order = append(order, n)
				nodes[n] = &simNode{view: NodeView{Name: n, Ready: true}, tasks: map[string]TaskView{}, steps: map[string]int{}}
			}
			phase := updatev1.PhaseUpdating
			clock := now
			var status updatev1.UpdateStatus
			for step := 0; step < 200; step++ {
				clock = clock.Add(time.Second)
				if step == abortAt {
					phase = updatev1.PhaseAborting
				}
				var views []NodeView
				for _, n := range order {
					views = append(views, nodes[n].view)
				}
				d := StepPool(PoolInput{Plan: "p", Phase: phase, Strategy: updatev1.UpdateStrategy{Type: updatev1.StrategyMaxUnavailable, MaxUnavailable: &two}, Nodes: views, Budget: -1})
				status = d.Status
				if status.Done() {
					break
				}
				for _, name := range d.Start {
					n := nodes[name]
					n.view.Plan, n.view.UpdatePhase, n.view.UpdateStatus = "p", updatev1.PhaseUpdating, updatev1.StatusUpdating
				}
				for _, name := range d.Abort {
					n := nodes[name]
					n.view.UpdatePhase, n.since = updatev1.PhaseAborting, clock
				}
				for _, name := range order {
					n := nodes[name]
					if n.view.UpdatePhase == "" || n.view.UpdateStatus.Done() {
						continue
					}
					// The updaters' controllers: a task takes two steps, and
					// an aborting one ends aborted at its next step.
					for u, tv := range n.tasks {
						switch {
						case tv.UpdateStatus.Done():
						case tv.UpdatePhase == updatev1.PhaseAborting:
							tv.UpdateStatus = updatev1.StatusAborted
						case n.steps[u] >= 2:
							tv.UpdateStatus = updatev1.StatusUpdated
						default:
							n.steps[u]++
						}
						n.tasks[u] = tv
					}
					nd := StepNode(NodeInput{Phase: n.view.UpdatePhase, Updaters: ups, Tasks: n.tasks, Now: clock, AbortingSince: n.since})
					if nd.Create != "" {
						n.tasks[nd.Create] = TaskView{UpdatePhase: updatev1.PhaseUpdating, UpdateStatus: updatev1.StatusUpdating}
					}
					for _, u := range nd.Abort {
						tv := n.tasks[u]
						tv.UpdatePhase = updatev1.PhaseAborting
						n.tasks[u] = tv
					}
					n.view.UpdateStatus = nd.Status
					n.view.AtRevision = nd.Status == updatev1.StatusUpdated
				}
			}
			if !status.Done() {
				t.Fatalf("pool did not end: %q", status)
			}
			for _, name := range order {
				switch st := nodes[name].view.UpdateStatus; st {
				case "", updatev1.StatusUpdated, updatev1.StatusAborted:
				default:
					t.Errorf("node %s ended %q: between states", name, st)
				}
			}
		})
	}
}
