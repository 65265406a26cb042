package taskhub

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/task/taskwire"
	"github.com/drover-fleet/drover/pkg/ctrlkit"
)

// Reconcile implements reconcile.Reconciler for Tasks: it dispatches a
// Scheduled attempt to its node if the node is connected here, cancels a
// superseded attempt, and stops a deleted task's process. The actions are
// declared in taskhub.ctrlkit and run as Workflow assembles them; the
// reconcile is wired by hand because a Task that is gone is forgotten
// (forget), which the generated Reconcile, done at NotFound, cannot do.
func (d *Dispatcher) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var t batchv1.Task
	if err := d.opts.Client.Get(ctx, req.NamespacedName, &t); err != nil {
		if apierrors.IsNotFound(err) {
			d.forget(req.NamespacedName)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	m := NewTaskDispatcher(NewTaskDispatcherState(d.opts.Client, t.DeepCopy()), &taskRun{d: d, t: &t, key: req.NamespacedName})
	return ctrlkit.Reconcile(ctx, ctrlkit.Optimize(Workflow(m, &t)))
}

// Workflow is the dispatcher's workflow for t. A deleted task is cleaned
// up (its attempt stopped, then its finalizer released). Otherwise, in
// sequence: the finalizer of an attempt that ended is released (its write
// raced the attempt's end and landed first); the hub must be attached and
// its cache synced, else the task comes back in a second; a superseded
// attempt is cancelled at its node; the current one is sent. Sequential,
// because each step stops the next: a failed release is retried before
// anything is sent, and a task that waits for the hub sends nothing.
func Workflow(m *TaskDispatcher, t *batchv1.Task) ctrlkit.Action {
	return ctrlkit.IfElse(t.DeletionTimestamp != nil,
		m.Cleanup(),
		ctrlkit.Sequential(
			ctrlkit.If(t.Status.State.Final() && controllerutil.ContainsFinalizer(t, FinalizerCleanup), m.ReleaseEnded()),
			m.AwaitHub(),
			m.CancelSuperseded(),
			m.Dispatch(),
		),
	)
}

// taskRun implements TaskDispatcherImpl for one reconcile of t; the
// actions share what they found.
type taskRun struct {
	d   *Dispatcher
	t   *batchv1.Task
	key types.NamespacedName

	h    hub.Link // AwaitHub
	work string   // CancelSuperseded: the current attempt's work id
	prev sent     // CancelSuperseded: what was sent before, if had
	had  bool
}

var _ TaskDispatcherImpl = (*taskRun)(nil)

// Cleanup implements TaskDispatcherImpl.
func (r *taskRun) Cleanup(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	return r.d.cleanup(ctx, r.t)
}

// ReleaseEnded implements TaskDispatcherImpl.
func (r *taskRun) ReleaseEnded(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	// An ended task must not hold its deletion or show a cleanup it does
	// not need.
	_, err := r.d.release(ctx, r.t, "the attempt had ended")
	return ctrlkit.RequeueIfError(err)
}

// AwaitHub implements TaskDispatcherImpl.
func (r *taskRun) AwaitHub(context.Context, logr.Logger) (reconcile.Result, error) {
	r.h = r.d.getHub()
	if r.h == nil || !r.d.synced.Load() {
		return ctrlkit.RequeueAfter(time.Second)
	}
	return ctrlkit.NoRequeue()
}

// CancelSuperseded implements TaskDispatcherImpl.
func (r *taskRun) CancelSuperseded(context.Context, logr.Logger) (reconcile.Result, error) {
	d, t, h := r.d, r.t, r.h
	if t.Status.Attempt >= 1 {
		r.work = taskwire.WorkID(string(t.UID), t.Status.Attempt)
	}
	d.mu.Lock()
	r.prev, r.had = d.sent[t.UID]
	d.mu.Unlock()
	prev, had, work := r.prev, r.had, r.work
	if had && prev.work != work && h.Connected(prev.node) {
		// The manager moved on (a restart, a reschedule): the old attempt
		// leaves the node's list, and the node stops it now, not on its
		// next snapshot.
		if err := h.Cancel(prev.node, prev.work); err == nil {
			d.m.cancels.Inc()
			d.log.Info("cancelled a superseded attempt", "task", r.key, "node", prev.node, "work", prev.work)
		}
		d.mu.Lock()
		delete(d.sent, t.UID)
		d.mu.Unlock()
	}
	if t.Status.State.Final() && had && prev.work == work {
		d.mu.Lock()
		delete(d.sent, t.UID)
		delete(d.ended, t.UID)
		d.mu.Unlock()
	}
	return ctrlkit.NoRequeue()
}

// Dispatch implements TaskDispatcherImpl.
func (r *taskRun) Dispatch(context.Context, logr.Logger) (reconcile.Result, error) {
	d, t, h := r.d, r.t, r.h
	if t.Status.State != batchv1.TaskScheduled || !active(t) || !h.Connected(t.Status.NodeName) {
		return ctrlkit.NoRequeue()
	}
	if r.had && r.prev.work == r.work {
		return ctrlkit.NoRequeue() // sent; its Dispatching write is queued
	}
	if err := canRun(h, t.Status.NodeName); err != nil {
		d.cannotSend(t, err)
		return ctrlkit.NoRequeue()
	}
	it, err := Item(t)
	if err != nil {
		d.cannotSend(t, err)
		return ctrlkit.NoRequeue()
	}
	// Sent first, the finalizer after (the task's writer adds it
	// FlushInterval later if the attempt still runs): a round trip to the
	// apiserver less between Scheduled and the process starting, and none
	// at all for a short task. A Task deleted before its
	// finalizer lands is cancelled by forget, and in any case the node's
	// next snapshot no longer holds it.
	if err := h.Dispatch(t.Status.NodeName, it); err != nil {
		// The stream just closed: the node's next snapshot carries it.
		d.log.Warn("dispatch failed; the node's next connect carries it", "task", r.key, "node", t.Status.NodeName, "err", err)
		return ctrlkit.NoRequeue()
	}
	d.m.dispatched.Inc()
	d.recordSent(t, t.Status.NodeName, it.GetUid())
	d.enqueue(t.UID, t.Status.NodeName, t.Status.Attempt, d.markDispatched)
	return ctrlkit.NoRequeue()
}

// cannotSend fails the current attempt of a task whose work item cannot
// be built or must not go to its node's agent. The Failed write records a
// Warning Event (failedEvent).
func (d *Dispatcher) cannotSend(t *batchv1.Task, err error) {
	reason := taskwire.ReasonStartError
	switch {
	case errors.Is(err, ErrSpecTooLarge):
		reason = ReasonSpecTooLarge
	case errors.Is(err, ErrAgentTooOld):
		reason = ReasonAgentTooOld
	}
	d.log.Error("task cannot be sent", "task", client.ObjectKeyFromObject(t), "node", t.Status.NodeName, "reason", reason, "err", err)
	d.enqueue(t.UID, t.Status.NodeName, t.Status.Attempt, func(p *pending) {
		p.reports = append(p.reports, report{phase: taskwire.PhaseFailed, reason: reason, r: taskwire.Report{Message: err.Error()}, full: true})
	})
}

// forget drops what is known of a task that is gone.
func (d *Dispatcher) forget(key types.NamespacedName) {
	var stop []sent
	d.mu.Lock()
	for uid, s := range d.sent {
		if s.key == key {
			// Gone without our finalizer (deleted between the send and
			// the finalizer's write): stop what it started.
			if w, ok := d.ended[uid]; !ok || w != s.work {
				stop = append(stop, s)
			}
			d.rememberGoneLocked(s.work, s.node)
			delete(d.sent, uid)
			delete(d.cancelled, uid)
			delete(d.ended, uid)
			delete(d.queue, uid)
			delete(d.latest, uid)
		}
	}
	d.mu.Unlock()
	h := d.getHub()
	for _, s := range stop {
		if h != nil && h.Connected(s.node) {
			if err := h.Cancel(s.node, s.work); err == nil {
				d.m.cancels.Inc()
				d.log.Info("cancelled the attempt of a task that is gone", "task", key, "node", s.node, "work", s.work)
			}
		}
	}
}

// cleanup stops a deleted task's attempt and then lets it go.
func (d *Dispatcher) cleanup(ctx context.Context, t *batchv1.Task) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(t, FinalizerCleanup) {
		return reconcile.Result{}, nil
	}
	node := t.Status.NodeName
	work := taskwire.WorkID(string(t.UID), max(t.Status.Attempt, 1))
	h := d.getHub()
	d.mu.Lock()
	cancelledAt, cancelled := d.cancelled[t.UID]
	ended := d.ended[t.UID] == work
	d.mu.Unlock()
	now := d.opts.Clock.Now()
	deadline := t.DeletionTimestamp.Add(d.opts.CleanupTimeout)

	switch {
	case t.Status.State.Final() || node == "" || t.Status.Attempt < 1:
		return d.release(ctx, t, "the attempt had ended")
	case ended:
		return d.release(ctx, t, fmt.Sprintf("node %s confirmed attempt %d stopped", node, t.Status.Attempt))
	case h != nil && h.Connected(node):
		if !cancelled {
			if err := h.Cancel(node, work); err != nil {
				d.log.Warn("cancel failed; retrying", "task", client.ObjectKeyFromObject(t), "node", node, "err", err)
				return reconcile.Result{RequeueAfter: time.Second}, nil
			}
			d.m.cancels.Inc()
			d.mu.Lock()
			d.cancelled[t.UID] = now
			if _, ok := d.sent[t.UID]; !ok {
				d.sent[t.UID] = sent{key: client.ObjectKeyFromObject(t), node: node, work: work}
			}
			d.mu.Unlock()
			cancelledAt = now
			d.event(t, corev1.EventTypeNormal, batchv1.ReasonCancelled, "Cancel", "task deleted: asked node %s to stop attempt %d", node, t.Status.Attempt)
		}
	default:
		var fn fleetv1.FleetNode
		err := d.opts.APIReader.Get(ctx, client.ObjectKey{Name: node}, &fn)
		switch {
		case apierrors.IsNotFound(err):
			return d.release(ctx, t, fmt.Sprintf("node %s no longer exists", node))
		case err != nil:
			return reconcile.Result{}, err
		case fn.Status.Phase != fleetv1.FleetNodeOnline || fn.Status.Hub == "" || (h != nil && fn.Status.Hub == h.HubName()):
			// Its agent cancels the attempt when its next snapshot (on
			// reconnect, to whichever hub) leaves it out. (Online on this
			// hub without a stream: it left, and is not Offline yet.)
			return d.release(ctx, t, fmt.Sprintf("node %s is not connected to any hub (its FleetNode is %s); it stops the attempt when it reconnects", node, fn.Status.Phase))
		}
		// Another hub serves the node and cancels it; wait for it, up to
		// the timeout.
	}
	if !now.Before(deadline) {
		d.event(t, corev1.EventTypeWarning, ReasonCleanup, "Cleanup", "node %s did not confirm attempt %d stopped within %s (cancel sent %s); letting the task go",
			node, t.Status.Attempt, d.opts.CleanupTimeout, sinceOr(cancelledAt, now))
		return d.release(ctx, t, "cleanup timed out")
	}
	wait := min(deadline.Sub(now), 5*time.Second)
	return reconcile.Result{RequeueAfter: wait}, nil
}

func sinceOr(t, now time.Time) string {
	if t.IsZero() {
		return "by another hub"
	}
	return now.Sub(t).Round(time.Second).String() + " ago"
}

// release removes the finalizer.
func (d *Dispatcher) release(ctx context.Context, t *batchv1.Task, why string) (reconcile.Result, error) {
	patch := client.MergeFromWithOptions(t.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(t, FinalizerCleanup)
	if err := d.opts.Client.Patch(ctx, t, patch); err != nil {
		if apierrors.IsConflict(err) {
			d.m.conflicts.Inc()
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	d.log.Info("task finalizer released", "task", client.ObjectKeyFromObject(t), "why", why)
	d.event(t, corev1.EventTypeNormal, ReasonCleanedUp, "Cleanup", "%s", why)
	d.forget(client.ObjectKeyFromObject(t))
	return reconcile.Result{}, nil
}

func (d *Dispatcher) event(t *batchv1.Task, typ, reason, action, note string, args ...any) {
	if d.opts.Recorder != nil {
		d.opts.Recorder.Eventf(t, nil, typ, reason, action, note, args...)
	}
}
