package hub

import (
	"context"
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
)

// writeStatus reads the node uncached, applies mutate and patches status
// with an optimistic lock, retrying on conflict. mutate returns false to
// skip the write (e.g. another hub holds the node now). Errors are logged:
// the caller has nothing better to do with them, and the next transition or
// refresh writes again.
func (h *Hub) writeStatus(ctx context.Context, node, reason string, mutate func(*fleetv1.FleetNode) bool) bool {
	return h.writeStatusOn(ctx, node, nil, reason, mutate)
}

// writeStatusOn is writeStatus starting from latest, an object the caller
// just got from the API (e.g. what Create returned), which saves the read;
// a conflict falls back to reading.
func (h *Hub) writeStatusOn(ctx context.Context, node string, latest *fleetv1.FleetNode, reason string, mutate func(*fleetv1.FleetNode) bool) bool {
	wrote := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var n fleetv1.FleetNode
		if latest != nil {
			latest.DeepCopyInto(&n)
			latest = nil
		} else if err := h.opts.APIReader.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
			return err
		}
		before := n.DeepCopy()
		if !mutate(&n) {
			return nil
		}
		if err := h.opts.Client.Status().Patch(ctx, &n, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			return err
		}
		wrote = true
		return nil
	})
	if err != nil {
		if !apierrors.IsNotFound(err) {
			h.log.Error("write node status", "node", node, "reason", reason, "err", err)
		}
		return false
	}
	if wrote {
		h.metrics.apiWrites.WithLabelValues(reason).Inc()
	}
	return wrote
}

// nodeEvent records an Event on n, a FleetNode the hub just wrote.
func (h *Hub) nodeEvent(n *fleetv1.FleetNode, typ, reason, note string) {
	if h.opts.Recorder != nil && n != nil {
		h.opts.Recorder.Eventf(n, nil, typ, reason, "Transition", "%s", note)
	}
}

// setReady sets the Ready condition and the phase that goes with it.
func setReady(n *fleetv1.FleetNode, ready bool, reason, msg string, now time.Time) {
	st := metav1.ConditionFalse
	n.Status.Phase = fleetv1.FleetNodeOffline
	if ready {
		st = metav1.ConditionTrue
		n.Status.Phase = fleetv1.FleetNodeOnline
	}
	meta.SetStatusCondition(&n.Status.Conditions, metav1.Condition{
		Type: fleetv1.ReadyCondition, Status: st, Reason: reason, Message: msg,
		ObservedGeneration: n.Generation, LastTransitionTime: metav1.NewTime(now),
	})
}

// runLiveness turns the liveness tracker's decisions into API writes.
func (h *Hub) runLiveness(ctx context.Context) error {
	period := min(max(h.opts.OfflineTimeout/20, 100*time.Millisecond), 5*time.Second)
	t := time.NewTicker(period)
	defer t.Stop()
	adopted := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if !adopted {
			adopted = h.adoptNodes(ctx)
		}
		now := h.opts.Now()
		h.mu.Lock()
		due := h.live.Tick(now)
		var silent []*session
		for _, o := range due.Offline {
			if s, ok := h.sessions[o.Node]; ok {
				silent = append(silent, s)
			}
			delete(h.wasReady, o.Node)
		}
		h.mu.Unlock()
		for _, s := range silent {
			s.close("no heartbeat within the offline timeout")
		}
		for _, o := range due.Offline {
			last := o.LastSeen
			h.log.Info("node offline", "node", o.Node, "lastSeen", last)
			adopted := o.Adopted
			var wrote *fleetv1.FleetNode
			if h.writeStatus(ctx, o.Node, "offline", func(n *fleetv1.FleetNode) bool {
				wrote = n
				if n.Status.Hub != h.opts.Name || n.Status.Phase != fleetv1.FleetNodeOnline {
					return false // another hub took it over, or it is already not Online
				}
				if adopted {
					// The last heartbeat the API has is older than this
					// hub; keep it.
					setReady(n, false, fleetv1.ReasonHeartbeatTimeout, fmt.Sprintf("not connected since hub %s restarted at %s (last heartbeat on record: %s)",
						h.opts.Name, last.UTC().Format(time.RFC3339), heartbeatOnRecord(n)), now)
					return true
				}
				setReady(n, false, fleetv1.ReasonHeartbeatTimeout, "no heartbeat since "+last.UTC().Format(time.RFC3339), now)
				lt := metav1.NewTime(last.Truncate(time.Second))
				n.Status.LastHeartbeatTime = &lt
				return true
			}) {
				h.nodeEvent(wrote, corev1.EventTypeWarning, fleetv1.ReasonHeartbeatTimeout, readyMessage(wrote))
			}
		}
		for _, u := range due.Unconnected {
			h.markUnconnected(ctx, u.Node, u.LastSeen)
		}
		for _, l := range due.Late {
			h.markNotResponding(ctx, l.Node, l.LastSeen)
		}
		for _, r := range due.Refresh {
			seen := r.LastSeen
			h.writeStatus(ctx, r.Node, "heartbeat-refresh", func(n *fleetv1.FleetNode) bool {
				if n.Status.Hub != h.opts.Name {
					return false
				}
				lt := metav1.NewTime(seen.Truncate(time.Second))
				n.Status.LastHeartbeatTime = &lt
				return true
			})
		}
	}
}

// adoptNodes hands the liveness tracker the nodes the API shows Online at
// this hub that have not connected to it: after a restart, a node that never
// comes back must still go Offline (and its tasks be rescheduled). It
// reports false when the nodes could not be listed; the caller tries again.
func (h *Hub) adoptNodes(ctx context.Context) bool {
	var list fleetv1.FleetNodeList
	if err := h.opts.APIReader.List(ctx, &list); err != nil {
		if ctx.Err() == nil {
			h.log.Error("list FleetNodes to adopt the ones Online at this hub; retrying", "err", err)
		}
		return false
	}
	now := h.opts.Now()
	var names []string
	h.mu.Lock()
	for i := range list.Items {
		n := &list.Items[i]
		if n.Status.Hub == h.opts.Name && n.Status.Phase == fleetv1.FleetNodeOnline && h.live.Adopt(n.Name, now) {
			names = append(names, n.Name)
		}
	}
	h.mu.Unlock()
	if len(names) > 0 {
		h.log.Info("adopted nodes Online at this hub before it started; Offline unless they connect",
			"nodes", len(names), "first", names[0], "within", h.opts.OfflineTimeout)
	}
	return true
}

// markUnconnected marks an adopted node that has not connected within the
// grace Disconnected, so that the scheduler stops placing work on it while
// it may still come back.
func (h *Hub) markUnconnected(ctx context.Context, node string, since time.Time) {
	now := h.opts.Now()
	var wrote *fleetv1.FleetNode
	if h.writeStatus(ctx, node, "disconnect", func(n *fleetv1.FleetNode) bool {
		wrote = n
		if h.Connected(node) || n.Status.Hub != h.opts.Name || n.Status.Phase != fleetv1.FleetNodeOnline {
			return false
		}
		c := meta.FindStatusCondition(n.Status.Conditions, fleetv1.ReadyCondition)
		if c != nil && c.Status == metav1.ConditionUnknown {
			return false
		}
		meta.SetStatusCondition(&n.Status.Conditions, metav1.Condition{
			Type: fleetv1.ReadyCondition, Status: metav1.ConditionUnknown, Reason: fleetv1.ReasonDisconnected,
			Message: fmt.Sprintf("not connected since hub %s restarted at %s; Offline after %s unless it reconnects",
				h.opts.Name, since.UTC().Format(time.RFC3339), h.opts.OfflineTimeout),
			ObservedGeneration: n.Generation, LastTransitionTime: metav1.NewTime(now),
		})
		return true
	}) {
		h.nodeEvent(wrote, corev1.EventTypeNormal, fleetv1.ReasonDisconnected, readyMessage(wrote))
	}
}

// markNotResponding marks a connected node that has been silent for a few
// heartbeat intervals Ready Unknown, NotResponding: the scheduler places
// nothing new on it until it is heard from (markResponding).
func (h *Hub) markNotResponding(ctx context.Context, node string, since time.Time) {
	now := h.opts.Now()
	var (
		wrote *fleetv1.FleetNode
		prev  metav1.Condition
	)
	if h.writeStatus(ctx, node, "not-responding", func(n *fleetv1.FleetNode) bool {
		wrote = n
		if n.Status.Hub != h.opts.Name || n.Status.Phase != fleetv1.FleetNodeOnline || !meta.IsStatusConditionTrue(n.Status.Conditions, fleetv1.ReadyCondition) {
			return false
		}
		// Heard from (or reconnected) since Tick said so: nothing to mark.
		h.mu.Lock()
		late := h.live.Late(node)
		h.mu.Unlock()
		if !late {
			return false
		}
		prev = *meta.FindStatusCondition(n.Status.Conditions, fleetv1.ReadyCondition)
		meta.SetStatusCondition(&n.Status.Conditions, metav1.Condition{
			Type: fleetv1.ReadyCondition, Status: metav1.ConditionUnknown, Reason: fleetv1.ReasonNotResponding,
			Message: fmt.Sprintf("nothing from the agent since %s though its stream to hub %s is open; Offline after %s unless it is heard from",
				since.UTC().Format(time.RFC3339), h.opts.Name, h.opts.OfflineTimeout),
			ObservedGeneration: n.Generation, LastTransitionTime: metav1.NewTime(now),
		})
		return true
	}) {
		h.mu.Lock()
		h.wasReady[node] = prev
		h.mu.Unlock()
		h.nodeEvent(wrote, corev1.EventTypeWarning, fleetv1.ReasonNotResponding, readyMessage(wrote))
	}
}

// markResponding is markNotResponding undone: the node was heard from. It
// reports whether the API is settled (written, or nothing to undo); on a
// failed write the next message from the node tries again.
func (h *Hub) markResponding(ctx context.Context, node string) bool {
	now := h.opts.Now()
	var wrote *fleetv1.FleetNode
	nothing := false
	if h.writeStatus(ctx, node, "responding", func(n *fleetv1.FleetNode) bool {
		wrote = n
		c := meta.FindStatusCondition(n.Status.Conditions, fleetv1.ReadyCondition)
		if n.Status.Hub != h.opts.Name || n.Status.Phase != fleetv1.FleetNodeOnline || c == nil || c.Reason != fleetv1.ReasonNotResponding {
			nothing = true
			return false
		}
		nothing = false
		h.mu.Lock()
		prev, ok := h.wasReady[node]
		delete(h.wasReady, node)
		h.mu.Unlock()
		if !ok {
			prev = metav1.Condition{Reason: fleetv1.ReasonConnected, Message: "connected to hub " + h.opts.Name}
		}
		const again = " (heard from again after a silence)"
		setReady(n, true, prev.Reason, strings.TrimSuffix(prev.Message, again)+again, now)
		return true
	}) {
		h.nodeEvent(wrote, corev1.EventTypeNormal, fleetv1.ReasonConnected, readyMessage(wrote))
		return true
	}
	return nothing
}

// readyMessage is the message of n's Ready condition.
func readyMessage(n *fleetv1.FleetNode) string {
	if c := meta.FindStatusCondition(n.Status.Conditions, fleetv1.ReadyCondition); c != nil {
		return c.Message
	}
	return ""
}

func heartbeatOnRecord(n *fleetv1.FleetNode) string {
	if n.Status.LastHeartbeatTime == nil {
		return "none"
	}
	return n.Status.LastHeartbeatTime.UTC().Format(time.RFC3339)
}

// LeaseName is the name of a hub's Lease.
func LeaseName(hub string) string { return "drover-hub-" + hub }

// runLease keeps the hub's Lease renewed. The manager reads it to tell a dead
// hub's nodes from live ones.
func (h *Hub) runLease(ctx context.Context) error {
	every := h.opts.LeaseDuration / 3
	for {
		if err := h.renewLease(ctx); err != nil && ctx.Err() == nil {
			h.log.Error("renew hub lease", "lease", LeaseName(h.opts.Name), "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(every):
		}
	}
}

func (h *Hub) renewLease(ctx context.Context) error {
	now := metav1.NewMicroTime(h.opts.Now())
	var l coordinationv1.Lease
	key := client.ObjectKey{Namespace: h.opts.Namespace, Name: LeaseName(h.opts.Name)}
	err := h.opts.APIReader.Get(ctx, key, &l)
	if apierrors.IsNotFound(err) {
		l = coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace, Labels: map[string]string{"fleet.drover.io/component": "hub"},
				Annotations: map[string]string{AnnotationHubAddress: h.advertisedAddress()}},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To(h.opts.Name),
				LeaseDurationSeconds: ptr.To(int32(h.opts.LeaseDuration / time.Second)),
				AcquireTime:          &now,
				RenewTime:            &now,
			},
		}
		return h.opts.Client.Create(ctx, &l)
	}
	if err != nil {
		return err
	}
	l.Spec.RenewTime = &now
	if a := h.advertisedAddress(); a != "" && l.Annotations[AnnotationHubAddress] != a {
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		l.Annotations[AnnotationHubAddress] = a
	}
	l.Spec.HolderIdentity = ptr.To(h.opts.Name)
	l.Spec.LeaseDurationSeconds = ptr.To(int32(h.opts.LeaseDuration / time.Second))
	return h.opts.Client.Update(ctx, &l)
}

// watchNodes closes the streams of nodes that were revoked, unapproved or
// deleted since they connected.
func (h *Hub) watchNodes(ctx context.Context) error {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		h.mu.Lock()
		names := make([]string, 0, len(h.sessions))
		for n := range h.sessions {
			names = append(names, n)
		}
		h.mu.Unlock()
		for _, name := range names {
			var n fleetv1.FleetNode
			err := h.opts.Client.Get(ctx, client.ObjectKey{Name: name}, &n)
			reason := ""
			switch {
			case apierrors.IsNotFound(err):
				reason = "node " + name + " was deleted"
			case err != nil:
				continue
			case n.Spec.Revoked:
				reason = "node " + name + " is revoked"
			case !n.Spec.Approved:
				reason = "node " + name + " is no longer approved"
			}
			if reason == "" {
				continue
			}
			h.mu.Lock()
			s := h.sessions[name]
			h.live.Forget(name)
			h.mu.Unlock()
			if s != nil {
				h.log.Info("closing stream", "node", name, "reason", reason)
				s.close(reason)
			}
		}
	}
}
