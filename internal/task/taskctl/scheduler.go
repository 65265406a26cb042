package taskctl

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"golang.org/x/sync/errgroup"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/scheduler"
)

// schedulerKey is the one request of the scheduling loop: every Task and
// FleetNode change enqueues it, and the work queue folds them together.
var schedulerKey = reconcile.Request{NamespacedName: types.NamespacedName{Name: "drover-task-scheduler"}}

// Scheduler places Pending tasks on nodes. It is one loop for all tasks,
// not a reconcile per task: each run lists the nodes and tasks, orders the
// due Pending tasks (priority, then age) and places them one by one with
// internal/scheduler, so each placement sees the ones before it.
type Scheduler struct {
	Client   client.Client
	Recorder events.EventRecorder
	// Clock; nil = the real one.
	Clock clock.Clock
	// Writers is how many status writes run at once. Default 8.
	Writers int

	mu sync.Mutex
	// assumed holds the placements written but not yet seen in the cache,
	// as kube-scheduler's assume cache does: without it a loop running on
	// a stale cache would see the node emptier than it is.
	assumed map[types.UID]assumption
	// badGrants: the NodeGrants that do not compile, by uid, at the
	// generation last reported.
	badGrants map[types.UID]int64
}

type assumption struct {
	task            scheduler.Task
	node            string
	attempt         int32
	resourceVersion string
}

// +kubebuilder:rbac:groups=batch.drover.io,resources=tasks,verbs=get;list;watch
// +kubebuilder:rbac:groups=batch.drover.io,resources=tasks/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=fleet.drover.io,resources=fleetnodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=fleet.drover.io,resources=nodegrants,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SetupWithManager registers the loop. NodeGrants and namespaces' labels
// are watched too: a task waiting for a grant is placed once one is made.
func (s *Scheduler) SetupWithManager(mgr ctrl.Manager) error {
	s.Clock = clock.Or(s.Clock)
	if s.Writers <= 0 {
		s.Writers = 8
	}
	s.assumed = map[types.UID]assumption{}
	always := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{schedulerKey}
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("task-scheduler").
		Watches(&batchv1.Task{}, always, onUpdate(taskMatters)).
		Watches(&fleetv1.FleetNode{}, always, onUpdate(nodeMatters)).
		Watches(&fleetv1.NodeGrant{}, always, onUpdate(grantMatters)).
		Watches(&corev1.Namespace{}, always, builder.OnlyMetadata, onUpdate(namespaceMatters)).
		Complete(s)
}

// taskMatters: a task update concerns the scheduler when the task is
// Pending (new, restarted, touched) or its state changed (a node freed or
// taken).
func taskMatters(e event.UpdateEvent) bool {
	o, n := e.ObjectOld.(*batchv1.Task), e.ObjectNew.(*batchv1.Task)
	return o.Status.State != n.Status.State || n.Status.State == "" || n.Status.State == batchv1.TaskPending ||
		!equality.Semantic.DeepEqual(o.Spec, n.Spec)
}

// nodeMatters: heartbeats do not; phase, labels, capacity and cordoning do.
func nodeMatters(e event.UpdateEvent) bool {
	o, n := e.ObjectOld.(*fleetv1.FleetNode), e.ObjectNew.(*fleetv1.FleetNode)
	return o.Status.Phase != n.Status.Phase || o.Spec.Unschedulable != n.Spec.Unschedulable ||
		scheduler.NodeFrom(o).Disconnected != scheduler.NodeFrom(n).Disconnected ||
		!equality.Semantic.DeepEqual(o.Labels, n.Labels) || !equality.Semantic.DeepEqual(o.Status.Capacity, n.Status.Capacity)
}

// decision is one task's outcome in a loop.
type decision struct {
	task    *batchv1.Task // from the cache: not to be modified
	st      scheduler.Task
	node    string
	message string
	denied  bool // the tenancy policy alone rules it out
	// reason of a task left Pending when it is not Unschedulable or
	// NotGranted: InsufficientNodes, InvalidResources.
	reason string
	// instance of a multi-task group's task, "" for a single task.
	instance string
}

// Reconcile runs one scheduling loop.
func (s *Scheduler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	now := s.Clock.Now()
	defer func() { schedulerLoop.Observe(s.Clock.Since(now).Seconds()) }()

	var nodes fleetv1.FleetNodeList
	if err := s.Client.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return ctrl.Result{}, fmt.Errorf("list FleetNodes: %w", err)
	}
	var tasks batchv1.TaskList
	if err := s.Client.List(ctx, &tasks, client.UnsafeDisableDeepCopy); err != nil {
		return ctrl.Result{}, fmt.Errorf("list Tasks: %w", err)
	}
	views := make([]scheduler.Node, len(nodes.Items))
	for i := range nodes.Items {
		views[i] = scheduler.NodeFrom(&nodes.Items[i])
	}
	cluster := scheduler.New(views)

	s.mu.Lock()
	seen := make(map[types.UID]bool, len(tasks.Items))
	var due []decision
	var wake time.Time // earliest backoff end among tasks not due yet
	units := instances{}
	for i := range tasks.Items {
		t := &tasks.Items[i]
		seen[t.UID] = true
		st, selErr := scheduler.TaskFrom(t)
		inst := instanceOf(t)
		if a, ok := s.assumed[t.UID]; ok {
			if pendingState(t.Status.State) && t.Status.Attempt <= a.attempt && t.ResourceVersion != a.resourceVersion {
				// Our write is not in the cache yet.
				if inst != "" {
					units.add(inst, t, st, a.node)
				} else {
					cluster.Hold(a.task, a.node)
				}
				continue
			}
			delete(s.assumed, t.UID)
		}
		if inst != "" {
			// The instance holds its room as a whole (units.hold).
			units.add(inst, t, st, "")
			if t.DeletionTimestamp == nil && pendingState(t.Status.State) && len(t.Spec.SchedulingGates) == 0 {
				if next := t.Status.NextAttemptTime; next != nil && next.After(now) {
					if wake.IsZero() || next.Time.Before(wake) {
						wake = next.Time
					}
					continue
				}
				d := decision{task: t, st: st, instance: inst}
				if selErr != nil {
					d.message = selErr.Error()
					d.st.Key = ""
					if errors.Is(selErr, scheduler.ErrInvalidResources) {
						d.reason = batchv1.ReasonInvalidResources
					}
				}
				due = append(due, d)
			}
			continue
		}
		if t.DeletionTimestamp != nil {
			// Never placed again, but its process may run until its hub
			// has cancelled it: what it holds stays taken until then.
			if t.Status.State.Holds() && t.Status.NodeName != "" {
				cluster.Hold(st, t.Status.NodeName)
			}
			continue
		}
		switch {
		case t.Status.State.Holds() && t.Status.NodeName != "":
			cluster.Hold(st, t.Status.NodeName)
		case pendingState(t.Status.State):
			if next := t.Status.NextAttemptTime; next != nil && next.After(now) {
				if wake.IsZero() || next.Time.Before(wake) {
					wake = next.Time
				}
				continue
			}
			d := decision{task: t, st: st}
			if selErr != nil {
				d.message = selErr.Error()
				d.st.Key = "" // marks it unplaceable
				if errors.Is(selErr, scheduler.ErrInvalidResources) {
					d.reason = batchv1.ReasonInvalidResources
				}
			}
			due = append(due, d)
		}
	}
	for uid := range s.assumed {
		if !seen[uid] {
			delete(s.assumed, uid)
		}
	}
	s.mu.Unlock()
	units.hold(cluster)
	schedulerPending.Set(float64(len(due)))

	policy, err := s.policy(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	access, err := s.accessOf(ctx, policy, due)
	if err != nil {
		return ctrl.Result{}, err
	}

	order := make([]scheduler.Task, 0, len(due))
	byKey := make(map[string]*decision, len(due))
	for i := range due {
		if due[i].st.Key != "" {
			due[i].st.Access = access[due[i].task.Namespace]
			order = append(order, due[i].st)
			byKey[due[i].st.Key] = &due[i]
		}
	}
	scheduler.Sort(order)
	notGranted := 0
	for _, st := range order {
		d := byKey[st.Key]
		if d.instance != "" {
			st = units.unitTask(d.instance, st)
			d.st = st
		}
		r := cluster.Place(st)
		if d.instance != "" && r.Node != "" {
			units.placed(d.instance, r.Node)
		}
		d.node, d.message, d.denied = r.Node, r.Message, r.Denied != nil
		if r.Node == "" && r.Denied == nil && r.InsufficientNodes {
			d.reason = batchv1.ReasonInsufficientNodes
		}
		if r.Node == "" && (r.Denied != nil || r.Reasons[scheduler.ReasonNotGranted] > 0) {
			notGranted++
		}
	}
	schedulerNotGranted.Set(float64(notGranted))

	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(s.Writers)
	var errMu sync.Mutex
	var errs []error
	for i := range due {
		d := &due[i]
		g.Go(func() error {
			if err := s.write(gctx, d, now); err != nil {
				errMu.Lock()
				errs = append(errs, err)
				errMu.Unlock()
			}
			return nil
		})
	}
	_ = g.Wait()
	if err := errors.Join(errs...); err != nil {
		return ctrl.Result{}, err
	}
	if !wake.IsZero() {
		return ctrl.Result{RequeueAfter: max(wake.Sub(now), 10*time.Millisecond)}, nil
	}
	return ctrl.Result{}, nil
}

func pendingState(s batchv1.TaskState) bool { return s == "" || s == batchv1.TaskPending }

// write records d on its task: Scheduled on a node, or Pending with the
// reason it fits nowhere. A conflict is not an error: the task changed, and
// its change brings the loop back.
func (s *Scheduler) write(ctx context.Context, d *decision, now time.Time) error {
	t := d.task.DeepCopy()
	st := &t.Status
	if st.Attempt < 1 {
		st.Attempt = 1
	}
	st.ObservedGeneration = t.Generation
	if d.node != "" {
		st.State, st.NodeName = batchv1.TaskScheduled, d.node
		st.Reason, st.Message = batchv1.ReasonScheduled, fmt.Sprintf("attempt %d on node %s", st.Attempt, d.node)
		st.NextAttemptTime = nil
		meta.RemoveStatusCondition(&st.Conditions, ConditionScheduled)
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: ConditionScheduled, Status: metav1.ConditionTrue,
			Reason: batchv1.ReasonScheduled, Message: st.Message, LastTransitionTime: metav1.NewTime(now), ObservedGeneration: t.Generation})
	} else {
		reason := batchv1.ReasonUnschedulable
		switch {
		case d.denied:
			reason = ReasonNotGranted
		case d.reason != "":
			reason = d.reason
		}
		if d.task.Status.State == batchv1.TaskPending && d.task.Status.Reason == reason && d.task.Status.Message == d.message {
			return nil // said already: no write, no Event
		}
		st.State = batchv1.TaskPending
		st.Reason, st.Message = reason, d.message
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: ConditionScheduled, Status: metav1.ConditionFalse,
			Reason: reason, Message: d.message, ObservedGeneration: t.Generation})
	}
	if err := s.Client.Status().Update(ctx, t); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("update Task %s/%s status: %w", t.Namespace, t.Name, err)
	}
	if d.node != "" {
		s.mu.Lock()
		s.assumed[t.UID] = assumption{task: d.st, node: d.node, attempt: st.Attempt, resourceVersion: t.ResourceVersion}
		s.mu.Unlock()
		tasksScheduled.Inc()
		log.FromContext(ctx).V(1).Info("task scheduled", "Task", client.ObjectKeyFromObject(t), "node", d.node, "attempt", st.Attempt)
		if s.Recorder != nil {
			s.Recorder.Eventf(t, nil, corev1.EventTypeNormal, batchv1.ReasonScheduled, "Schedule", "%s", st.Message)
		}
		return nil
	}
	tasksUnschedulable.Inc()
	log.FromContext(ctx).Info("task unschedulable", "Task", client.ObjectKeyFromObject(t), "reason", st.Reason, "message", d.message)
	if s.Recorder != nil {
		reason := ReasonFailedScheduling
		switch {
		case d.denied:
			reason = ReasonNotGranted
		case d.reason != "":
			reason = d.reason
		}
		s.Recorder.Eventf(t, nil, corev1.EventTypeWarning, reason, "Schedule", "%s", d.message)
	}
	return nil
}

// onUpdate filters updates only: creates, deletes and generic events always
// pass.
func onUpdate(update func(event.UpdateEvent) bool) builder.Predicates {
	return builder.WithPredicates(predicate.Funcs{UpdateFunc: update})
}
