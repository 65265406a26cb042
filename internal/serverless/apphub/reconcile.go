package apphub

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	serverlessv1 "github.com/drover-fleet/drover/api/serverless/v1alpha1"
	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/serverless/appwire"
)

// awaitRetry is how soon a reconcile comes back while the hub is not
// attached or its caches load.
const awaitRetry = time.Second

// bindRetry is how soon a bound session whose instance is not in its
// slice yet (the manager's two writes of the cold path, seen out of order)
// is looked at again.
const bindRetry = 200 * time.Millisecond

// notHereRetry is how often a deleted session whose node is not connected
// here is looked at again.
const notHereRetry = 30 * time.Second

type sliceReconciler struct{ f *Feature }

// Reconcile sends the instances added to a slice to its node, if connected
// here, and cancels those removed.
func (r sliceReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	f := r.f
	h := f.getHub()
	if h == nil || !f.synced.Load() {
		return reconcile.Result{RequeueAfter: awaitRetry}, nil
	}
	var s serverlessv1.InstanceSlice
	if err := f.opts.Client.Get(ctx, req.NamespacedName, &s); err != nil {
		if apierrors.IsNotFound(err) {
			f.forgetSlice(req.NamespacedName, nil)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	if s.DeletionTimestamp != nil {
		f.forgetSlice(req.NamespacedName, nil)
		return reconcile.Result{}, nil
	}
	node := s.Spec.NodeName
	want := map[string]struct{}{}
	for _, in := range s.Spec.Instances {
		want[in.UID] = struct{}{}
	}
	f.forgetSlice(req.NamespacedName, want)
	if canSend(h, node) != nil {
		return reconcile.Result{}, nil
	}
	app := f.application(ctx, s.Namespace, s.Spec.Application)
	if app == nil {
		// The manager makes no slice for a missing Application, and the
		// slice goes with it (owner reference): a short-lived race.
		return reconcile.Result{RequeueAfter: 5 * time.Second}, nil
	}
	for _, in := range s.Spec.Instances {
		f.sendInstance(req.NamespacedName, node, app, in)
	}
	return reconcile.Result{}, nil
}

// sendInstance dispatches instance in of the slice k to node unless this
// hub sent it already.
func (f *Feature) sendInstance(k types.NamespacedName, node string, app *serverlessv1.Application, in serverlessv1.SliceInstance) {
	f.mu.Lock()
	ir := f.insts[in.UID]
	sent := ir != nil && ir.sent && ir.node == node
	f.mu.Unlock()
	if sent {
		return
	}
	h := f.getHub()
	it, err := InstanceItem(app, in)
	if err != nil {
		f.log.Error("cannot build an instance's item", "slice", k, "instance", in.Name, "err", err)
		return
	}
	// Recorded before the send: the agent's first report may come before
	// Dispatch returns (Assigned).
	f.mu.Lock()
	f.sliceLocked(k, node).insts[in.UID] = struct{}{}
	f.instLocked(in.UID, node, k, in.Name).sent = true
	f.mu.Unlock()
	if err := h.Dispatch(node, it); err != nil {
		f.mu.Lock()
		if ir := f.insts[in.UID]; ir != nil {
			ir.sent = false
		}
		f.mu.Unlock()
		f.log.Info("instance not dispatched; the node's next snapshot carries it", "slice", k, "instance", in.Name, "node", node, "err", err)
		return
	}
	f.m.dispatched.Inc()
	f.log.Debug("instance dispatched", "slice", k, "instance", in.Name, "node", node, "standby", in.Standby)
}

// forgetSlice cancels the instances of slice k this hub knows that are not
// in keep (nil: the slice is gone, all of them) and drops their reports,
// so that the slice's status loses them too.
func (f *Feature) forgetSlice(k types.NamespacedName, keep map[string]struct{}) {
	type cancel struct{ node, id string }
	var cancels []cancel
	f.mu.Lock()
	sr := f.slices[k]
	dirty := false
	var ids map[string]struct{}
	if sr != nil {
		ids = sr.insts
	}
	for id := range ids {
		if _, ok := keep[id]; ok {
			continue
		}
		delete(sr.insts, id)
		ir := f.insts[id]
		if ir == nil {
			continue
		}
		if ir.sent {
			cancels = append(cancels, cancel{ir.node, id})
		}
		f.rememberGoneLocked(appwire.InstanceWorkID(id), ir.node)
		delete(f.insts, id)
		dirty = dirty || ir.status != nil
	}
	if keep == nil {
		delete(f.slices, k)
	} else if dirty && sr != nil {
		sr.dirty = true
	}
	f.mu.Unlock()
	h := f.getHub()
	for _, c := range cancels {
		if h == nil || !h.Connected(c.node) {
			continue // its next snapshot leaves it out
		}
		if err := h.Cancel(c.node, appwire.InstanceWorkID(c.id)); err == nil {
			f.m.cancels.Inc()
			f.log.Info("instance cancelled: no longer in its slice", "slice", k, "node", c.node, "work", appwire.InstanceWorkID(c.id))
		}
	}
	if dirty && keep != nil {
		f.queueSlice(k)
	}
}

type sessionReconciler struct{ f *Feature }

// Reconcile sends a newly bound session to its node, if connected here;
// cancels a session being deleted; and removes the finalizer of one that
// is Terminated.
func (r sessionReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	f := r.f
	h := f.getHub()
	if h == nil || !f.synced.Load() {
		return reconcile.Result{RequeueAfter: awaitRetry}, nil
	}
	var s serverlessv1.ApplicationSession
	if err := f.opts.Client.Get(ctx, req.NamespacedName, &s); err != nil {
		if apierrors.IsNotFound(err) {
			f.forgetSession(req.NamespacedName)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	node := s.Spec.NodeName
	if node == "" {
		return reconcile.Result{}, nil // not bound: the manager's
	}
	uid := string(s.UID)
	f.mu.Lock()
	rec := f.sessLocked(req.NamespacedName, uid, node)
	sent := rec.sent
	f.mu.Unlock()

	if s.Status.Phase.Final() {
		// Nothing holds an ended session: not while it is kept, and not
		// when it is deleted.
		return f.releaseFinalizer(ctx, &s)
	}
	if s.DeletionTimestamp != nil {
		return f.closeDeleted(ctx, h, &s, rec)
	}
	if sent || canSend(h, node) != nil {
		return reconcile.Result{}, nil
	}
	sk, in, ok := f.instanceOf(ctx, &s)
	if !ok {
		return reconcile.Result{RequeueAfter: bindRetry}, nil
	}
	app := f.application(ctx, s.Namespace, s.Spec.Application)
	if app != nil {
		// Its instance first: the two reconciles race, and the agent must
		// know the instance a session names.
		f.sendInstance(sk, node, app, in)
	}
	it, err := SessionItem(app, &s, in.UID)
	if err != nil {
		f.log.Error("cannot build a session's item", "session", req.NamespacedName, "err", err)
		return reconcile.Result{}, nil
	}
	f.mu.Lock()
	rec.sent = true
	f.mu.Unlock()
	if err := h.Dispatch(node, it); err != nil {
		f.mu.Lock()
		rec.sent = false
		f.mu.Unlock()
		f.log.Info("session not dispatched; the node's next snapshot carries it", "session", req.NamespacedName, "node", node, "err", err)
		return reconcile.Result{}, nil
	}
	f.m.dispatched.Inc()
	f.log.Debug("session dispatched", "session", req.NamespacedName, "node", node, "instance", in.Name)
	return reconcile.Result{}, nil
}

// closeDeleted cancels a deleted session at its node, if connected here,
// even if this hub did not send it (an earlier hub did): the agent closes
// it and reports Terminated, which releases it. An agent that does not
// confirm within CleanupTimeout (it never got the session, or lost it) is
// not waited for any longer: the session is written Terminated,
// InstanceGone, and released.
func (f *Feature) closeDeleted(ctx context.Context, h hub.Link, s *serverlessv1.ApplicationSession, rec *sessRec) (reconcile.Result, error) {
	node := s.Spec.NodeName
	f.mu.Lock()
	cancelled, at := rec.cancelled, rec.cancelledAt
	f.mu.Unlock()
	if !cancelled {
		if !h.Connected(node) {
			// The node's hub's, or the manager's once the node is lost;
			// looked at again in case the node comes here.
			return reconcile.Result{RequeueAfter: notHereRetry}, nil
		}
		if err := h.Cancel(node, rec.work); err != nil {
			return reconcile.Result{}, err
		}
		at = f.opts.Clock.Now()
		f.mu.Lock()
		rec.cancelled, rec.cancelledAt = true, at
		f.mu.Unlock()
		f.m.cancels.Inc()
		f.log.Info("session cancelled: deleted", "session", client.ObjectKeyFromObject(s), "node", node)
	}
	if wait := at.Add(f.opts.CleanupTimeout).Sub(f.opts.Clock.Now()); wait > 0 {
		return reconcile.Result{RequeueAfter: wait}, nil
	}
	f.mu.Lock()
	rec.want.phase = serverlessv1.SessionTerminated // later reports change nothing
	f.mu.Unlock()
	w := sessWant{phase: serverlessv1.SessionTerminated, reason: serverlessv1.ReasonInstanceGone, flagged: s.Status.Flagged,
		clients: s.Status.Clients, message: fmt.Sprintf("node %s did not confirm the close within %s of the cancel", node, f.opts.CleanupTimeout)}
	if err := f.writeSession(ctx, s, nil, node, w); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	return f.releaseFinalizer(ctx, s)
}

// releaseFinalizer removes serverlessv1.FinalizerSession from an ended
// session.
func (f *Feature) releaseFinalizer(ctx context.Context, s *serverlessv1.ApplicationSession) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(s, serverlessv1.FinalizerSession) {
		return reconcile.Result{}, nil
	}
	patch := client.MergeFromWithOptions(s.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(s, serverlessv1.FinalizerSession)
	if err := f.opts.Client.Patch(ctx, s, patch); err != nil {
		if apierrors.IsConflict(err) {
			f.m.conflicts.Inc()
		}
		// A conflict: the update that caused it brings the session back.
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	f.log.Info("session finalizer released", "session", client.ObjectKeyFromObject(s), "reason", s.Status.Reason)
	return reconcile.Result{}, nil
}

// forgetSession drops what this hub knew of a session that is gone.
func (f *Feature) forgetSession(k types.NamespacedName) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.sessions[k]
	if r == nil {
		return
	}
	delete(f.sessions, k)
	delete(f.sessUID, r.uid)
	if r.node != "" {
		f.rememberGoneLocked(r.work, r.node)
	}
}

func (f *Feature) event(s *serverlessv1.ApplicationSession, typ, reason, action, note string, args ...any) {
	if f.opts.Recorder != nil {
		f.opts.Recorder.Eventf(s, nil, typ, reason, action, note, args...)
	}
}
