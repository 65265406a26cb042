package agentupdater

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
	"github.com/drover-fleet/drover/pkg/ctrlkit"
)

// ConditionReady is the task's condition: True once updated, else False
// with the reason.
const ConditionReady = "Ready"

// Reconciler runs AgentVersionUpdateTasks.
type Reconciler struct {
	Client client.Client
	// Recorder records Events on tasks; nil records none.
	Recorder events.EventRecorder
	// Observer, if set, sees every action.
	Observer ctrlkit.Observer
}

// SetupWithManager registers the controller: a task is reconciled when it
// or the job it owns changes.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	return ctrl.NewControllerManagedBy(mgr).Named("agentversionupdatetask").
		For(&updatev1.AgentVersionUpdateTask{}).
		Owns(&opsv1.NodeUpgradeJob{}).
		Complete(r.generated())
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	return r.generated().Reconcile(ctx, req)
}

func (r *Reconciler) generated() *AgentUpdaterReconciler {
	return &AgentUpdaterReconciler{
		Client: r.Client,
		NewImpl: func(c client.Client, t *updatev1.AgentVersionUpdateTask) AgentUpdaterImpl {
			return &impl{r: r, task: t}
		},
		Workflow: func(m *AgentUpdater, t *updatev1.AgentVersionUpdateTask) ctrlkit.Action {
			if t.Status.UpdateStatus.Done() {
				// The contract's end states are final: a finished task
				// is never touched again (its job is left for the record
				// and goes with the task).
				return ctrlkit.Nop()
			}
			return ctrlkit.Sequential(m.Decide(), m.SyncJob(), m.UpdateStatus())
		},
		Observer: r.Observer,
	}
}

type impl struct {
	r        *Reconciler
	task     *updatev1.AgentVersionUpdateTask
	job      *opsv1.NodeUpgradeJob
	decision Decision
}

var _ AgentUpdaterImpl = (*impl)(nil)

// JobName is the task's job: the same name (both are cluster-scoped, and
// a task name is unique per node, updater, plan and attempt).
func JobName(t *updatev1.AgentVersionUpdateTask) string { return t.Name }

// Decide implements AgentUpdaterImpl.
func (i *impl) Decide(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	var job opsv1.NodeUpgradeJob
	err := i.r.Client.Get(ctx, types.NamespacedName{Name: JobName(i.task)}, &job)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return ctrlkit.RequeueIfErrorAndWrap("get NodeUpgradeJob "+JobName(i.task), err)
	case !metav1.IsControlledBy(&job, i.task):
		// A job of that name that is not ours: never adopt or touch it.
		i.decision = Decision{Status: updatev1.StatusFailed, Reason: "NameTaken",
			Message: fmt.Sprintf("a NodeUpgradeJob named %s exists and is not this task's: delete it or the task", job.Name)}
		return ctrlkit.NoRequeue()
	default:
		i.job = &job
	}
	i.decision = Decide(i.task.Spec.UpdatePhase, i.task.Labels[updatev1.LabelNode], i.job)
	return ctrlkit.NoRequeue()
}

// SyncJob implements AgentUpdaterImpl.
func (i *impl) SyncJob(ctx context.Context, logger logr.Logger) (reconcile.Result, error) {
	d := i.decision
	switch {
	case d.CreateJob:
		job := &opsv1.NodeUpgradeJob{
			ObjectMeta: metav1.ObjectMeta{Name: JobName(i.task), Labels: map[string]string{}},
			Spec: opsv1.NodeUpgradeJobSpec{
				NodeNames: []string{i.task.Labels[updatev1.LabelNode]},
				Version:   i.task.Spec.Version,
				Artifact:  i.task.Spec.Artifact,
			},
		}
		job.Spec.TimeoutSeconds = i.task.Spec.TimeoutSeconds
		for _, l := range []string{updatev1.LabelUpdateTaskName, updatev1.LabelPool, updatev1.LabelNode, updatev1.LabelUpdater} {
			if v := i.task.Labels[l]; v != "" {
				job.Labels[l] = v
			}
		}
		if err := controllerutil.SetControllerReference(i.task, job, i.r.Client.Scheme()); err != nil {
			return ctrlkit.RequeueIfErrorAndWrap("own the job", err)
		}
		if err := i.r.Client.Create(ctx, job); err != nil && !apierrors.IsAlreadyExists(err) {
			if apierrors.IsInvalid(err) {
				// The job's schema refuses what the template gave: no
				// retry makes it valid.
				i.decision = Decision{Status: updatev1.StatusFailed, Reason: "InvalidUpgrade", Message: err.Error()}
				return ctrlkit.NoRequeue()
			}
			return ctrlkit.RequeueIfErrorAndWrap("create NodeUpgradeJob "+job.Name, err)
		}
		logger.Info("node upgrade job created", "NodeUpgradeJob", job.Name, "node", job.Spec.NodeNames[0], "version", job.Spec.Version)
		i.decision.Message = fmt.Sprintf("NodeUpgradeJob %s created", job.Name)
	case d.AbortJob:
		p := []byte(`{"spec":{"abort":true}}`)
		if err := i.r.Client.Patch(ctx, i.job, client.RawPatch(types.MergePatchType, p)); client.IgnoreNotFound(err) != nil {
			return ctrlkit.RequeueIfErrorAndWrap("abort NodeUpgradeJob "+i.job.Name, err)
		}
	}
	return ctrlkit.NoRequeue()
}

// UpdateStatus implements AgentUpdaterImpl.
func (i *impl) UpdateStatus(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	d := i.decision
	t := i.task
	before := t.DeepCopy()
	prev := t.Status.UpdateStatus
	t.Status.UpdateStatus = d.Status
	t.Status.NodeUpgradeJob = JobName(t)
	if i.job == nil && !d.CreateJob {
		t.Status.NodeUpgradeJob = ""
	}
	status := metav1.ConditionFalse
	if d.Status == updatev1.StatusUpdated {
		status = metav1.ConditionTrue
	}
	msg := d.Message
	if len(msg) > 1024 {
		msg = msg[:1021] + "..."
	}
	meta.SetStatusCondition(&t.Status.Conditions, metav1.Condition{Type: ConditionReady, Status: status, Reason: d.Reason, Message: msg, ObservedGeneration: t.Generation})
	if equality.Semantic.DeepEqual(before.Status, t.Status) {
		return ctrlkit.NoRequeue()
	}
	if err := i.r.Client.Status().Patch(ctx, t, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsConflict(err) {
			return ctrlkit.RequeueImmediately()
		}
		return ctrlkit.RequeueIfErrorAndWrap("patch task status", client.IgnoreNotFound(err))
	}
	if prev != d.Status && i.r.Recorder != nil {
		typ := corev1.EventTypeNormal
		if d.Status == updatev1.StatusFailed {
			typ = corev1.EventTypeWarning
		}
		i.r.Recorder.Eventf(t, nil, typ, d.Reason, "AgentUpdate", "%s", msg)
	}
	return ctrlkit.NoRequeue()
}
