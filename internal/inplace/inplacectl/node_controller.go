package inplacectl

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
	"github.com/drover-fleet/drover/internal/inplace"
	"github.com/drover-fleet/drover/pkg/ctrlkit"
)

// NodeWorkers is how many nodes the FleetNode update controller works on
// at once.
const NodeWorkers = 8

// taskPoll is how often a node in update looks at its tasks when no watch
// on their kind could be started (the watch is the usual path).
const taskPoll = 30 * time.Second

// NodeReconciler runs the in-place update of FleetNodes: updater tasks one
// after another, aggregated into the node's updateStatus.
type NodeReconciler struct {
	Options

	// watches guards watched: the task kinds a watch was started for.
	watches sync.Mutex
	watched map[schema.GroupVersionKind]bool
	ctrl    controller.Controller
	cache   cache.Cache

	// writes guards lastWrite: per node, the update status this
	// controller last wrote (plan, attempt, status, reason, message).
	writes    sync.Mutex
	lastWrite map[string]string
}

// +kubebuilder:rbac:groups=fleet.drover.io,resources=fleetnodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=fleet.drover.io,resources=fleetnodes/status,verbs=patch
// +kubebuilder:rbac:groups=update.drover.io,resources=inplaceupdateplans;nodepools,verbs=get;list;watch
// +kubebuilder:rbac:groups=batch.drover.io,resources=tasks,verbs=get;list;watch

// SetupWithManager registers the controller. Task kinds are watched as
// plans name them (updaters are not known in advance).
func (r *NodeReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	r.cache = mgr.GetCache()
	r.watched = map[schema.GroupVersionKind]bool{}
	// Nodes update independently: several at once, so that a pool's
	// batch is not written out one node after another.
	c, err := ctrl.NewControllerManagedBy(mgr).Named("fleetnode-inplace").
		For(&fleetv1.FleetNode{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: NodeWorkers}).
		Build(r.generated())
	if err != nil {
		return err
	}
	r.ctrl = c
	return nil
}

// Reconcile implements reconcile.Reconciler.
func (r *NodeReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	return r.generated().Reconcile(ctx, req)
}

// watchTasks starts a watch on a task kind once: a task's change wakes its node.
func (r *NodeReconciler) watchTasks(gvk schema.GroupVersionKind) error {
	if r.ctrl == nil {
		return nil
	}
	r.watches.Lock()
	defer r.watches.Unlock()
	if r.watched[gvk] {
		return nil
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	h := handler.TypedEnqueueRequestsFromMapFunc(func(_ context.Context, o *unstructured.Unstructured) []reconcile.Request {
		if n := o.GetLabels()[updatev1.LabelNode]; n != "" {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: n}}}
		}
		return nil
	})
	if err := r.ctrl.Watch(source.Kind(r.cache, u, h)); err != nil {
		return fmt.Errorf("watch updater tasks of kind %s: %w", gvk, err)
	}
	r.watched[gvk] = true
	return nil
}

func (r *NodeReconciler) generated() *NodeUpdateManagerReconciler {
	return &NodeUpdateManagerReconciler{
		Client: r.Client,
		NewImpl: func(c client.Client, n *fleetv1.FleetNode) NodeUpdateManagerImpl {
			return &nodeImpl{Options: r.Options, r: r, node: n}
		},
		Workflow: func(m *NodeUpdateManager, n *fleetv1.FleetNode) ctrlkit.Action {
			if n.Spec.UpdatePhase == "" {
				r.forget(n.Name)
			}
			return ctrlkit.Sequential(ctrlkit.ExitIf(n.Spec.UpdatePhase == ""), m.Decide(), m.SyncTasks(), m.UpdateStatus())
		},
		Observer: r.Observer,
	}
}

type nodeImpl struct {
	Options
	r        *NodeReconciler
	node     *fleetv1.FleetNode
	plan     *updatev1.InPlaceUpdatePlan
	updaters map[string]updatev1.Updater
	decision inplace.NodeDecision
}

var _ NodeUpdateManagerImpl = (*nodeImpl)(nil)

// TaskGVK is the kind of the tasks made from a template: the template's
// kind without its "Template" suffix (Cluster API's template convention).
func TaskGVK(ref updatev1.ObjectRef) schema.GroupVersionKind {
	gv, _ := schema.ParseGroupVersion(ref.APIVersion)
	return gv.WithKind(strings.TrimSuffix(ref.Kind, "Template"))
}

// TaskName is the name of node's task of updater in attempt of plan.
func TaskName(node, updater, plan, attempt string) string {
	base := strings.ToLower(node + "-" + updater)
	base = strings.Map(func(c rune) rune {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.' {
			return c
		}
		return '-'
	}, base)
	if len(base) > 200 {
		base = base[:200]
	}
	sum := sha256.Sum256([]byte(plan + "/" + attempt))
	return base + "-" + hex.EncodeToString(sum[:])[:8]
}

func (i *nodeImpl) task(u updatev1.Updater) (*unstructured.Unstructured, types.NamespacedName) {
	t := &unstructured.Unstructured{}
	t.SetGroupVersionKind(TaskGVK(u.UpdaterUpdateTemplateRef))
	key := types.NamespacedName{Namespace: u.UpdaterUpdateTemplateRef.Namespace,
		Name: TaskName(i.node.Name, u.Name, i.plan.Name, i.node.Annotations[AnnotationAttempt])}
	return t, key
}

// Decide implements NodeUpdateManagerImpl.
func (i *nodeImpl) Decide(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	in := inplace.NodeInput{Phase: updatev1.UpdatePhase(i.node.Spec.UpdatePhase), Tasks: map[string]inplace.TaskView{}, Now: i.now(), AbortTimeout: i.AbortTimeout}
	var plan updatev1.InPlaceUpdatePlan
	err := i.Client.Get(ctx, types.NamespacedName{Name: i.node.Labels[updatev1.LabelUpdateTaskName]}, &plan)
	switch {
	case apierrors.IsNotFound(err):
		// The plan is gone: nothing of it may run on; end aborted.
		in.Phase = updatev1.PhaseAborting
		plan.Name = i.node.Labels[updatev1.LabelUpdateTaskName]
	case err != nil:
		return ctrlkit.RequeueIfErrorAndWrap("get plan", err)
	}
	i.plan = &plan
	i.updaters = map[string]updatev1.Updater{}
	in.Updaters = plan.Spec.Updaters
	for _, u := range plan.Spec.Updaters {
		i.updaters[u.Name] = u
		if err := i.r.watchTasks(TaskGVK(u.UpdaterUpdateTemplateRef)); err != nil {
			log := logr.FromContextOrDiscard(ctx)
			log.Error(err, "polling instead", "updater", u.Name)
		}
		t, key := i.task(u)
		if err := i.Client.Get(ctx, key, t); err != nil {
			if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
				continue
			}
			return ctrlkit.RequeueIfErrorAndWrap("get task of updater "+u.Name, err)
		}
		in.Tasks[u.Name] = taskView(t)
	}
	if c := meta.FindStatusCondition(i.node.Status.Conditions, updatev1.InPlaceUpdateCondition); c != nil && c.Reason == updatev1.ReasonAborting {
		in.AbortingSince = c.LastTransitionTime.Time
	}
	if in.Phase == updatev1.PhaseUpdating && len(in.Tasks) == 0 {
		d, err := i.drainView(ctx)
		if err != nil {
			return ctrlkit.RequeueIfErrorAndWrap("drain", err)
		}
		in.Drain = d
	}
	i.decision = inplace.StepNode(in)
	return ctrlkit.NoRequeue()
}

// drainView is what the node waits for before its first updater task, by
// its pool's drain policy: the Tasks whose current attempt runs on it,
// except those of perNode groups (they run on every node and would never
// leave). nil when the pool does not drain.
func (i *nodeImpl) drainView(ctx context.Context) (*inplace.DrainView, error) {
	d := &inplace.DrainView{Timeout: inplace.DefaultDrainTimeout}
	var pool updatev1.NodePool
	if name := i.node.Labels[updatev1.LabelPool]; name != "" {
		if err := i.Client.Get(ctx, types.NamespacedName{Name: name}, &pool); client.IgnoreNotFound(err) != nil {
			return nil, fmt.Errorf("get pool %s: %w", name, err)
		}
	}
	if p := pool.Spec.Drain; p != nil {
		if p.Policy == updatev1.DrainNone {
			return nil, nil
		}
		if p.Timeout != nil {
			d.Timeout = p.Timeout.Duration
		}
	}
	if i.node.Status.UpdateStartTime != nil {
		d.Since = i.node.Status.UpdateStartTime.Time
	}
	var tasks batchv1.TaskList
	if err := i.Client.List(ctx, &tasks); err != nil {
		return nil, fmt.Errorf("list tasks (the manager needs to list Tasks in every namespace): %w", err)
	}
	for _, t := range tasks.Items {
		if t.Status.NodeName == i.node.Name && !t.Status.State.Final() && t.DeletionTimestamp == nil && t.Labels[batchv1.LabelNode] == "" {
			d.Running = append(d.Running, t.Namespace+"/"+t.Name)
		}
	}
	slices.Sort(d.Running)
	return d, nil
}

// taskView reads the contract's fields of a task: spec.updatePhase,
// status.updateStatus and the reason of its conditions.
func taskView(t *unstructured.Unstructured) inplace.TaskView {
	phase, _, _ := unstructured.NestedString(t.Object, "spec", "updatePhase")
	st, _, _ := unstructured.NestedString(t.Object, "status", "updateStatus")
	v := inplace.TaskView{UpdatePhase: updatev1.UpdatePhase(phase), UpdateStatus: updatev1.UpdateStatus(st)}
	conds, _, _ := unstructured.NestedSlice(t.Object, "status", "conditions")
	for _, c := range conds {
		m, ok := c.(map[string]any)
		if !ok {
			continue
		}
		reason, _ := m["reason"].(string)
		msg, _ := m["message"].(string)
		status, _ := m["status"].(string)
		// The condition that says why: a False one wins over the first.
		if v.Reason == "" || status == "False" {
			v.Reason, v.Message = reason, msg
		}
	}
	return v
}

// SyncTasks implements NodeUpdateManagerImpl.
func (i *nodeImpl) SyncTasks(ctx context.Context, logger logr.Logger) (reconcile.Result, error) {
	d := i.decision
	if d.Create != "" {
		u := i.updaters[d.Create]
		if err := i.createTask(ctx, u); err != nil {
			if reason := "TemplateNotFound"; apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
				// Nothing retrying can fix until the template exists: fail the
				// node as an updater failure would, saying why.
				i.decision = inplace.NodeDecision{Status: updatev1.StatusFailed, Reason: updatev1.ReasonUpdaterFailed, FailedUpdater: u.Name,
					Message: fmt.Sprintf("updater %s failed: %s: %v", u.Name, reason, err)}
				return ctrlkit.NoRequeue()
			}
			return ctrlkit.RequeueIfErrorAndWrap("create task of updater "+u.Name, err)
		}
		logger.Info("updater task created", "updater", u.Name)
	}
	for _, name := range d.Abort {
		t, key := i.task(i.updaters[name])
		t.SetNamespace(key.Namespace)
		t.SetName(key.Name)
		p := []byte(`{"spec":{"updatePhase":"aborting"}}`)
		if err := i.Client.Patch(ctx, t, client.RawPatch(types.MergePatchType, p)); client.IgnoreNotFound(err) != nil {
			return ctrlkit.RequeueIfErrorAndWrap("abort task of updater "+name, err)
		}
	}
	return ctrlkit.NoRequeue()
}

// createTask makes updater u's task from its template: the template's
// spec.template.spec, the contract's labels, the node as owner.
func (i *nodeImpl) createTask(ctx context.Context, u updatev1.Updater) error {
	spec, err := templateSpec(ctx, i.Client, u.UpdaterUpdateTemplateRef)
	if err != nil {
		return err
	}
	spec["updatePhase"] = string(updatev1.PhaseUpdating)
	var resp []any
	for _, r := range u.Responsibilities {
		resp = append(resp, map[string]any{"path": r.Path, "selectResource": string(r.SelectResource), "value": r.Value})
	}
	if len(resp) > 0 {
		spec["responsibilities"] = resp
	}
	t, key := i.task(u)
	t.SetNamespace(key.Namespace)
	t.SetName(key.Name)
	t.SetLabels(map[string]string{
		updatev1.LabelUpdateTaskName: i.plan.Name,
		updatev1.LabelPool:           i.node.Labels[updatev1.LabelPool],
		updatev1.LabelNode:           i.node.Name,
		updatev1.LabelUpdater:        u.Name,
		LabelAttempt:                 i.node.Annotations[AnnotationAttempt],
	})
	t.SetOwnerReferences([]metav1.OwnerReference{*metav1.NewControllerRef(i.node, fleetv1.GroupVersion.WithKind("FleetNode"))})
	if err := unstructured.SetNestedMap(t.Object, spec, "spec"); err != nil {
		return fmt.Errorf("task spec: %w", err)
	}
	if err := i.Client.Create(ctx, t); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// UpdateStatus implements NodeUpdateManagerImpl.
func (i *nodeImpl) UpdateStatus(ctx context.Context, logger logr.Logger) (reconcile.Result, error) {
	d := i.decision
	n := i.node
	prev := updatev1.UpdateStatus(n.Status.UpdateStatus)
	key := strings.Join([]string{n.Labels[updatev1.LabelUpdateTaskName], n.Annotations[AnnotationAttempt], string(d.Status), d.Reason, d.Message}, "\x00")
	if i.r.wroteLast(n.Name, key) {
		// This reconcile saw the node from a cache that has not caught up
		// with our own last write: writing again would conflict, or
		// repeat the write and its Event.
		return i.requeue(d)
	}

	// Metadata first: once the status says updated, the pool must already
	// see the node at its new revision.
	before := n.DeepCopy()
	if d.Status == updatev1.StatusUpdated && n.Annotations[AnnotationTargetRevision] != "" {
		n.Labels[updatev1.LabelPoolRevision] = n.Annotations[AnnotationTargetRevision]
	}
	if d.Status == updatev1.StatusUpdated && n.Annotations[AnnotationCordonedBy] == n.Labels[updatev1.LabelUpdateTaskName] && n.Spec.Unschedulable {
		// Undo the plan's own cordon in the same write (an operator's
		// cordon carries no annotation and stays).
		n.Spec.Unschedulable = false
		delete(n.Annotations, AnnotationCordonedBy)
	}
	if d.Status == updatev1.StatusFailed {
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[annotationFailedUpdater] = d.FailedUpdater
	}
	if !maps.Equal(before.Labels, n.Labels) || !maps.Equal(before.Annotations, n.Annotations) || before.Spec.Unschedulable != n.Spec.Unschedulable {
		if err := i.Client.Patch(ctx, n, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			return requeueOnConflict(err)
		}
	}

	before = n.DeepCopy()
	n.Status.UpdateStatus = string(d.Status)
	n.Status.UpdateAttempt = updateAttempt(n)
	newPick := before.Status.UpdateAttempt != n.Status.UpdateAttempt
	if d.Status == updatev1.StatusUpdating && (newPick || prev != updatev1.StatusUpdating && prev != updatev1.StatusAborting) || n.Status.UpdateStartTime == nil {
		t := metav1.NewTime(i.now())
		n.Status.UpdateStartTime = &t
	}
	changed := setCondition(&n.Status.Conditions, updatev1.InPlaceUpdateCondition, boolStatus(d.Status == updatev1.StatusUpdated), d.Reason, d.Message, n.Generation)
	if changed || prev != d.Status || before.Status.UpdateStartTime != n.Status.UpdateStartTime || before.Status.UpdateAttempt != n.Status.UpdateAttempt {
		// The optimistic lock keeps a hub's concurrent Ready from being lost:
		// conditions are one list in a merge patch.
		if err := i.Client.Status().Patch(ctx, n, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			return requeueOnConflict(err)
		}
	}
	i.r.remember(n.Name, key)
	if prev != d.Status {
		logger.Info("node update status", "updateStatus", d.Status, "reason", d.Reason)
		typ := corev1.EventTypeNormal
		if d.Status == updatev1.StatusFailed || d.AbortTimedOut {
			typ = corev1.EventTypeWarning
		}
		if d.Status != updatev1.StatusUpdating {
			// The pool records the start of a batch; the node its end.
			i.event(n, typ, d.Reason, d.Message)
		}
		if d.Status.Done() {
			var took time.Duration
			if n.Status.UpdateStartTime != nil {
				took = i.now().Sub(n.Status.UpdateStartTime.Time)
			}
			i.Metrics.nodeEnded(d.Status, took)
		}
	}
	return i.requeue(d)
}

func (i *nodeImpl) requeue(d inplace.NodeDecision) (reconcile.Result, error) {
	if d.Status.Done() {
		return ctrlkit.NoRequeue()
	}
	after := taskPoll
	if d.RequeueAfter > 0 && d.RequeueAfter < after {
		after = d.RequeueAfter
	}
	return ctrlkit.RequeueAfter(after)
}

// wroteLast reports whether key is what this controller last wrote to
// node's update status.
func (r *NodeReconciler) wroteLast(node, key string) bool {
	r.writes.Lock()
	defer r.writes.Unlock()
	return r.lastWrite[node] == key
}

func (r *NodeReconciler) remember(node, key string) {
	r.writes.Lock()
	defer r.writes.Unlock()
	if r.lastWrite == nil {
		r.lastWrite = map[string]string{}
	}
	r.lastWrite[node] = key
}

// forget drops what was remembered of a node no longer in an update.
func (r *NodeReconciler) forget(node string) {
	r.writes.Lock()
	defer r.writes.Unlock()
	delete(r.lastWrite, node)
}
