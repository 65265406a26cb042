package inplacectl

import (
	"context"
	"fmt"
	"sort"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

// PlanReconciler reconciles InPlaceUpdatePlans.
type PlanReconciler struct {
	Options
	throttle progressThrottle
}

// +kubebuilder:rbac:groups=update.drover.io,resources=inplaceupdateplans;nodepools,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=update.drover.io,resources=inplaceupdateplans/status,verbs=patch

// SetupWithManager registers the controller: a plan is reconciled when it,
// one of its pools or one of its nodes changes.
func (r *PlanReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	byLabel := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		if p := o.GetLabels()[updatev1.LabelUpdateTaskName]; p != "" {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: p}}}
		}
		return nil
	})
	// A pool released by an ended plan wakes the plans waiting for it.
	waiting := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		var l updatev1.InPlaceUpdatePlanList
		if err := r.Client.List(ctx, &l); err != nil {
			return nil
		}
		var out []reconcile.Request
		for _, p := range l.Items {
			if p.Status.UpdateStatus.Done() {
				continue
			}
			for _, pp := range p.Spec.Pools {
				if pp.Name == o.GetName() {
					out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: p.Name}})
				}
			}
		}
		return out
	})
	g := r.generated()
	return ctrl.NewControllerManagedBy(mgr).Named("inplaceupdateplan").
		For(&updatev1.InPlaceUpdatePlan{}).
		Watches(&updatev1.NodePool{}, byLabel).
		Watches(&updatev1.NodePool{}, waiting).
		Watches(&fleetv1.FleetNode{}, byLabel).
		Complete(g)
}

// Reconcile implements reconcile.Reconciler.
func (r *PlanReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	return r.generated().Reconcile(ctx, req)
}

func (r *PlanReconciler) generated() *PlanManagerReconciler {
	return &PlanManagerReconciler{
		Client: r.Client,
		NewImpl: func(c client.Client, p *updatev1.InPlaceUpdatePlan) PlanManagerImpl {
			return &planImpl{Options: r.Options, plan: p, throttle: &r.throttle}
		},
		Workflow: func(m *PlanManager, _ *updatev1.InPlaceUpdatePlan) ctrlkit.Action {
			return ctrlkit.Sequential(m.Decide(), m.SyncPools(), m.UpdateStatus())
		},
		Observer: r.Observer,
	}
}

type planImpl struct {
	Options
	throttle *progressThrottle
	plan     *updatev1.InPlaceUpdatePlan
	pools    map[string]*updatev1.NodePool
	decision inplace.PlanDecision
	// summary and failures: counted in Decide; nil summary = keep the last.
	summary  *updatev1.NodeSummary
	failures []updatev1.NodeFailure
}

var _ PlanManagerImpl = (*planImpl)(nil)

// Decide implements PlanManagerImpl.
func (i *planImpl) Decide(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	// The cache may not show yet that this plan ended and released its
	// pools; deciding on it would start them again.
	var fresh updatev1.InPlaceUpdatePlan
	if err := i.reader().Get(ctx, client.ObjectKeyFromObject(i.plan), &fresh); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrlkit.Exit()
		}
		return ctrlkit.RequeueIfErrorAndWrap("get plan "+i.plan.Name, err)
	}
	*i.plan = fresh
	in := inplace.PlanInput{Name: i.plan.Name, Phase: i.plan.Spec.UpdatePhase, Holders: map[string]bool{}, Newer: true, Done: i.plan.Status.UpdateStatus}
	if in.Phase == "" {
		in.Phase = updatev1.PhaseUpdating
	}
	i.pools = map[string]*updatev1.NodePool{}
	for _, pp := range i.plan.Spec.Pools {
		var pool updatev1.NodePool
		st := inplace.PoolState{Name: pp.Name, Sequence: pp.Sequence}
		if err := i.Client.Get(ctx, types.NamespacedName{Name: pp.Name}, &pool); err != nil {
			if !apierrors.IsNotFound(err) {
				return ctrlkit.RequeueIfErrorAndWrap("get pool "+pp.Name, err)
			}
		} else {
			i.pools[pp.Name] = &pool
			st.Exists = true
			st.Plan = pool.Labels[updatev1.LabelUpdateTaskName]
			st.Phase = pool.Spec.UpdatePhase
			st.UpdateStatus = pool.Status.UpdateStatus
			st.Observed = pool.Status.ObservedGeneration == pool.Generation
			for _, c := range pool.Status.Conditions {
				if c.Type == updatev1.InPlaceUpdateCondition {
					st.Reason, st.Message = c.Reason, c.Message
				}
			}
		}
		in.Pools = append(in.Pools, st)
		if st.Plan != "" && st.Plan != i.plan.Name {
			if _, seen := in.Holders[st.Plan]; seen {
				continue
			}
			var other updatev1.InPlaceUpdatePlan
			err := i.Client.Get(ctx, types.NamespacedName{Name: st.Plan}, &other)
			switch {
			case apierrors.IsNotFound(err):
				in.Holders[st.Plan] = true
			case err != nil:
				return ctrlkit.RequeueIfErrorAndWrap("get plan "+st.Plan, err)
			default:
				in.Holders[st.Plan] = other.Status.UpdateStatus.Done()
				if !i.plan.CreationTimestamp.After(other.CreationTimestamp.Time) {
					in.Newer = false
				}
			}
		}
	}
	i.decision = inplace.StepPlan(in)
	if err := inplace.CheckUpdaters(i.plan.Spec.Updaters); err != nil && !in.Done.Done() {
		i.decision = inplace.PlanDecision{Status: updatev1.StatusFailed, Failure: err.Error()}
	}
	// Summarize before SyncPools releases the pools (and they their nodes):
	// the summary of the reconcile that ends the plan is its last.
	if !in.Done.Done() {
		if err := i.summarize(ctx, i.decision.Status.Done()); err != nil {
			return ctrlkit.RequeueIfErrorAndWrap("summarize nodes", err)
		}
	}
	return ctrlkit.NoRequeue()
}

// SyncPools implements PlanManagerImpl.
func (i *planImpl) SyncPools(ctx context.Context, logger logr.Logger) (reconcile.Result, error) {
	d := i.decision
	for _, name := range d.AbortPlans {
		var other updatev1.InPlaceUpdatePlan
		if err := i.Client.Get(ctx, types.NamespacedName{Name: name}, &other); err != nil {
			return ctrlkit.RequeueIfErrorAndWrap("get plan "+name, client.IgnoreNotFound(err))
		}
		if other.Spec.UpdatePhase == updatev1.PhaseAborting {
			continue
		}
		before := other.DeepCopy()
		other.Spec.UpdatePhase = updatev1.PhaseAborting
		if err := i.Client.Patch(ctx, &other, client.MergeFrom(before)); err != nil {
			return ctrlkit.RequeueIfErrorAndWrap("abort plan "+name, err)
		}
		logger.Info("a newer plan aborts the running one", "running", name)
		i.event(&other, corev1.EventTypeNormal, "Superseded", fmt.Sprintf("plan %s changes the same pools: aborting", i.plan.Name))
	}
	touched := map[string]bool{}
	for _, n := range d.Label {
		touched[n] = true
	}
	for n := range d.SetPhase {
		touched[n] = true
	}
	for _, n := range d.Release {
		touched[n] = true
	}
	names := make([]string, 0, len(touched))
	for n := range touched {
		names = append(names, n)
	}
	sort.Strings(names)
	release := map[string]bool{}
	for _, n := range d.Release {
		release[n] = true
	}
	for _, name := range names {
		pool := i.pools[name]
		if pool == nil {
			continue
		}
		before := pool.DeepCopy()
		if release[name] {
			delete(pool.Labels, updatev1.LabelUpdateTaskName)
			pool.Spec.UpdatePhase = ""
		} else {
			if pool.Labels == nil {
				pool.Labels = map[string]string{}
			}
			pool.Labels[updatev1.LabelUpdateTaskName] = i.plan.Name
			if ph, ok := d.SetPhase[name]; ok {
				pool.Spec.UpdatePhase = ph
			}
		}
		// The optimistic lock keeps two plans from taking one pool at once.
		if err := i.Client.Patch(ctx, pool, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			if apierrors.IsConflict(err) {
				return ctrlkit.RequeueImmediately()
			}
			return ctrlkit.RequeueIfErrorAndWrap("patch pool "+name, err)
		}
		if ph, ok := d.SetPhase[name]; ok && !release[name] {
			i.event(i.plan, corev1.EventTypeNormal, "Pool"+upper(string(ph)), fmt.Sprintf("pool %s: %s", name, ph))
		}
	}
	return ctrlkit.NoRequeue()
}

// UpdateStatus implements PlanManagerImpl.
func (i *planImpl) UpdateStatus(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	d := i.decision
	before := i.plan.DeepCopy()
	st := &i.plan.Status
	prev := st.UpdateStatus
	if d.Status != "" {
		st.UpdateStatus = d.Status
	}
	st.CurrentSequence = d.Current
	gen := i.plan.Generation
	if d.Waiting != "" {
		setCondition(&st.Conditions, "Waiting", "True", updatev1.ReasonWaitingForPlan, "plan(s) "+d.Waiting+" run on the same pools; waiting until they end", gen)
	} else {
		setCondition(&st.Conditions, "Waiting", "False", "NotWaiting", "", gen)
	}
	for _, s := range d.Sequences {
		reason := updatev1.ReasonWaitingSequence
		switch s.Status {
		case updatev1.StatusUpdated:
			reason = updatev1.ReasonUpdated
		case updatev1.StatusUpdating:
			reason = updatev1.ReasonUpdating
		case updatev1.StatusFailed:
			reason = updatev1.ReasonUpdaterFailed
		}
		setCondition(&st.Conditions, inplace.SequenceCondition(s.Sequence), boolStatus(s.Status == updatev1.StatusUpdated), reason, s.Message, gen)
	}
	if d.Failure != "" {
		setCondition(&st.Conditions, updatev1.FailedCondition, "True", updatev1.ReasonUpdaterFailed, d.Failure, gen)
	} else if d.Status != "" && !prev.Done() {
		// An ended plan keeps the Failed condition it ended with.
		setCondition(&st.Conditions, updatev1.FailedCondition, "False", "NoFailure", "", gen)
	}
	st.Pools = st.Pools[:0]
	for _, pp := range i.plan.Spec.Pools {
		pu := updatev1.PoolUpdate{Name: pp.Name, Sequence: pp.Sequence}
		if p := i.pools[pp.Name]; p != nil && p.Labels[updatev1.LabelUpdateTaskName] == i.plan.Name {
			pu.UpdateStatus, pu.Nodes, pu.UpdatedNodes = p.Status.UpdateStatus, p.Status.Nodes, p.Status.UpdatedNodes
		} else if p != nil && prev.Done() {
			pu.Nodes, pu.UpdatedNodes = p.Status.Nodes, p.Status.UpdatedNodes
		}
		st.Pools = append(st.Pools, pu)
	}
	if i.summary != nil {
		st.Nodes, st.Failures = *i.summary, i.failures
	}
	st.ObservedGeneration = gen
	if equality.Semantic.DeepEqual(before.Status, *st) {
		return ctrlkit.RequeueAfter(d.RequeueAfter)
	}
	now := i.now()
	if planProgressOnly(&before.Status, st) {
		if wait := i.throttle.wait(i.plan.Name, now); wait > 0 {
			return ctrlkit.RequeueAfter(wait)
		}
	} else {
		i.throttle.wrote(i.plan.Name, now)
	}
	if st.UpdateStatus.Done() {
		i.throttle.done(i.plan.Name)
	}
	if err := i.Client.Status().Patch(ctx, i.plan, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsConflict(err) {
			return ctrlkit.RequeueImmediately()
		}
		return ctrlkit.RequeueIfErrorAndWrap("patch plan status", client.IgnoreNotFound(err))
	}
	if prev != st.UpdateStatus && st.UpdateStatus != "" {
		typ, msg := corev1.EventTypeNormal, fmt.Sprintf("plan %s", st.UpdateStatus)
		if st.UpdateStatus == updatev1.StatusFailed {
			typ, msg = corev1.EventTypeWarning, "plan failed: "+d.Failure
		}
		i.event(i.plan, typ, upper(string(st.UpdateStatus)), msg)
		if st.UpdateStatus.Done() {
			i.Metrics.planEnded(st.UpdateStatus)
		}
	}
	return ctrlkit.RequeueAfter(d.RequeueAfter)
}

// planProgressOnly reports whether b differs from a only in counts and in
// condition messages (which quote them).
func planProgressOnly(a, b *updatev1.InPlaceUpdatePlanStatus) bool {
	if !sameButMessages(a.Conditions, b.Conditions) {
		return false
	}
	x, y := a.DeepCopy(), b.DeepCopy()
	for _, s := range []*updatev1.InPlaceUpdatePlanStatus{x, y} {
		s.Nodes, s.Conditions = updatev1.NodeSummary{}, nil
		for i := range s.Pools {
			s.Pools[i].Nodes, s.Pools[i].UpdatedNodes = 0, 0
		}
	}
	return equality.Semantic.DeepEqual(x, y)
}

// summarize counts the plan's nodes by status and keeps its first failures.
func (i *planImpl) summarize(ctx context.Context, ending bool) error {
	var nodes fleetv1.FleetNodeList
	// The node cache may lag the pools' (informers of two kinds are not
	// ordered): the summary the plan ends with is read around it.
	var r client.Reader = i.Client
	if ending {
		r = i.reader()
	}
	if err := r.List(ctx, &nodes, client.MatchingLabels{updatev1.LabelUpdateTaskName: i.plan.Name}); err != nil {
		return err
	}
	sum := updatev1.NodeSummary{}
	var failures []updatev1.NodeFailure
	for _, n := range nodes.Items {
		sum.Total++
		switch updatev1.UpdateStatus(n.Status.UpdateStatus) {
		case updatev1.StatusUpdating:
			sum.Updating++
		case updatev1.StatusUpdated:
			sum.Updated++
		case updatev1.StatusAborting:
			sum.Aborting++
		case updatev1.StatusAborted:
			sum.Aborted++
		case updatev1.StatusFailed:
			sum.Failed++
			if len(failures) < 16 {
				f := updatev1.NodeFailure{Node: n.Name}
				for _, c := range n.Status.Conditions {
					if c.Type == updatev1.InPlaceUpdateCondition {
						f.Reason, f.Message = c.Reason, c.Message
					}
				}
				f.Updater = n.Annotations[annotationFailedUpdater]
				failures = append(failures, f)
			}
		}
	}
	i.summary, i.failures = &sum, failures
	return nil
}

// annotationFailedUpdater names, on a failed node, the updater that failed.
const annotationFailedUpdater = "update.drover.io/failed-updater"

func upper(s string) string {
	if s == "" {
		return s
	}
	return string(s[0]-'a'+'A') + s[1:]
}
