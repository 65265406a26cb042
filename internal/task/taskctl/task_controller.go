package taskctl

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/pkg/ctrlkit"
)

// IndexTaskNode indexes Tasks by status.nodeName, so a FleetNode's change
// finds the tasks on it.
const IndexTaskNode = "status.nodeName"

// TaskReconciler runs a task's life after the hub's reports: a Failed
// attempt restarts under restartPolicy OnFailure, an attempt whose node went
// Offline (or that was not started within DispatchTimeout) is recorded and
// made again elsewhere under reschedulePolicy OnNodeLost. It never writes
// Running or Completed, and it never places tasks: the Scheduler does.
type TaskReconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	// Clock; nil = the real one.
	Clock clock.Clock
	// DispatchTimeout bounds Scheduled and Dispatching on an Online node.
	// Default 5m.
	DispatchTimeout time.Duration
}

// +kubebuilder:rbac:groups=batch.drover.io,resources=tasks,verbs=get;list;watch
// +kubebuilder:rbac:groups=batch.drover.io,resources=tasks/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=fleet.drover.io,resources=fleetnodes,verbs=get;list;watch

// SetupWithManager registers the controller. The Task index on
// status.nodeName must exist (Setup adds it).
func (r *TaskReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.Clock = clock.Or(r.Clock)
	if r.DispatchTimeout <= 0 {
		r.DispatchTimeout = 5 * time.Minute
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("task").
		For(&batchv1.Task{}).
		Watches(&fleetv1.FleetNode{}, handler.EnqueueRequestsFromMapFunc(r.tasksOnNode)).
		Complete(r)
}

// tasksOnNode maps a FleetNode to the tasks whose current attempt is on it.
func (r *TaskReconciler) tasksOnNode(ctx context.Context, obj client.Object) []reconcile.Request {
	var list batchv1.TaskList
	if err := r.Client.List(ctx, &list, client.MatchingFields{IndexTaskNode: obj.GetName()}, client.UnsafeDisableDeepCopy); err != nil {
		log.FromContext(ctx).Error(err, "list tasks on node", "FleetNode", obj.GetName())
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		if list.Items[i].Status.State.Holds() {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return out
}

// Reconcile implements reconcile.Reconciler.
func (r *TaskReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var t batchv1.Task
	if err := r.Client.Get(ctx, req.NamespacedName, &t); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	m := NewTaskLifecycle(NewTaskLifecycleState(r.Client, &t), &taskRun{r: r, task: &t})
	return ctrlkit.Reconcile(ctx, ctrlkit.Optimize(TaskWorkflow(m, &t)))
}

// TaskWorkflow is the Task controller's workflow (actions in task.ctrlkit):
// nothing for a task being deleted (its hub releases it) or Completed (no
// step leaves Completed); else read the attempt's node, then step.
func TaskWorkflow(m *TaskLifecycle, t *batchv1.Task) ctrlkit.Action {
	return ctrlkit.If(t.DeletionTimestamp == nil && t.Status.State != batchv1.TaskCompleted,
		ctrlkit.Sequential(m.ReadNode(), m.Step()))
}

var _ TaskLifecycleImpl = (*taskRun)(nil)

// ReadNode implements TaskLifecycleImpl.
func (w *taskRun) ReadNode(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	return w.readNode(ctx)
}

// Step implements TaskLifecycleImpl.
func (w *taskRun) Step(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	return w.step(ctx)
}

// taskRun is one reconcile of one task.
type taskRun struct {
	r    *TaskReconciler
	task *batchv1.Task
	node nodeView
}

func (w *taskRun) readNode(ctx context.Context) (reconcile.Result, error) {
	name := w.task.Status.NodeName
	if name == "" || !w.task.Status.State.Holds() {
		return ctrlkit.NoRequeue()
	}
	var n fleetv1.FleetNode
	switch err := w.r.Client.Get(ctx, client.ObjectKey{Name: name}, &n); {
	case apierrors.IsNotFound(err):
		w.node = nodeView{}
	case err != nil:
		return ctrlkit.RequeueIfErrorAndWrap("get FleetNode "+name, err)
	default:
		w.node = nodeView{exists: true, phase: n.Status.Phase}
	}
	return ctrlkit.NoRequeue()
}

func (w *taskRun) step(ctx context.Context) (reconcile.Result, error) {
	c, recheck := step(w.task, w.node, w.r.Clock.Now(), w.r.DispatchTimeout)
	if c == nil {
		if recheck > 0 {
			return ctrlkit.RequeueAfter(recheck)
		}
		return ctrlkit.NoRequeue()
	}
	t := w.task
	before := t.Status.State
	t.Status = c.status
	if err := w.r.Client.Status().Update(ctx, t); err != nil {
		switch {
		case apierrors.IsConflict(err):
			// A hub wrote meanwhile; its write brings us back.
			return ctrlkit.Exit()
		case apierrors.IsNotFound(err):
			return ctrlkit.Exit()
		}
		return ctrlkit.RequeueIfErrorAndWrap(fmt.Sprintf("update Task %s status", t.Name), err)
	}
	switch c.metric {
	case "restart":
		taskRestarts.Inc()
	case "reschedule":
		taskReschedules.WithLabelValues(c.reason).Inc()
	case "fail":
		tasksFailed.WithLabelValues(c.reason).Inc()
	}
	log.FromContext(ctx).Info("task attempt ended", "from", before, "state", t.Status.State, "reason", t.Status.Reason, "attempt", t.Status.Attempt, "message", t.Status.Message)
	if w.r.Recorder != nil {
		w.r.Recorder.Eventf(t, nil, c.eventType, c.reason, string(t.Status.State), "%s", c.note)
	}
	return ctrlkit.NoRequeue()
}
