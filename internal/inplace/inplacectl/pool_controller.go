package inplacectl

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
	"github.com/drover-fleet/drover/internal/inplace"
	"github.com/drover-fleet/drover/pkg/ctrlkit"
)

// PoolReconciler reconciles NodePools.
type PoolReconciler struct {
	Options
	throttle progressThrottle
}

// +kubebuilder:rbac:groups=update.drover.io,resources=nodepools;inplaceupdateplans,verbs=get;list;watch
// +kubebuilder:rbac:groups=update.drover.io,resources=nodepools/status,verbs=patch
// +kubebuilder:rbac:groups=fleet.drover.io,resources=fleetnodes,verbs=get;list;watch;patch

// SetupWithManager registers the controller: a pool is reconciled when it
// or a node it selects changes.
func (r *PoolReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	toPools := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		var l updatev1.NodePoolList
		if err := r.Client.List(ctx, &l); err != nil {
			return nil
		}
		var out []reconcile.Request
		for _, p := range l.Items {
			sel, err := metav1.LabelSelectorAsSelector(&p.Spec.Selector)
			if err == nil && (sel.Matches(labels.Set(o.GetLabels())) || o.GetLabels()[updatev1.LabelPool] == p.Name) {
				out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: p.Name}})
			}
		}
		return out
	})
	return ctrl.NewControllerManagedBy(mgr).Named("nodepool").
		For(&updatev1.NodePool{}).
		Watches(&fleetv1.FleetNode{}, toPools).
		Complete(r.generated())
}

// Reconcile implements reconcile.Reconciler.
func (r *PoolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	return r.generated().Reconcile(ctx, req)
}

func (r *PoolReconciler) generated() *PoolManagerReconciler {
	return &PoolManagerReconciler{
		Client: r.Client,
		NewImpl: func(c client.Client, p *updatev1.NodePool) PoolManagerImpl {
			return &poolImpl{Options: r.Options, pool: p, throttle: &r.throttle}
		},
		Workflow: func(m *PoolManager, _ *updatev1.NodePool) ctrlkit.Action {
			return ctrlkit.Sequential(m.Decide(), m.SyncNodes(), m.UpdateStatus())
		},
		Observer: r.Observer,
	}
}

type poolImpl struct {
	Options
	throttle *progressThrottle
	pool     *updatev1.NodePool
	nodes    map[string]*fleetv1.FleetNode
	revision string
	overlap  string
	decision inplace.PoolDecision
}

var _ PoolManagerImpl = (*poolImpl)(nil)

// Decide implements PoolManagerImpl.
func (i *poolImpl) Decide(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	sel, err := metav1.LabelSelectorAsSelector(&i.pool.Spec.Selector)
	if err != nil {
		return ctrlkit.RequeueIfErrorAndWrap("pool "+i.pool.Name+" selector", reconcile.TerminalError(err))
	}
	var all fleetv1.FleetNodeList
	if err := i.Client.List(ctx, &all); err != nil {
		return ctrlkit.RequeueIfErrorAndWrap("list nodes", err)
	}
	var pools updatev1.NodePoolList
	if err := i.Client.List(ctx, &pools); err != nil {
		return ctrlkit.RequeueIfErrorAndWrap("list pools", err)
	}
	members := map[string][]string{}
	for _, p := range pools.Items {
		s, err := metav1.LabelSelectorAsSelector(&p.Spec.Selector)
		if err != nil {
			continue
		}
		for _, n := range all.Items {
			if s.Matches(labels.Set(n.Labels)) {
				members[p.Name] = append(members[p.Name], n.Name)
			}
		}
	}
	for _, o := range inplace.FindOverlaps(members) {
		if o.PoolA == i.pool.Name || o.PoolB == i.pool.Name {
			i.overlap = o.Error()
			break
		}
	}
	i.revision = inplace.Revision(i.pool.Spec.Template)
	plan := i.pool.Labels[updatev1.LabelUpdateTaskName]
	now := i.now()
	in := inplace.PoolInput{Plan: plan, Phase: i.pool.Spec.UpdatePhase, Strategy: i.pool.Spec.Strategy, Budget: -1,
		Rollout: i.pool.Spec.Rollout, Now: now}
	if len(i.pool.Spec.MaintenanceWindows) > 0 {
		w := inplace.Windows(i.pool.Spec.MaintenanceWindows, now)
		in.Window = &w
	}
	i.nodes = map[string]*fleetv1.FleetNode{}
	for idx := range all.Items {
		n := &all.Items[idx]
		if !sel.Matches(labels.Set(n.Labels)) {
			continue
		}
		i.nodes[n.Name] = n
		in.Nodes = append(in.Nodes, nodeView(n, i.revision))
	}
	if plan != "" && in.Phase == updatev1.PhaseUpdating {
		var p updatev1.InPlaceUpdatePlan
		if err := i.Client.Get(ctx, types.NamespacedName{Name: plan}, &p); err == nil && p.Spec.MaxInFlight > 0 {
			busy := 0
			for _, n := range all.Items {
				if n.Labels[updatev1.LabelUpdateTaskName] == plan && n.Spec.UpdatePhase != "" && !updatev1.UpdateStatus(n.Status.UpdateStatus).Done() {
					busy++
				}
			}
			in.Budget = max(0, int(p.Spec.MaxInFlight)-busy)
		}
	}
	i.decision = inplace.StepPool(in)
	if i.overlap != "" {
		// Refused: no node of an overlapping pool is picked.
		i.decision.Start = nil
		i.decision.Blocked, i.decision.BlockedWhy, i.decision.RequeueAfter = updatev1.ReasonOverlappingPools, i.overlap, inplace.PreflightRequeue
	}
	return ctrlkit.NoRequeue()
}

// nodeView is what the pool rules see of node n.
func nodeView(n *fleetv1.FleetNode, revision string) inplace.NodeView {
	v := inplace.NodeView{
		Name:         n.Name,
		Ready:        meta.IsStatusConditionTrue(n.Status.Conditions, fleetv1.ReadyCondition),
		Unhealthy:    meta.IsStatusConditionFalse(n.Status.Conditions, updatev1.HealthCheckSucceededCondition),
		Plan:         n.Labels[updatev1.LabelUpdateTaskName],
		AtRevision:   n.Labels[updatev1.LabelPoolRevision] == revision,
		UpdatePhase:  updatev1.UpdatePhase(n.Spec.UpdatePhase),
		UpdateStatus: updatev1.UpdateStatus(n.Status.UpdateStatus),
		// Cordoned by an update and still so: an operator who uncordoned
		// it meanwhile decided otherwise.
		CordonedByUpdate: n.Annotations[AnnotationCordonedBy] != "" && n.Spec.Unschedulable,
	}
	if n.Status.UpdateStartTime != nil {
		v.Started = n.Status.UpdateStartTime.Time
	}
	v.StaleStatus = v.UpdatePhase != "" && n.Status.UpdateAttempt != updateAttempt(n)
	if c := meta.FindStatusCondition(n.Status.Conditions, updatev1.InPlaceUpdateCondition); c != nil && v.UpdateStatus == updatev1.StatusFailed {
		v.FailedUpdater, v.FailedReason = n.Annotations[annotationFailedUpdater], c.Message
	}
	if at, err := time.Parse(time.RFC3339, n.Annotations[AnnotationRemediatedAt]); err == nil && n.Status.UpdateStartTime != nil {
		v.Remediated = at.After(n.Status.UpdateStartTime.Time)
	}
	return v
}

// SyncNodes implements PoolManagerImpl.
func (i *poolImpl) SyncNodes(ctx context.Context, logger logr.Logger) (reconcile.Result, error) {
	d := i.decision
	plan := i.pool.Labels[updatev1.LabelUpdateTaskName]
	patch := func(name string, mutate func(n *fleetv1.FleetNode)) error {
		n := i.nodes[name]
		before := n.DeepCopy()
		mutate(n)
		if err := i.Client.Patch(ctx, n, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			return fmt.Errorf("patch node %s: %w", name, err)
		}
		return nil
	}
	for _, name := range d.Start {
		err := patch(name, func(n *fleetv1.FleetNode) {
			if n.Labels == nil {
				n.Labels = map[string]string{}
			}
			if n.Annotations == nil {
				n.Annotations = map[string]string{}
			}
			attempt, _ := strconv.Atoi(n.Annotations[AnnotationAttempt])
			if n.Labels[updatev1.LabelUpdateTaskName] != plan {
				attempt = 0
			}
			n.Labels[updatev1.LabelUpdateTaskName] = plan
			n.Labels[updatev1.LabelPool] = i.pool.Name
			n.Annotations[AnnotationTargetRevision] = i.revision
			n.Annotations[AnnotationAttempt] = strconv.Itoa(attempt + 1)
			delete(n.Annotations, annotationFailedUpdater)
			if !n.Spec.Unschedulable {
				// No new tasks while it updates; an operator's own cordon
				// is left as it is, and stays after the update.
				n.Spec.Unschedulable = true
				n.Annotations[AnnotationCordonedBy] = plan
			}
			n.Spec.UpdatePhase = string(updatev1.PhaseUpdating)
		})
		if err != nil {
			return requeueOnConflict(err)
		}
		logger.Info("node picked for update", "FleetNode", name, "plan", plan, "revision", i.revision)
	}
	if len(d.Start) > 0 {
		// One Event per batch of picks, on the pool: a node's own Events
		// say how its update ended.
		names := d.Start
		more := ""
		if len(names) > 10 {
			names, more = names[:10], fmt.Sprintf(" and %d more", len(d.Start)-10)
		}
		i.event(i.pool, corev1.EventTypeNormal, "UpdateStarted", fmt.Sprintf("plan %s: picked %d node(s): %s%s", plan, len(d.Start), strings.Join(names, ", "), more))
	}
	for _, name := range d.Abort {
		if err := patch(name, func(n *fleetv1.FleetNode) { n.Spec.UpdatePhase = string(updatev1.PhaseAborting) }); err != nil {
			return requeueOnConflict(err)
		}
	}
	for _, name := range d.Uncordon {
		err := patch(name, func(n *fleetv1.FleetNode) {
			n.Spec.Unschedulable = false
			delete(n.Annotations, AnnotationCordonedBy)
		})
		if err != nil {
			return requeueOnConflict(err)
		}
	}
	for _, name := range d.Release {
		err := patch(name, func(n *fleetv1.FleetNode) {
			delete(n.Labels, updatev1.LabelUpdateTaskName)
			n.Spec.UpdatePhase = ""
		})
		if err != nil {
			return requeueOnConflict(err)
		}
	}
	return ctrlkit.NoRequeue()
}

// poolProgressOnly reports whether b differs from a only in node counts
// and in condition messages (which quote them).
func poolProgressOnly(a, b *updatev1.NodePoolStatus) bool {
	if !sameButMessages(a.Conditions, b.Conditions) {
		return false
	}
	x, y := a.DeepCopy(), b.DeepCopy()
	for _, s := range []*updatev1.NodePoolStatus{x, y} {
		s.Nodes, s.UpdatedNodes, s.UpdatingNodes, s.Conditions = 0, 0, 0, nil
	}
	return equality.Semantic.DeepEqual(x, y)
}

func requeueOnConflict(err error) (reconcile.Result, error) {
	if apierrors.IsConflict(err) {
		return ctrlkit.RequeueImmediately()
	}
	return ctrlkit.RequeueIfError(err)
}

// UpdateStatus implements PoolManagerImpl.
func (i *poolImpl) UpdateStatus(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	d := i.decision
	before := i.pool.DeepCopy()
	st := &i.pool.Status
	prevBlocked := meta.FindStatusCondition(st.Conditions, updatev1.PreflightBlockedCondition)
	st.Nodes, st.UpdatedNodes, st.UpdatingNodes = d.Nodes, d.Updated, d.Updating
	st.UpdateRevision = i.revision
	if d.Status != "" {
		st.UpdateStatus = d.Status
	}
	if d.Updated == d.Nodes {
		st.CurrentRevision = i.revision
	}
	gen := i.pool.Generation
	if d.Status != "" {
		setCondition(&st.Conditions, updatev1.InPlaceUpdateCondition, boolStatus(d.Status == updatev1.StatusUpdated), d.Reason, d.Message, gen)
	}
	if d.Blocked != "" {
		setCondition(&st.Conditions, updatev1.PreflightBlockedCondition, "True", d.Blocked, d.BlockedWhy, gen)
	} else {
		setCondition(&st.Conditions, updatev1.PreflightBlockedCondition, "False", updatev1.ReasonPreflightPassed, "", gen)
	}
	st.ObservedGeneration = gen
	if equality.Semantic.DeepEqual(before.Status, *st) {
		return ctrlkit.RequeueAfter(d.RequeueAfter)
	}
	now := i.now()
	if poolProgressOnly(&before.Status, st) {
		if wait := i.throttle.wait(i.pool.Name, now); wait > 0 {
			if d.RequeueAfter > 0 {
				wait = min(wait, d.RequeueAfter)
			}
			return ctrlkit.RequeueAfter(wait)
		}
	} else {
		i.throttle.wrote(i.pool.Name, now)
	}
	if err := i.Client.Status().Patch(ctx, i.pool, client.MergeFrom(before)); err != nil {
		return ctrlkit.RequeueIfErrorAndWrap("patch pool status", client.IgnoreNotFound(err))
	}
	if d.Blocked != "" && (prevBlocked == nil || prevBlocked.Status != "True" || prevBlocked.Reason != d.Blocked) {
		switch d.Blocked {
		case updatev1.ReasonRolloutRate:
			// Expected every minute of a paced rollout: the condition says it.
		case updatev1.ReasonOutsideWindow:
			i.event(i.pool, corev1.EventTypeNormal, updatev1.ReasonOutsideWindow, d.BlockedWhy)
		default:
			i.event(i.pool, corev1.EventTypeWarning, updatev1.PreflightBlockedCondition, d.BlockedWhy)
		}
	}
	if before.Status.UpdateStatus != st.UpdateStatus && st.UpdateStatus != "" {
		i.event(i.pool, corev1.EventTypeNormal, "Pool"+upper(string(st.UpdateStatus)), d.Message)
	}
	return ctrlkit.RequeueAfter(d.RequeueAfter)
}
