package taskctl

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"golang.org/x/sync/errgroup"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/kname"
	"github.com/drover-fleet/drover/pkg/ctrlkit"
)

// TaskGroupReconciler keeps count Tasks named <group>-<index> for each
// TaskGroup, or for a perNode group one Task per matching node (see
// pernode.go), and counts their states into its status.
//
// Scaling: raising count creates the missing indices; lowering it deletes
// the tasks at index ≥ count (a running one is cancelled by its hub). A
// task deleted by hand is made again, afresh, once it is gone, until the
// group is Completed or Failed (then it stays as it ended). The
// template applies to tasks created after it changes; existing tasks keep
// their spec. The controller deletes the tasks of a deleted group itself,
// whether or not a garbage collector runs.
type TaskGroupReconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	// APIReader reads a task afresh before deleting it; nil: the cache.
	APIReader client.Reader
	// Clock of activeDeadlineSeconds; nil: the real one.
	Clock clock.Clock
	// CreateRetry is how soon a group whose Tasks the API refused asks
	// again (a changed NodeGrant or namespace brings it back sooner).
	// Default 1m.
	CreateRetry time.Duration
}

// +kubebuilder:rbac:groups=batch.drover.io,resources=taskgroups,verbs=get;list;watch
// +kubebuilder:rbac:groups=batch.drover.io,resources=taskgroups/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=batch.drover.io,resources=tasks,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=fleet.drover.io,resources=nodegrants,verbs=get;list;watch
// +kubebuilder:rbac:groups=fleet.drover.io,resources=fleetnodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch

// SetupWithManager registers the controller. A change of NodeGrants or of
// a namespace's labels brings back the groups whose Tasks were refused, and
// the perNode groups; a FleetNode's too (joined, left, labels changed).
func (r *TaskGroupReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.Clock = clock.Or(r.Clock)
	if r.CreateRetry <= 0 {
		r.CreateRetry = time.Minute
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("taskgroup").
		For(&batchv1.TaskGroup{}).
		Owns(&batchv1.Task{}).
		Watches(&fleetv1.NodeGrant{}, handler.EnqueueRequestsFromMapFunc(r.refusedGroups), onUpdate(grantMatters)).
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(r.refusedGroups), builder.OnlyMetadata, onUpdate(namespaceMatters)).
		Watches(&fleetv1.FleetNode{}, handler.EnqueueRequestsFromMapFunc(r.perNodeGroups), onUpdate(nodeMembershipMatters)).
		Complete(r)
}

// refusedGroups maps a NodeGrant (every namespace) or a Namespace (its
// own) to the groups whose Tasks the API refused, and to the perNode groups
// that are not done: the policy may let them through, or grant them other
// nodes, now.
func (r *TaskGroupReconciler) refusedGroups(ctx context.Context, obj client.Object) []reconcile.Request {
	var opts []client.ListOption
	if _, ok := obj.(*fleetv1.NodeGrant); !ok {
		opts = append(opts, client.InNamespace(obj.GetName()))
	}
	var list batchv1.TaskGroupList
	if err := r.Client.List(ctx, &list, append(opts, client.UnsafeDisableDeepCopy)...); err != nil {
		log.FromContext(ctx).Error(err, "list TaskGroups to retry refused creates")
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		g := &list.Items[i]
		if meta.IsStatusConditionTrue(g.Status.Conditions, ConditionCreateFailed) ||
			g.Spec.PerNode && !settled(g.Status.Phase, g.Status.ObservedGeneration, g.Generation) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return out
}

// Reconcile implements reconcile.Reconciler.
func (r *TaskGroupReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var g batchv1.TaskGroup
	w := &groupRun{r: r, name: req.Name, namespace: req.Namespace}
	if err := r.Client.Get(ctx, req.NamespacedName, &g); err != nil {
		if apierrors.IsNotFound(err) {
			// Hand-wired rather than the generated Reconcile, which is
			// done at NotFound: a group that is gone still has its tasks
			// deleted (whether or not a garbage collector runs).
			g.Name, g.Namespace = req.Name, req.Namespace
			m := NewGroupManager(NewGroupManagerState(r.Client, &g), w)
			return ctrlkit.Reconcile(ctx, ctrlkit.Optimize(GroupWorkflow(m, nil)))
		}
		return ctrl.Result{}, err
	}
	w.group = &g
	// Done: only tasks beyond count (none, unless it shrank) go; a
	// perNode group keeps the tasks it ended with.
	w.keepNodes = g.Spec.PerNode && settled(g.Status.Phase, g.Status.ObservedGeneration, g.Generation)
	m := NewGroupManager(NewGroupManagerState(r.Client, &g), w)
	return ctrlkit.Reconcile(ctx, ctrlkit.Optimize(GroupWorkflow(m, &g)))
}

// GroupWorkflow is the TaskGroup controller's workflow (actions in
// taskgroup.ctrlkit). A group that is gone (g nil), or done, only has the
// tasks it no longer wants deleted; one being deleted is left to the
// garbage collector; otherwise the whole pass runs, in sequence, each step
// using what the ones before found.
func GroupWorkflow(m *GroupManager, g *batchv1.TaskGroup) ctrlkit.Action {
	cleanup := ctrlkit.Sequential(m.LoadTasks(), m.DeleteTasks())
	switch {
	case g == nil:
		return cleanup
	case g.DeletionTimestamp != nil:
		return ctrlkit.Nop()
	case settled(g.Status.Phase, g.Status.ObservedGeneration, g.Generation):
		return cleanup
	}
	return ctrlkit.Sequential(m.Nodes(), m.LoadTasks(), m.DeleteTasks(), m.Deadline(), m.CreateTasks(), m.UpdateStatus())
}

var _ GroupManagerImpl = (*groupRun)(nil)

// Nodes implements GroupManagerImpl.
func (w *groupRun) Nodes(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	return w.nodes(ctx)
}

// LoadTasks implements GroupManagerImpl.
func (w *groupRun) LoadTasks(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	return w.loadTasks(ctx)
}

// DeleteTasks implements GroupManagerImpl.
func (w *groupRun) DeleteTasks(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	return w.deleteUnwanted(ctx)
}

// Deadline implements GroupManagerImpl.
func (w *groupRun) Deadline(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	return w.deadline(ctx)
}

// CreateTasks implements GroupManagerImpl.
func (w *groupRun) CreateTasks(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	return w.createMissing(ctx)
}

// UpdateStatus implements GroupManagerImpl.
func (w *groupRun) UpdateStatus(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	return w.updateStatus(ctx)
}

// groupRun is one reconcile of one group; group is nil when it is gone.
type groupRun struct {
	r               *TaskGroupReconciler
	group           *batchv1.TaskGroup
	name, namespace string

	// want are the keys of the tasks the group wants, in order: indices
	// "0".."count-1", or a perNode group's node names.
	want        []string
	mine        map[string]*batchv1.Task // the group's tasks by key
	terminating map[string]bool          // keys whose task is being deleted
	unwanted    []*batchv1.Task          // a deleted or earlier group's, index ≥ count, or a node that no longer matches
	// perNode: the nodes the group may have (nodes), or keep the nodes
	// its tasks are on (keepNodes: it is done).
	nodeSet   nodeSet
	keepNodes bool
	// stale: a task existed that the cache did not show; counting now
	// could count a finished task as new. Its arrival brings us back.
	stale atomic.Bool
	// expired is set once the group's activeDeadlineSeconds has passed;
	// until then, untilDeadline is what is left of it (0: no deadline).
	expired       bool
	stopped       int
	untilDeadline time.Duration
	// refused: the Tasks the API would not create, for what they ask.
	refusedMu sync.Mutex
	refused   []refusal
}

// deadline ends a group past its activeDeadlineSeconds: its unfinished
// tasks are deleted (their hubs stop the processes first) and none is made
// again; updateStatus then ends it Failed.
func (w *groupRun) deadline(ctx context.Context) (reconcile.Result, error) {
	g := w.group
	if g.Spec.ActiveDeadlineSeconds == nil {
		return ctrlkit.NoRequeue()
	}
	now := w.r.Clock.Now()
	end := g.CreationTimestamp.Add(time.Duration(*g.Spec.ActiveDeadlineSeconds) * time.Second)
	if now.Before(end) {
		w.untilDeadline = end.Sub(now)
		return ctrlkit.NoRequeue()
	}
	// A group whose tasks all ended in time (reconciled late) ends as they
	// did; only one with work left is cut short (a perNode group that no
	// node ever matched has all its work left).
	done := (len(w.terminating) == 0 || multi(g)) && (len(w.want) > 0 || !g.Spec.PerNode)
	for _, k := range w.want {
		if !w.instanceDone(k) {
			done = false
		}
	}
	if done {
		return ctrlkit.NoRequeue()
	}
	w.expired = true
	for _, t := range w.mine {
		if t.Status.State.Final() {
			continue
		}
		w.stopped++
		if _, err := deleteDependent(ctx, w.r.Client, w.r.APIReader, t, g.UID); err != nil {
			return ctrlkit.RequeueIfErrorAndWrap("delete Task "+t.Name+" past the group's deadline", err)
		}
	}
	w.stopped += len(w.terminating)
	return ctrlkit.NoRequeue()
}

// nodes reads the nodes a perNode group may have.
func (w *groupRun) nodes(ctx context.Context) (reconcile.Result, error) {
	if !w.group.Spec.PerNode {
		return ctrlkit.NoRequeue()
	}
	set, err := perNodeSet(ctx, w.r.Client, w.group)
	if err != nil {
		return ctrlkit.RequeueIfError(err)
	}
	w.nodeSet = set
	return ctrlkit.NoRequeue()
}

// keyOf is t's key in its group (its index, or its node), and whether the
// group, as it is now, may have it.
func (w *groupRun) keyOf(t *batchv1.Task) (string, bool) {
	g := w.group
	if g == nil {
		return "", false
	}
	var key string
	var ok bool
	if g.Spec.PerNode {
		key = t.Spec.NodeName
		ok = key != "" && (w.keepNodes || w.nodeSet.matching[key])
	} else {
		idx, err := strconv.Atoi(t.Labels[batchv1.LabelIndex])
		key, ok = strconv.Itoa(idx), err == nil && idx >= 0 && idx < int(g.Spec.Count)
	}
	if multi(g) {
		return memberKeyOf(g, t, key, ok)
	}
	if t.Labels[batchv1.LabelInstance] != "" {
		return key, false // made when the group had spec.tasks
	}
	return key, ok
}

func (w *groupRun) loadTasks(ctx context.Context) (reconcile.Result, error) {
	var list batchv1.TaskList
	if err := w.r.Client.List(ctx, &list, client.InNamespace(w.namespace), client.MatchingLabels{batchv1.LabelTaskGroup: kname.LabelValue(w.name)}); err != nil {
		return ctrlkit.RequeueIfErrorAndWrap("list Tasks", err)
	}
	w.mine, w.terminating = map[string]*batchv1.Task{}, map[string]bool{}
	for i := range list.Items {
		t := &list.Items[i]
		owner := controllerOf(t)
		if owner == nil || owner.Kind != "TaskGroup" || owner.Name != w.name {
			continue // a name-alike's task
		}
		key, ok := w.keyOf(t)
		if !ok || owner.UID != w.group.UID || w.mine[key] != nil && t.DeletionTimestamp == nil {
			w.unwanted = append(w.unwanted, t)
			continue
		}
		if t.DeletionTimestamp != nil {
			// Its replacement is made once it is gone (a finalizer may
			// hold it while its hub cancels the process).
			w.terminating[key] = true
			continue
		}
		w.mine[key] = t
	}
	w.want = w.wanted()
	return ctrlkit.NoRequeue()
}

// wanted are the keys of the tasks the group wants: its indices, or the
// nodes that have its task (being deleted or not) and those that may get one.
func (w *groupRun) wanted() []string {
	g := w.group
	if g == nil {
		return nil
	}
	if !g.Spec.PerNode {
		out := make([]string, g.Spec.Count)
		for i := range out {
			out[i] = strconv.Itoa(i)
		}
		return out
	}
	seen := map[string]bool{}
	var out []string
	add := func(n string) {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	for _, n := range slices.Sorted(maps.Keys(w.mine)) {
		add(instanceKey(n))
	}
	for _, n := range slices.Sorted(maps.Keys(w.terminating)) {
		add(instanceKey(n))
	}
	if !w.keepNodes {
		for _, n := range w.nodeSet.joinable {
			add(n)
		}
	}
	slices.Sort(out)
	return out
}

func (w *groupRun) deleteUnwanted(ctx context.Context) (reconcile.Result, error) {
	for _, t := range w.unwanted {
		if t.DeletionTimestamp != nil {
			continue
		}
		deleted, err := deleteDependent(ctx, w.r.Client, w.r.APIReader, t, controllerOf(t).UID)
		if err != nil {
			return ctrlkit.RequeueIfErrorAndWrap("delete Task "+t.Name, err)
		}
		if deleted {
			log.FromContext(ctx).Info("deleted task", "Task", t.Name, "state", t.Status.State)
			if w.group != nil && w.r.Recorder != nil && t.Status.State.Holds() {
				// A running process is stopped: say why, on the group.
				why := fmt.Sprintf("not one of the group's %d tasks any more", w.group.Spec.Count)
				if w.group.Spec.PerNode {
					why = "its node no longer matches the group's nodeSelector and NodeGrants, or is gone"
				}
				w.r.Recorder.Eventf(w.group, nil, corev1.EventTypeNormal, "ScaledDown", "Delete",
					"deleted task %s (%s on node %s): %s", t.Name, t.Status.State, t.Status.NodeName, why)
			}
		}
	}
	return ctrlkit.NoRequeue()
}

func (w *groupRun) createMissing(ctx context.Context) (reconcile.Result, error) {
	g := w.group
	if w.expired {
		return ctrlkit.NoRequeue()
	}
	if multi(g) {
		return w.createMembers(ctx)
	}
	eg, ectx := errgroup.WithContext(ctx)
	eg.SetLimit(8)
	var missing []*batchv1.Task
	for _, k := range w.want {
		if w.mine[k] != nil || w.terminating[k] {
			continue
		}
		t, err := newTask(g, k, w.r.Client.Scheme())
		if err != nil {
			return ctrlkit.RequeueIfErrorAndWrap("owner reference", err)
		}
		missing = append(missing, t)
		w.mine[k] = t // counted as Pending
	}
	for _, t := range missing {
		eg.Go(func() error {
			// AlreadyExists: the cache has not seen it yet.
			err := w.r.Client.Create(ectx, t)
			switch {
			case apierrors.IsAlreadyExists(err):
				w.stale.Store(true)
			case refused(err):
				// Asking again at once gets the same answer: said on the
				// group's status, asked again after CreateRetry or when
				// the policy changes.
				w.refusedMu.Lock()
				w.refused = append(w.refused, refusal{kind: "Task", name: t.Name, err: err})
				w.refusedMu.Unlock()
			case err != nil:
				return fmt.Errorf("create Task %s: %w", t.Name, err)
			}
			return nil
		})
	}
	if err := eg.Wait(); err != nil {
		return ctrlkit.RequeueIfError(err)
	}
	return ctrlkit.NoRequeue()
}

// newTask is the task of group g with key: its index, or for a perNode
// group its node, to which it is pinned.
func newTask(g *batchv1.TaskGroup, key string, scheme *runtime.Scheme) (*batchv1.Task, error) {
	labels := map[string]string{}
	maps.Copy(labels, g.Spec.Template.Labels)
	maps.Copy(labels, g.Spec.Template.Metadata.Labels)
	labels[batchv1.LabelTaskGroup] = kname.LabelValue(g.Name)
	if j := g.Labels[batchv1.LabelFleetJob]; j != "" {
		labels[batchv1.LabelFleetJob] = j
	}
	name := g.Name + "-" + key
	spec := g.Spec.Template.Spec.DeepCopy()
	if g.Spec.PerNode {
		labels[batchv1.LabelNode] = kname.LabelValue(key)
		name = perNodeTaskName(g.Name, key)
		spec.NodeName = key
	} else {
		labels[batchv1.LabelIndex] = key
	}
	t := &batchv1.Task{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: g.Namespace, Labels: labels,
			Annotations: maps.Clone(g.Spec.Template.Metadata.Annotations)},
		Spec: *spec,
	}
	return t, controllerutil.SetControllerReference(g, t, scheme)
}

func (w *groupRun) updateStatus(ctx context.Context) (reconcile.Result, error) {
	g := w.group
	if w.stale.Load() {
		return ctrlkit.NoRequeue()
	}
	var c batchv1.TaskCounts
	var memberTasks []batchv1.GroupTaskStatus
	var progress, failReason, failMsg string
	if multi(g) {
		memberTasks, progress, failReason, failMsg = w.memberStatus(&c)
	}
	for _, k := range w.want {
		if multi(g) {
			break
		}
		t := w.mine[k]
		switch {
		case w.expired && (t == nil || !t.Status.State.Final()):
			// Stopped at the deadline (or never made): failed.
			addState(&c, batchv1.TaskFailed)
		case t != nil:
			addState(&c, countedState(t))
		}
	}
	before := g.Status.DeepCopy()
	st := &g.Status
	st.Tasks, st.TaskProgress = memberTasks, progress
	desired := int32(len(w.want))
	st.Counts = c
	st.Desired = desired
	st.Phase = phaseOf(c, desired, before.Phase, g.Spec.PerNode)
	st.ObservedGeneration = g.Generation
	unit := "tasks"
	if len(g.Spec.Tasks) > 0 {
		unit = "instances"
	}
	complete := completeCondition(st.Phase, c, desired, g.Generation, unit)
	if g.Spec.PerNode && desired == 0 {
		complete.Message = "no node matches yet: one task is made for each Online node that matches the template's nodeSelector and a NodeGrant of the namespace allows (perNode)"
	}
	if st.Phase == batchv1.GroupFailed && failReason != "" {
		// Why the first failed instance failed: InitFailed names its init.
		complete.Reason = failReason
		complete.Message = failMsg + "; " + complete.Message
	}
	if w.expired {
		st.Phase = batchv1.GroupFailed
		complete = completeCondition(st.Phase, c, desired, g.Generation, unit)
		complete.Reason = batchv1.ReasonDeadlineExceeded
		complete.Message = fmt.Sprintf("active for more than activeDeadlineSeconds (%ds): %d unfinished tasks stopped; %s",
			*g.Spec.ActiveDeadlineSeconds, w.stopped, complete.Message)
	}
	setPhaseConditions(&st.Conditions, st.Phase, complete, w.r.Clock.Now())
	refusedMsg := ""
	if len(w.refused) > 0 {
		refusedMsg = createFailedMessage(w.refused)
	}
	newRefusal := setCreateFailed(&st.Conditions, refusedMsg, g.Generation, w.r.Clock.Now())
	if equality.Semantic.DeepEqual(before, st) {
		return w.requeue()
	}
	if err := w.r.Client.Status().Update(ctx, g); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return ctrlkit.Exit() // the newer version brings us back
		}
		return ctrlkit.RequeueIfErrorAndWrap("update TaskGroup status", err)
	}
	if newRefusal {
		log.FromContext(ctx).Info("tasks refused by the API", "refused", len(w.refused), "message", refusedMsg)
		if w.r.Recorder != nil {
			w.r.Recorder.Eventf(g, nil, corev1.EventTypeWarning, ReasonFailedCreate, "CreateTask", "%s", refusedMsg)
		}
	}
	phaseEvent(w.r.Recorder, g, before.Phase, st.Phase, st.Conditions)
	return w.requeue()
}

// requeue looks at the group again when its deadline passes, if it has
// one to come, and after CreateRetry if the API refused some of its tasks.
func (w *groupRun) requeue() (reconcile.Result, error) {
	var res reconcile.Result
	if w.untilDeadline > 0 && !w.group.Status.Phase.Final() {
		res.RequeueAfter = w.untilDeadline
	}
	if len(w.refused) > 0 && (res.RequeueAfter == 0 || w.r.CreateRetry < res.RequeueAfter) {
		res.RequeueAfter = w.r.CreateRetry
	}
	return res, nil
}

// phaseEvent announces a group's or job's phase change.
func phaseEvent(rec events.EventRecorder, obj client.Object, from, to batchv1.GroupPhase, conds []metav1.Condition) {
	if rec == nil || from == to || to == batchv1.GroupPending {
		return
	}
	note := ""
	for _, c := range conds {
		if c.Type == ConditionComplete {
			note = c.Message
		}
	}
	typ := corev1.EventTypeNormal
	if to == batchv1.GroupFailed {
		typ = corev1.EventTypeWarning
	}
	rec.Eventf(obj, nil, typ, string(to), "Phase", "%s", note)
}
