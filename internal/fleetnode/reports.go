package fleetnode

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
)

// What an agent reports of its labels and capacity is a claim: NodeGrants
// and Tasks select nodes by label and the scheduler counts on capacity, so
// a node that could label itself pool=gpu, or claim a hundred GPUs, would
// steer other tenants' work to itself. The claims (status.reportedLabels,
// status.reportedCapacity, the hubs') reach placement only as approved
// (spec.approvedLabels, spec.approvedCapacity): metadata.labels carry the
// approved labels, status.capacity the least of claim and approval. Every
// difference waits, removals included: a selector may say NotIn or
// DoesNotExist, so dropping a label steers placement too.

// ApproveReported makes what the agent reports the approved labels and
// capacity (`drover approve`); it reports whether the spec changed.
func ApproveReported(n *fleetv1.FleetNode) bool {
	changed := false
	// The reserved keys from the facts again: an older hub's report has
	// only the agent's labels.
	s := &n.Status
	if l := nodeLabels(s.ReportedLabels, s.OS, s.Arch, s.Hostname); !maps.Equal(n.Spec.ApprovedLabels, l) {
		n.Spec.ApprovedLabels, changed = l, true
	}
	if c := reportedCapacity(n); !capacityEqual(n.Spec.ApprovedCapacity, c) {
		n.Spec.ApprovedCapacity, changed = c.DeepCopy(), true
	}
	return changed
}

// AdoptReported is the manager's: an approved node for which nothing was
// ever approved of its reports (spec.approved set by hand, or approved
// before approvals were recorded) has them approved as they are, as
// `drover approve` would have; it reports whether the spec changed. Once
// the manager has recorded LabelsApproved, a change of the reports waits
// for an operator.
func AdoptReported(n *fleetv1.FleetNode) bool {
	if !n.Spec.Approved || n.Spec.Revoked || n.Spec.ApprovedLabels != nil || n.Spec.ApprovedCapacity != nil ||
		meta.FindStatusCondition(n.Status.Conditions, fleetv1.LabelsApprovedCondition) != nil {
		return false
	}
	return ApproveReported(n)
}

// reportedCapacity is what the agent claims. A node whose hub predates
// reportedCapacity has its claim in capacity, until the manager first
// capped it (and recorded CapacityApproved).
func reportedCapacity(n *fleetv1.FleetNode) corev1.ResourceList {
	if n.Status.ReportedCapacity == nil && meta.FindStatusCondition(n.Status.Conditions, fleetv1.CapacityApprovedCondition) == nil {
		return n.Status.Capacity
	}
	return n.Status.ReportedCapacity
}

// ApplyApprovedLabels is the manager's: it brings n's metadata.labels in
// step with spec.approvedLabels, and reports whether it changed them or
// the annotation fleet.drover.io/agent-labels, which lists the keys it set
// (as kubectl's last-applied does):
//
//   - a listed key follows the approval: its value is the approved one, and
//     it is removed once no longer approved (an operator's edit of such a
//     key lasts until the manager next looks);
//   - an approved key the node already has but that is not listed is an
//     operator's: it keeps its value and stays unlisted; one the node does
//     not have is added and listed;
//   - a node without the annotation takes the keys whose value equals the
//     approved one as set from the agent.
func ApplyApprovedLabels(n *fleetv1.FleetNode) bool {
	before := maps.Clone(n.Labels)
	beforeAnn, hadAnn := n.Annotations[fleetv1.AnnotationAgentLabels]
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	owned := agentLabelKeys(n)
	approved := n.Spec.ApprovedLabels
	for k := range owned {
		if _, ok := approved[k]; !ok {
			delete(n.Labels, k)
			delete(owned, k)
		}
	}
	for k, v := range approved {
		if _, has := n.Labels[k]; has && !owned[k] {
			continue // an operator's label
		}
		n.Labels[k] = v
		owned[k] = true
	}
	if len(n.Labels) == 0 && before == nil {
		n.Labels = nil
	}
	ann := strings.Join(slices.Sorted(maps.Keys(owned)), ",")
	if n.Annotations == nil {
		n.Annotations = map[string]string{}
	}
	n.Annotations[fleetv1.AnnotationAgentLabels] = ann
	return !maps.Equal(before, n.Labels) || !hadAnn || beforeAnn != ann
}

// agentLabelKeys returns the keys set from the agent's approved labels:
// those the annotation lists, or for a node without it those whose value
// is the approved one.
func agentLabelKeys(n *fleetv1.FleetNode) map[string]bool {
	owned := map[string]bool{}
	a, ok := n.Annotations[fleetv1.AnnotationAgentLabels]
	if !ok {
		for k, v := range n.Spec.ApprovedLabels {
			if cur, ok := n.Labels[k]; ok && cur == v {
				owned[k] = true
			}
		}
		return owned
	}
	for k := range strings.SplitSeq(a, ",") {
		if k = strings.TrimSpace(k); k != "" {
			owned[k] = true
		}
	}
	return owned
}

// LabelChanges lists, sorted by key, how the labels the agent reports
// differ from the approved ones: "k=v (new)", "k=v (was w)", "k (removed)".
func LabelChanges(n *fleetv1.FleetNode) []string {
	approved, reported := n.Spec.ApprovedLabels, n.Status.ReportedLabels
	var out []string
	for _, k := range slices.Sorted(maps.Keys(reported)) {
		v := reported[k]
		switch was, ok := approved[k]; {
		case !ok:
			out = append(out, fmt.Sprintf("%s=%s (new)", k, v))
		case was != v:
			out = append(out, fmt.Sprintf("%s=%s (was %s)", k, v, was))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(approved)) {
		if _, ok := reported[k]; !ok {
			out = append(out, k+" (removed)")
		}
	}
	return out
}

// CapacityOverApproved lists, sorted by resource, what the agent claims
// beyond the approved capacity: "gpu: claims 4, approved 2".
func CapacityOverApproved(n *fleetv1.FleetNode) []string {
	reported := reportedCapacity(n)
	var out []string
	for _, name := range slices.Sorted(maps.Keys(reported)) {
		q := reported[name]
		a, ok := n.Spec.ApprovedCapacity[name]
		switch {
		case !ok && !q.IsZero():
			out = append(out, fmt.Sprintf("%s: claims %s, none approved", name, q.String()))
		case ok && q.Cmp(a) > 0:
			out = append(out, fmt.Sprintf("%s: claims %s, approved %s", name, q.String(), a.String()))
		}
	}
	return out
}

// SetLabelsApproval is the manager's: LabelsApproved True while the agent
// reports the approved labels, False, reason LabelChangePending, with the
// changes, while it reports others (announced as a warning, and again when
// the changes change). An unapproved node has nothing approved to compare
// with and is left alone, and so is a node whose agent reported nothing yet
// (an agent always reports its OS): until the condition is recorded, the
// manager approves the first report of a node approved by hand
// (AdoptReported), so an approval that raced the registration's status
// write still approves what the agent registered with.
func SetLabelsApproval(n *fleetv1.FleetNode, now time.Time) Change {
	if !n.Spec.Approved || n.Status.ReportedLabels == nil {
		return Change{}
	}
	prev := meta.FindStatusCondition(n.Status.Conditions, fleetv1.LabelsApprovedCondition)
	changes := LabelChanges(n)
	if len(changes) == 0 {
		if prev != nil && prev.Status == metav1.ConditionTrue {
			return Change{}
		}
		msg := "the agent reports the approved labels"
		setCondition(n, fleetv1.LabelsApprovedCondition, metav1.ConditionTrue, fleetv1.ReasonAsApproved, msg, now)
		if prev == nil {
			return changed
		}
		return normal(fleetv1.ReasonAsApproved, msg)
	}
	msg := fmt.Sprintf("the agent reports labels that are not approved: %s; the node keeps its approved labels until `drover approve %s`",
		strings.Join(changes, ", "), n.Name)
	if prev != nil && prev.Status == metav1.ConditionFalse && prev.Message == msg {
		return Change{}
	}
	setCondition(n, fleetv1.LabelsApprovedCondition, metav1.ConditionFalse, fleetv1.ReasonLabelChangePending, msg, now)
	return warning(fleetv1.ReasonLabelChangePending, msg)
}

// SetCapacity is the manager's: status.capacity, what the scheduler counts
// on, is for each resource the agent claims the least of the claim and the
// approved capacity (a resource not approved is left out: none). An
// approved node's CapacityApproved condition says whether the claim went
// beyond (False, reason CapacityOverApproved, announced as a warning).
func SetCapacity(n *fleetv1.FleetNode, now time.Time) Change {
	var c Change
	if n.Status.ReportedCapacity == nil && n.Status.Capacity != nil {
		if legacy := reportedCapacity(n); legacy != nil {
			// Once: the claim an older hub wrote into capacity moves where
			// the hubs now write it, before capacity is capped.
			n.Status.ReportedCapacity, c = legacy.DeepCopy(), changed
		}
	}
	over := CapacityOverApproved(n)
	capped := corev1.ResourceList{}
	for name, q := range reportedCapacity(n) {
		a, ok := n.Spec.ApprovedCapacity[name]
		if !ok {
			continue
		}
		if q.Cmp(a) > 0 {
			q = a
		}
		capped[name] = q.DeepCopy()
	}
	if len(capped) == 0 {
		capped = nil
	}
	if !capacityEqual(n.Status.Capacity, capped) {
		n.Status.Capacity, c = capped, changed
	}
	if !n.Spec.Approved {
		return c
	}
	prev := meta.FindStatusCondition(n.Status.Conditions, fleetv1.CapacityApprovedCondition)
	if len(over) == 0 {
		if prev != nil && prev.Status == metav1.ConditionTrue {
			return c
		}
		setCondition(n, fleetv1.CapacityApprovedCondition, metav1.ConditionTrue, fleetv1.ReasonAsApproved,
			"the agent claims no more than the approved capacity", now)
		return changed
	}
	msg := fmt.Sprintf("the agent claims more than the approved capacity: %s; the scheduler counts on the approved amounts "+
		"(`drover approve %s` approves the claim)", strings.Join(over, ", "), n.Name)
	if prev != nil && prev.Status == metav1.ConditionFalse && prev.Message == msg {
		return c
	}
	setCondition(n, fleetv1.CapacityApprovedCondition, metav1.ConditionFalse, fleetv1.ReasonCapacityOverApproved, msg, now)
	return warning(fleetv1.ReasonCapacityOverApproved, msg)
}
