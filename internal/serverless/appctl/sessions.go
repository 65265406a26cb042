package appctl

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	serverlessv1 "github.com/drover-fleet/drover/api/serverless/v1alpha1"
	"github.com/drover-fleet/drover/internal/kname"
)

// bind writes s's binding: instance, node and finalizer in one update.
func (c *Controller) bind(ctx context.Context, s *serverlessv1.ApplicationSession, p placement, now time.Time) error {
	s = s.DeepCopy()
	s.Spec.InstanceName, s.Spec.NodeName = p.inst.Name, p.node
	controllerutil.AddFinalizer(s, serverlessv1.FinalizerSession)
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[AnnotationBoundTime] = now.UTC().Format(time.RFC3339Nano)
	// The label costs nothing in the same update and lets people select
	// an Application's sessions (kubectl get sess -l …).
	if s.Labels == nil {
		s.Labels = map[string]string{}
	}
	s.Labels[serverlessv1.LabelApplication] = kname.LabelValue(s.Spec.Application)
	if err := c.client.Update(ctx, s); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return nil // it changed or went: the next reconcile decides again
		}
		return fmt.Errorf("bind ApplicationSession %s/%s: %w", s.Namespace, s.Name, err)
	}
	c.notes[client.ObjectKeyFromObject(s)] = sessionNote{uid: s.UID, instance: p.inst.Name, node: p.node, at: now}
	sessionsBound.Inc()
	log.FromContext(ctx).V(1).Info("session bound", "ApplicationSession", client.ObjectKeyFromObject(s), "instance", p.inst.Name, "node", p.node)
	return nil
}

// endSession writes s Terminated with reason (and removes this feature's
// finalizer: no hub will). Errors are logged: the next reconcile tries
// again.
func (c *Controller) endSession(ctx context.Context, s *serverlessv1.ApplicationSession, reason, msg string, now time.Time) {
	sk := client.ObjectKeyFromObject(s)
	if !s.Status.Phase.Final() {
		u := s.DeepCopy()
		t := metav1.NewTime(now)
		u.Status.Phase, u.Status.Reason, u.Status.Message, u.Status.CloseTime = serverlessv1.SessionTerminated, reason, msg, &t
		u.Status.Endpoint = nil
		if err := c.client.Status().Update(ctx, u); err != nil {
			if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				log.FromContext(ctx).Error(err, "end ApplicationSession", "ApplicationSession", sk, "reason", reason)
			}
			return
		}
		s = u
		sessionsEnded.WithLabelValues(reason).Inc()
		c.notes[sk] = sessionNote{uid: s.UID, ended: true, at: now}
		if c.rec != nil {
			c.rec.Eventf(s, nil, corev1.EventTypeWarning, reason, "Close", "%s", msg)
		}
	}
	c.dropFinalizer(ctx, s)
}

func (c *Controller) dropFinalizer(ctx context.Context, s *serverlessv1.ApplicationSession) {
	if !controllerutil.ContainsFinalizer(s, serverlessv1.FinalizerSession) {
		return
	}
	patch := client.MergeFromWithOptions(s.DeepCopy(), client.MergeFromWithOptimisticLock{})
	u := s.DeepCopy()
	controllerutil.RemoveFinalizer(u, serverlessv1.FinalizerSession)
	if err := c.client.Patch(ctx, u, patch); client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
		log.FromContext(ctx).Error(err, "remove the session finalizer", "ApplicationSession", client.ObjectKeyFromObject(s))
	}
}

// closeLost ends the bound sessions no hub can end: their node is lost,
// their instance is gone from its slice, or they were not ready within
// their open timeout (plus grace). It returns when to look again.
func (c *Controller) closeLost(ctx context.Context, v *view, now time.Time) time.Duration {
	var wake time.Duration
	soon := func(d time.Duration) {
		if d > 0 && (wake == 0 || d < wake) {
			wake = d
		}
	}
	live := map[types.UID]bool{}
	for _, s := range v.sessions {
		live[s.UID] = true
		if s.Spec.InstanceName == "" {
			continue
		}
		n := v.nodes[s.Spec.NodeName]
		if s.Status.Phase.Final() {
			// Ended while its node was lost: nobody else removes it.
			if nodeLost(n) {
				c.dropFinalizer(ctx, s)
			}
			continue
		}
		if nodeLost(n) {
			why := "was deleted"
			if n != nil {
				why = "is " + string(n.Status.Phase)
			}
			c.endSession(ctx, s, serverlessv1.ReasonNodeLost, fmt.Sprintf("node %s %s", s.Spec.NodeName, why), now)
			continue
		}
		if !c.instanceKnown(v, s) {
			first, ok := c.goneSince[s.UID]
			if !ok {
				first = now
				c.goneSince[s.UID] = now
			}
			if end := first.Add(c.opts.InstanceGoneGrace); now.Before(end) {
				soon(end.Sub(now))
			} else {
				c.endSession(ctx, s, serverlessv1.ReasonInstanceGone,
					fmt.Sprintf("instance %s is no longer on node %s", s.Spec.InstanceName, s.Spec.NodeName), now)
				continue
			}
		} else {
			delete(c.goneSince, s.UID)
		}
		switch s.Status.Phase {
		case "", serverlessv1.SessionPending, serverlessv1.SessionStarting, serverlessv1.SessionReadinessChecking:
			timeout := 10 * time.Second
			if v.app != nil && v.app.Spec.Session.OpenTimeout.Duration > 0 {
				timeout = v.app.Spec.Session.OpenTimeout.Duration
			}
			if s.Spec.OpenTimeout != nil && s.Spec.OpenTimeout.Duration > 0 {
				timeout = s.Spec.OpenTimeout.Duration
			}
			end := boundTime(s).Add(timeout + c.opts.SessionGrace)
			if now.Before(end) {
				soon(end.Sub(now))
				continue
			}
			c.endSession(ctx, s, serverlessv1.ReasonOpenTimeout,
				fmt.Sprintf("instance %s did not make the session ready within %s", s.Spec.InstanceName, timeout), now)
		}
	}
	for uid := range c.goneSince {
		if !live[uid] {
			delete(c.goneSince, uid)
		}
	}
	return wake
}

// instanceKnown: s's instance is in its slice's spec or status.
func (c *Controller) instanceKnown(v *view, s *serverlessv1.ApplicationSession) bool {
	sl := v.slices[s.Spec.NodeName]
	if sl == nil {
		return false
	}
	for _, in := range sl.Spec.Instances {
		if in.Name == s.Spec.InstanceName {
			return true
		}
	}
	for _, in := range sl.Status.Instances {
		if in.Name == s.Spec.InstanceName && in.State != serverlessv1.InstanceTerminated {
			return true
		}
	}
	return false
}

// boundTime is when s was bound: the hub's status, else the manager's
// annotation, else its creation (Open creates sessions bound).
func boundTime(s *serverlessv1.ApplicationSession) time.Time {
	if s.Status.BoundTime != nil {
		return s.Status.BoundTime.Time
	}
	if t, err := time.Parse(time.RFC3339Nano, s.Annotations[AnnotationBoundTime]); err == nil {
		return t
	}
	return s.CreationTimestamp.Time
}

// closeAll closes the sessions of an Application that is gone: unbound
// ones end ApplicationNotFound, bound ones are deleted (their hub closes
// them on their instance).
func (c *Controller) closeAll(ctx context.Context, v *view, now time.Time) error {
	closed := 0
	for _, s := range v.sessions {
		switch {
		case s.Spec.InstanceName == "" && !s.Status.Phase.Final():
			c.endSession(ctx, s, serverlessv1.ReasonApplicationNotFound,
				fmt.Sprintf("application %s not found in namespace %s", v.key.Name, v.key.Namespace), now)
		case s.Spec.InstanceName != "" && s.DeletionTimestamp == nil:
			if err := c.client.Delete(ctx, s, client.Preconditions{UID: &s.UID}); client.IgnoreNotFound(err) != nil {
				return fmt.Errorf("close ApplicationSession %s/%s of deleted application: %w", s.Namespace, s.Name, err)
			}
			closed++
		}
	}
	if closed > 0 {
		log.FromContext(ctx).Info("closed the sessions of a deleted application", "Application", v.key, "sessions", closed)
	}
	return nil
}
