package taskctl

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/scheduler"
	"github.com/drover-fleet/drover/internal/tenancy"
)

// A perNode group (Nomad's system job) has one task per node that its
// template's nodeSelector (and nodeName) matches and a NodeGrant of its
// namespace allows for its work. A node that matches gets a task once it is
// Online and not cordoned; a node keeps its task while it matches, whatever
// its phase, so that a node going Offline leaves its task to the task's
// reschedulePolicy (pinned, it waits for that node: it is never moved); a
// node that stops matching (labels, grant) or is deleted loses its task.

// nodeSet is what a perNode group may have: the nodes that match, and of
// those the ones that may get a new task.
type nodeSet struct {
	matching map[string]bool
	joinable []string // sorted
}

// perNodeSet reads the nodes for group g.
func perNodeSet(ctx context.Context, c client.Client, g *batchv1.TaskGroup) (nodeSet, error) {
	set := nodeSet{matching: map[string]bool{}}
	// A multi-task group's instance runs on one node: the node must suit
	// every task of it.
	specs := specsOf(g)
	sels := make([]labels.Selector, len(specs))
	works := make([]tenancy.Work, len(specs))
	for i, spec := range specs {
		sels[i] = labels.Everything()
		works[i] = scheduler.WorkOf(&batchv1.Task{Spec: *spec})
		if spec.NodeSelector != nil {
			s, err := metav1.LabelSelectorAsSelector(spec.NodeSelector)
			if err != nil {
				// The scheduler says so on such tasks; here none match.
				log.FromContext(ctx).Info("perNode group's nodeSelector does not parse: no node matches", "error", err.Error())
				return set, nil
			}
			sels[i] = s
		}
	}
	var grants fleetv1.NodeGrantList
	if err := c.List(ctx, &grants, client.UnsafeDisableDeepCopy); err != nil {
		return set, fmt.Errorf("list NodeGrants: %w", err)
	}
	// A grant that does not compile grants nothing; the scheduler reports it.
	policy, _ := tenancy.Compile(grants.Items)
	ns := namespaceMeta()
	if err := c.Get(ctx, client.ObjectKey{Name: g.Namespace}, ns); client.IgnoreNotFound(err) != nil {
		return set, fmt.Errorf("get Namespace %s: %w", g.Namespace, err)
	}
	access := policy.For(g.Namespace, ns.Labels)
	var nodes fleetv1.FleetNodeList
	if err := c.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return set, fmt.Errorf("list FleetNodes: %w", err)
	}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		suits := n.DeletionTimestamp == nil
		for i, spec := range specs {
			suits = suits && (spec.NodeName == "" || spec.NodeName == n.Name) &&
				sels[i].Matches(labels.Set(n.Labels)) && access.Allows(works[i], n.Labels)
		}
		if !suits {
			continue
		}
		set.matching[n.Name] = true
		if n.Status.Phase == fleetv1.FleetNodeOnline && !n.Spec.Unschedulable {
			set.joinable = append(set.joinable, n.Name)
		}
	}
	return set, nil
}

// perNodeTaskName is the task of group for node: <group>-<node>, or, when
// that is over 253 characters, <group>-<a hash of node>.
func perNodeTaskName(group, node string) string {
	if name := group + "-" + node; len(name) <= 253 {
		return name
	}
	h := fnv.New64a()
	h.Write([]byte(node))
	sum := strconv.FormatUint(h.Sum64(), 36)
	if room := 253 - len(group) - 1; len(sum) > room {
		sum = sum[:room]
	}
	return group + "-" + sum
}

// perNodeGroups maps a FleetNode change to the perNode groups that are not
// done: a node that joins, leaves or changes labels changes what they want.
func (r *TaskGroupReconciler) perNodeGroups(ctx context.Context, _ client.Object) []reconcile.Request {
	var list batchv1.TaskGroupList
	if err := r.Client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		log.FromContext(ctx).Error(err, "list TaskGroups for a node change")
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		g := &list.Items[i]
		if g.Spec.PerNode && !settled(g.Status.Phase, g.Status.ObservedGeneration, g.Generation) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(g)})
		}
	}
	return out
}

// nodeMembershipMatters: a node's labels, phase or cordon change which
// perNode groups want it; heartbeats and capacity do not.
func nodeMembershipMatters(e event.UpdateEvent) bool {
	o, n := e.ObjectOld.(*fleetv1.FleetNode), e.ObjectNew.(*fleetv1.FleetNode)
	return o.Status.Phase != n.Status.Phase || o.Spec.Unschedulable != n.Spec.Unschedulable ||
		!labels.Equals(o.Labels, n.Labels) || (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil)
}
