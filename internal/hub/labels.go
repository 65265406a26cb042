package hub

import (
	"context"
	"maps"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// The scheduler matches a FleetNode's metadata.labels, which operators may
// edit with kubectl too; the agent's labels (--labels) reach them here, at
// registration (in the Create) and on every connect (a patch, only when
// something changed). The rules:
//
//   - fleet.drover.io/os, /arch and /hostname are the hub's: they follow the
//     NodeInfo fields, and an agent label with one of these keys is ignored
//     (it still shows in status.reportedLabels).
//   - The keys the hub set from the agent are listed in the annotation
//     fleet.drover.io/agent-labels. A listed key follows the agent: its
//     value is the reported one, and it is removed when the agent stops
//     reporting it (an operator's edit of such a key lasts until the next
//     connect).
//   - A reported key the node already has but that is not listed is an
//     operator's: it keeps its value and stays unlisted. A reported key the
//     node does not have is added and listed.
//   - A node without the annotation (made by an older hub) takes the keys
//     whose value equals status.reportedLabels' as the agent's.

// reservedLabel reports whether key is a label the hub sets itself.
func reservedLabel(key string) bool {
	return key == fleetv1.LabelOS || key == fleetv1.LabelArch || key == fleetv1.LabelHostname
}

// agentLabelKeys returns the keys the hub last set from the agent, from the
// annotation, or for a node without it those whose value equals what the
// agent last reported.
func agentLabelKeys(n *fleetv1.FleetNode) map[string]bool {
	owned := map[string]bool{}
	a, ok := n.Annotations[fleetv1.AnnotationAgentLabels]
	if !ok {
		for k, v := range n.Status.ReportedLabels {
			if cur, ok := n.Labels[k]; ok && cur == v && !reservedLabel(k) {
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

// syncLabels brings n's metadata.labels and its agent-labels annotation in
// step with what the agent reports (see the rules above); it reports
// whether it changed anything. A nil info changes nothing.
func syncLabels(n *fleetv1.FleetNode, info *agentv1.NodeInfo) bool {
	if info == nil {
		return false
	}
	before := maps.Clone(n.Labels)
	beforeAnn, hadAnn := n.Annotations[fleetv1.AnnotationAgentLabels]
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	owned := agentLabelKeys(n)
	reported := info.GetLabels()
	for k := range owned {
		if _, ok := reported[k]; !ok || reservedLabel(k) {
			delete(n.Labels, k)
			delete(owned, k)
		}
	}
	for k, v := range reported {
		if reservedLabel(k) {
			continue
		}
		if _, has := n.Labels[k]; has && !owned[k] {
			continue // an operator's label
		}
		n.Labels[k] = v
		owned[k] = true
	}
	if v := info.GetOs(); v != "" {
		n.Labels[fleetv1.LabelOS] = v
	}
	if v := info.GetArch(); v != "" {
		n.Labels[fleetv1.LabelArch] = v
	}
	if v := info.GetHostname(); v != "" && len(validation.IsValidLabelValue(v)) == 0 {
		n.Labels[fleetv1.LabelHostname] = v
	}
	ann := strings.Join(slices.Sorted(maps.Keys(owned)), ",")
	if n.Annotations == nil {
		n.Annotations = map[string]string{}
	}
	n.Annotations[fleetv1.AnnotationAgentLabels] = ann
	return !maps.Equal(before, n.Labels) || !hadAnn || beforeAnn != ann
}

// patchLabels writes syncLabels' changes to fn, the node as just read from
// the API, with an optimistic lock (a conflict reads it again). It returns
// the node as the API returned it after the write, for the status write
// that follows, or nil if nothing was written.
func (h *Hub) patchLabels(ctx context.Context, fn *fleetv1.FleetNode, info *agentv1.NodeInfo) *fleetv1.FleetNode {
	var latest *fleetv1.FleetNode
	n := fn.DeepCopy()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if n == nil {
			n = &fleetv1.FleetNode{}
			if err := h.opts.APIReader.Get(ctx, client.ObjectKey{Name: fn.Name}, n); err != nil {
				return err
			}
		}
		before := n.DeepCopy()
		if !syncLabels(n, info) {
			return nil
		}
		if err := h.opts.Client.Patch(ctx, n, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			n = nil
			return err
		}
		latest = n
		return nil
	})
	if err != nil {
		if !apierrors.IsNotFound(err) {
			h.log.Error("write node labels", "node", fn.Name, "err", err)
		}
		return nil
	}
	if latest != nil {
		h.metrics.apiWrites.WithLabelValues("labels").Inc()
		h.log.Info("node labels updated from the agent's", "node", fn.Name, "labels", latest.Labels)
	}
	return latest
}
