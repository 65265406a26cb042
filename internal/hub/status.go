package hub

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/fleetnode"
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

// nodeEvent records ev, the Event a setter returned, on n, a FleetNode the
// hub just wrote.
func (h *Hub) nodeEvent(n *fleetv1.FleetNode, ev fleetnode.Event) {
	if h.opts.Recorder != nil && n != nil && !ev.IsZero() {
		h.opts.Recorder.Eventf(n, nil, ev.Type, ev.Reason, "Transition", "%s", ev.Note)
	}
}

// runLiveness turns the liveness tracker's decisions into API writes.
func (h *Hub) runLiveness(ctx context.Context) error {
	period := min(max(h.opts.OfflineTimeout/20, 100*time.Millisecond), 5*time.Second)
	t := h.opts.Clock.NewTicker(period)
	defer t.Stop()
	adopted := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.Chan():
		}
		if !adopted {
			adopted = h.adoptNodes(ctx)
		}
		now := h.opts.Clock.Now()
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
			h.log.Info("node offline", "node", o.Node, "lastSeen", o.LastSeen)
			var c fleetnode.Change
			var wrote *fleetv1.FleetNode
			if h.writeStatus(ctx, o.Node, "offline", func(n *fleetv1.FleetNode) bool {
				wrote, c = n, fleetnode.SetHeartbeatTimeout(n, h.opts.Name, o.LastSeen, o.Adopted, now)
				return c.Changed
			}) {
				h.nodeEvent(wrote, c.Event)
			}
		}
		for _, u := range due.Unconnected {
			h.markUnconnected(ctx, u.Node, u.LastSeen)
		}
		for _, l := range due.Late {
			h.markNotResponding(ctx, l.Node, l.LastSeen)
		}
		for _, r := range due.Refresh {
			h.writeStatus(ctx, r.Node, "heartbeat-refresh", func(n *fleetv1.FleetNode) bool {
				return fleetnode.SetHeartbeat(n, h.opts.Name, r.LastSeen).Changed
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
	now := h.opts.Clock.Now()
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
	now := h.opts.Clock.Now()
	var c fleetnode.Change
	var wrote *fleetv1.FleetNode
	if h.writeStatus(ctx, node, "disconnect", func(n *fleetv1.FleetNode) bool {
		if h.Connected(node) {
			return false
		}
		wrote, c = n, fleetnode.SetUnconnected(n, h.opts.Name, since, now, h.opts.OfflineTimeout)
		return c.Changed
	}) {
		h.nodeEvent(wrote, c.Event)
	}
}

// markNotResponding marks a connected node that has been silent for a few
// heartbeat intervals Ready Unknown, NotResponding: the scheduler places
// nothing new on it until it is heard from (markResponding).
func (h *Hub) markNotResponding(ctx context.Context, node string, since time.Time) {
	now := h.opts.Clock.Now()
	var (
		c     fleetnode.Change
		wrote *fleetv1.FleetNode
		prev  metav1.Condition
	)
	if h.writeStatus(ctx, node, "not-responding", func(n *fleetv1.FleetNode) bool {
		// Heard from (or reconnected) since Tick said so: nothing to mark.
		h.mu.Lock()
		late := h.live.Late(node)
		h.mu.Unlock()
		if !late {
			return false
		}
		if r := meta.FindStatusCondition(n.Status.Conditions, fleetv1.ReadyCondition); r != nil {
			prev = *r
		}
		wrote, c = n, fleetnode.SetNotResponding(n, h.opts.Name, since, now, h.opts.OfflineTimeout)
		return c.Changed
	}) {
		h.mu.Lock()
		h.wasReady[node] = prev
		h.mu.Unlock()
		h.nodeEvent(wrote, c.Event)
	}
}

// markResponding is markNotResponding undone: the node was heard from. It
// reports whether the API is settled (written, or nothing to undo); on a
// failed write the next message from the node tries again.
func (h *Hub) markResponding(ctx context.Context, node string) bool {
	now := h.opts.Clock.Now()
	var (
		c       fleetnode.Change
		wrote   *fleetv1.FleetNode
		decided bool // the node was read and c says what it needs
	)
	if h.writeStatus(ctx, node, "responding", func(n *fleetv1.FleetNode) bool {
		decided = true
		h.mu.Lock()
		prev, ok := h.wasReady[node]
		h.mu.Unlock()
		var p *metav1.Condition
		if ok {
			p = &prev
		}
		wrote, c = n, fleetnode.SetResponding(n, h.opts.Name, p, now)
		return c.Changed
	}) {
		h.mu.Lock()
		delete(h.wasReady, node)
		h.mu.Unlock()
		h.nodeEvent(wrote, c.Event)
		return true
	}
	// Nothing to undo, unless the read or the write failed.
	return decided && !c.Changed
}

// LeaseName is the name of a hub's Lease.
func LeaseName(hub string) string { return "drover-hub-" + hub }

// runLease keeps the hub's Lease renewed. Other hubs read it to tell a dead
// hub's nodes from live ones (claimLostNodes).
func (h *Hub) runLease(ctx context.Context) error {
	every := h.opts.LeaseDuration / 3
	for {
		if err := h.renewLease(ctx); err != nil && ctx.Err() == nil {
			h.log.Error("renew hub lease", "lease", LeaseName(h.opts.Name), "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-h.opts.Clock.After(every):
		}
	}
}

func (h *Hub) renewLease(ctx context.Context) error {
	now := metav1.NewMicroTime(h.opts.Clock.Now())
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

// watchNodes closes the streams of nodes that were revoked, unapproved,
// deleted or registered again with another key since they connected (a
// FleetNode deleted and created again between two passes is not seen
// deleted), claims the nodes of lost hubs, and lists the keys of revoked
// nodes in the revocation list.
func (h *Hub) watchNodes(ctx context.Context) error {
	t := h.opts.Clock.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.Chan():
		}
		var list fleetv1.FleetNodeList
		if err := h.opts.Client.List(ctx, &list); err != nil {
			if ctx.Err() == nil {
				h.log.Error("list FleetNodes to claim those of lost hubs and list revoked keys; retrying", "err", err)
			}
		} else {
			h.claimLostNodes(ctx, list.Items)
			h.recordRevoked(ctx, list.Items)
		}
		h.mu.Lock()
		open := make(map[string]*session, len(h.sessions))
		for n, s := range h.sessions {
			open[n] = s
		}
		h.mu.Unlock()
		now := h.opts.Clock.Now()
		for name, s := range open {
			key := s.key
			var n fleetv1.FleetNode
			err := h.opts.Client.Get(ctx, client.ObjectKey{Name: name}, &n)
			reason := h.certEnded(s.cert, s.root, now)
			// A node whose certificate ended is still the fleet's: it
			// reconnects with a renewed one.
			certOnly := reason != ""
			switch {
			case reason != "":
			case apierrors.IsNotFound(err):
				reason = "node " + name + " was deleted"
			case err != nil:
				continue
			case n.Spec.Revoked:
				reason = "node " + name + " is revoked"
			case !n.Spec.Approved:
				reason = "node " + name + " is no longer approved"
			default:
				if err := h.checkKey(ctx, &n, key); status.Code(err) == codes.PermissionDenied {
					reason = status.Convert(err).Message()
				}
			}
			if reason == "" {
				continue
			}
			h.mu.Lock()
			// Only the stream checked: the node may have opened another
			// since, with a renewed certificate.
			cur := h.sessions[name] == s
			if cur && !certOnly {
				h.live.Forget(name)
			}
			h.mu.Unlock()
			if cur {
				h.log.Info("closing stream", "node", name, "reason", reason)
				s.close(reason)
			}
		}
	}
}

// claimLostNodes takes over the nodes the API shows Online at a hub whose
// Lease expired (the hub died) and whose agents have not connected anywhere
// since: no hub tracks them, and they would stay Online for ever. The claim
// is a status write under the optimistic lock (fleetnode.SetHubLost), so of
// two hubs claiming at once the second finds the node claimed and stops;
// the claimer then tracks the node as one it adopted after a restart, and
// makes it Offline after the offline timeout unless its agent connects,
// here or at another hub. A hub without a Lease in this hub's namespace is
// not taken for lost: it may serve another Drover, or be starting.
func (h *Hub) claimLostNodes(ctx context.Context, nodes []fleetv1.FleetNode) {
	lost := map[string]bool{} // by hub name, for this pass
	for i := range nodes {
		n := &nodes[i]
		other := n.Status.Hub
		if n.Spec.Revoked || n.Status.Phase != fleetv1.FleetNodeOnline || other == "" || other == h.opts.Name {
			continue
		}
		gone, ok := lost[other]
		if !ok {
			gone = h.hubLost(ctx, other)
			lost[other] = gone
		}
		if gone {
			h.claimNode(ctx, n.Name, other)
		}
	}
}

// hubLost reports whether hub's Lease has expired. A Lease that cannot be
// read says nothing: the next pass asks again.
func (h *Hub) hubLost(ctx context.Context, hub string) bool {
	var l coordinationv1.Lease
	err := h.opts.APIReader.Get(ctx, client.ObjectKey{Namespace: h.opts.Namespace, Name: LeaseName(hub)}, &l)
	if err != nil {
		if !apierrors.IsNotFound(err) && ctx.Err() == nil {
			h.log.Error("read a hub's Lease to tell whether its nodes are lost", "lease", LeaseName(hub), "err", err)
		}
		return false
	}
	return leaseExpired(&l, h.opts.Clock.Now(), h.opts.LeaseDuration)
}

// leaseExpired reports whether l's holder stopped renewing it: now is past
// its last renewal plus its duration (def when the Lease has none). Its
// holder renews it every third of the duration, which leaves room for
// clocks a little apart.
func leaseExpired(l *coordinationv1.Lease, now time.Time, def time.Duration) bool {
	if l.Spec.RenewTime == nil {
		return true
	}
	d := def
	if l.Spec.LeaseDurationSeconds != nil {
		d = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	return now.After(l.Spec.RenewTime.Add(d))
}

// claimNode claims node, Online at the lost hub lost, for this hub, unless
// its agent is connected here.
func (h *Hub) claimNode(ctx context.Context, node, lost string) {
	now := h.opts.Clock.Now()
	var c fleetnode.Change
	var wrote *fleetv1.FleetNode
	if !h.writeStatus(ctx, node, "hub-lost", func(n *fleetv1.FleetNode) bool {
		if h.Connected(node) {
			return false
		}
		wrote, c = n, fleetnode.SetHubLost(n, h.opts.Name, lost, now, h.opts.OfflineTimeout)
		return c.Changed
	}) {
		return
	}
	h.mu.Lock()
	if _, ok := h.sessions[node]; !ok {
		// Counted from the claim, whatever this hub knew of the node before.
		h.live.Forget(node)
		h.live.Adopt(node, now)
	}
	h.mu.Unlock()
	h.log.Info("claimed a node of a lost hub; Offline unless it connects", "node", node, "lostHub", lost, "within", h.opts.OfflineTimeout)
	h.nodeEvent(wrote, c.Event)
}
