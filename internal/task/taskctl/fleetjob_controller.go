package taskctl

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/kname"
	"github.com/drover-fleet/drover/pkg/ctrlkit"
)

// FleetJobReconciler makes one TaskGroup per entry of a FleetJob's
// spec.taskGroups, named <job>-<group>, keeps their spec in step with the
// job's (count, template, and the job-wide nodeSelector, priority and
// policies filled in), deletes groups the job no longer names, and sums the
// groups' status into the job's.
type FleetJobReconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	// APIReader reads a group afresh before deleting it; nil: the cache.
	APIReader client.Reader
	// Clock stamps condition transitions; nil: the wall clock.
	Clock clock.Clock
	// CreateRetry is how soon a job whose TaskGroups the API refused asks
	// again. Default 1m.
	CreateRetry time.Duration
}

// +kubebuilder:rbac:groups=batch.drover.io,resources=fleetjobs,verbs=get;list;watch
// +kubebuilder:rbac:groups=batch.drover.io,resources=fleetjobs/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=batch.drover.io,resources=taskgroups,verbs=get;list;watch;create;update;delete

// SetupWithManager registers the controller.
func (r *FleetJobReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.CreateRetry <= 0 {
		r.CreateRetry = time.Minute
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("fleetjob").
		For(&batchv1.FleetJob{}).
		Owns(&batchv1.TaskGroup{}).
		Complete(r)
}

// Reconcile implements reconcile.Reconciler.
func (r *FleetJobReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var job batchv1.FleetJob
	w := &jobRun{r: r, name: req.Name, namespace: req.Namespace}
	if err := r.Client.Get(ctx, req.NamespacedName, &job); err != nil {
		if apierrors.IsNotFound(err) {
			// Hand-wired rather than the generated Reconcile, which is
			// done at NotFound: whether or not a garbage collector runs,
			// the groups go with their job, and their tasks with them.
			job.Name, job.Namespace = req.Name, req.Namespace
			m := NewJobManager(NewJobManagerState(r.Client, &job), w)
			return ctrlkit.Reconcile(ctx, ctrlkit.Optimize(JobWorkflow(m, nil)))
		}
		return ctrl.Result{}, err
	}
	w.job = &job
	m := NewJobManager(NewJobManagerState(r.Client, &job), w)
	return ctrlkit.Reconcile(ctx, ctrlkit.Optimize(JobWorkflow(m, &job)))
}

// JobWorkflow is the FleetJob controller's workflow (actions in
// fleetjob.ctrlkit). A job that is gone (job nil) has its groups deleted;
// one being deleted, or done (a group deleted now is not made again), is
// left alone; otherwise, in sequence: list, delete, sync, sum.
func JobWorkflow(m *JobManager, job *batchv1.FleetJob) ctrlkit.Action {
	switch {
	case job == nil:
		return ctrlkit.Sequential(m.LoadGroups(), m.DeleteGroups())
	case job.DeletionTimestamp != nil, settled(job.Status.Phase, job.Status.ObservedGeneration, job.Generation):
		return ctrlkit.Nop()
	}
	return ctrlkit.Sequential(m.LoadGroups(), m.DeleteGroups(), m.SyncGroups(), m.UpdateStatus())
}

var _ JobManagerImpl = (*jobRun)(nil)

// LoadGroups implements JobManagerImpl.
func (w *jobRun) LoadGroups(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	return w.loadGroups(ctx)
}

// DeleteGroups implements JobManagerImpl.
func (w *jobRun) DeleteGroups(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	return w.deleteUnwanted(ctx)
}

// SyncGroups implements JobManagerImpl.
func (w *jobRun) SyncGroups(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	return w.syncGroups(ctx)
}

// UpdateStatus implements JobManagerImpl.
func (w *jobRun) UpdateStatus(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	return w.updateStatus(ctx)
}

// jobRun is one reconcile of one job; job is nil when it is gone.
type jobRun struct {
	r               *FleetJobReconciler
	job             *batchv1.FleetJob
	name, namespace string

	groups   map[string]*batchv1.TaskGroup // the job's groups by TaskGroup name
	unwanted []*batchv1.TaskGroup
	stale    bool // a group exists that the cache does not show as ours
	refused  []refusal
}

// groupName is the TaskGroup of the job's group tmpl.
func groupName(job, group string) string { return job + "-" + group }

func (w *jobRun) loadGroups(ctx context.Context) (reconcile.Result, error) {
	var list batchv1.TaskGroupList
	if err := w.r.Client.List(ctx, &list, client.InNamespace(w.namespace), client.MatchingLabels{batchv1.LabelFleetJob: kname.LabelValue(w.name)}); err != nil {
		return ctrlkit.RequeueIfErrorAndWrap("list TaskGroups", err)
	}
	wanted := map[string]bool{}
	if w.job != nil {
		for _, tg := range w.job.Spec.TaskGroups {
			wanted[groupName(w.name, tg.Name)] = true
		}
	}
	w.groups = map[string]*batchv1.TaskGroup{}
	for i := range list.Items {
		g := &list.Items[i]
		owner := controllerOf(g)
		if owner == nil || owner.Kind != "FleetJob" || owner.Name != w.name {
			continue
		}
		if w.job == nil || owner.UID != w.job.UID || !wanted[g.Name] {
			w.unwanted = append(w.unwanted, g)
			continue
		}
		w.groups[g.Name] = g
	}
	return ctrlkit.NoRequeue()
}

func (w *jobRun) deleteUnwanted(ctx context.Context) (reconcile.Result, error) {
	for _, g := range w.unwanted {
		if g.DeletionTimestamp != nil {
			continue
		}
		deleted, err := deleteDependent(ctx, w.r.Client, w.r.APIReader, g, controllerOf(g).UID)
		if err != nil {
			return ctrlkit.RequeueIfErrorAndWrap("delete TaskGroup "+g.Name, err)
		}
		if deleted {
			log.FromContext(ctx).Info("deleted task group", "TaskGroup", g.Name)
		}
	}
	return ctrlkit.NoRequeue()
}

// desiredSpec is the TaskGroup spec of tmpl in job: the template with the
// job-wide settings filled in where the template has none (the schema
// gives restartPolicy and reschedulePolicy no default for this reason).
func desiredSpec(job *batchv1.FleetJob, tmpl batchv1.TaskGroupTemplate) batchv1.TaskGroupSpec {
	spec := batchv1.TaskGroupSpec{Count: tmpl.Count, PerNode: tmpl.PerNode, Template: *tmpl.Template.DeepCopy()}
	ts := &spec.Template.Spec
	if ts.NodeSelector == nil && job.Spec.NodeSelector != nil {
		ts.NodeSelector = job.Spec.NodeSelector.DeepCopy()
	}
	if ts.Priority == 0 {
		ts.Priority = job.Spec.Priority
	}
	if ts.RestartPolicy == "" {
		ts.RestartPolicy = job.Spec.RestartPolicy
	}
	if ts.ReschedulePolicy == "" {
		ts.ReschedulePolicy = job.Spec.ReschedulePolicy
	}
	spec.ActiveDeadlineSeconds = job.Spec.ActiveDeadlineSeconds
	return spec
}

func (w *jobRun) syncGroups(ctx context.Context) (reconcile.Result, error) {
	job := w.job
	for _, tmpl := range job.Spec.TaskGroups {
		name := groupName(job.Name, tmpl.Name)
		want := desiredSpec(job, tmpl)
		if g := w.groups[name]; g != nil {
			if equality.Semantic.DeepEqual(g.Spec, want) {
				continue
			}
			g = g.DeepCopy()
			g.Spec = want
			if err := w.r.Client.Update(ctx, g); err != nil {
				if apierrors.IsConflict(err) {
					return ctrlkit.RequeueImmediately()
				}
				if refused(err) {
					w.refused = append(w.refused, refusal{kind: "TaskGroup", name: name, err: fmt.Errorf("update: %w", err)})
					continue
				}
				return ctrlkit.RequeueIfErrorAndWrap("update TaskGroup "+name, err)
			}
			w.groups[name] = g
			continue
		}
		g := &batchv1.TaskGroup{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: job.Namespace, Labels: map[string]string{batchv1.LabelFleetJob: kname.LabelValue(job.Name)}},
			Spec:       want,
		}
		if err := controllerutil.SetControllerReference(job, g, w.r.Client.Scheme()); err != nil {
			return ctrlkit.RequeueIfErrorAndWrap("owner reference", err)
		}
		if err := w.r.Client.Create(ctx, g); err != nil {
			if apierrors.IsAlreadyExists(err) {
				// Not in the cache yet (then the job's status waits: it
				// would miss a group), or someone else's group of that
				// name, which we leave alone and report.
				var other batchv1.TaskGroup
				switch gerr := w.r.Client.Get(ctx, client.ObjectKeyFromObject(g), &other); {
				case gerr != nil:
					w.stale = true
				case controllerOf(&other) == nil || controllerOf(&other).UID != job.UID:
					if w.r.Recorder != nil {
						w.r.Recorder.Eventf(job, &other, corev1.EventTypeWarning, "GroupNameTaken", "CreateTaskGroup", "TaskGroup %s exists and is not this job's", name)
					}
				default:
					w.stale = true
				}
				continue
			}
			if refused(err) {
				// Said on the job's status; asked again after CreateRetry.
				w.refused = append(w.refused, refusal{kind: "TaskGroup", name: name, err: err})
				continue
			}
			return ctrlkit.RequeueIfErrorAndWrap("create TaskGroup "+name, err)
		}
		log.FromContext(ctx).Info("created task group", "TaskGroup", name, "count", want.Count)
		w.groups[name] = g
	}
	return ctrlkit.NoRequeue()
}

func (w *jobRun) updateStatus(ctx context.Context) (reconcile.Result, error) {
	job := w.job
	if w.stale {
		return ctrlkit.NoRequeue()
	}
	before := job.Status.DeepCopy()
	var total batchv1.TaskCounts
	var want int32
	lagging, waiting := false, false
	summaries := make([]batchv1.GroupSummary, 0, len(job.Spec.TaskGroups))
	for _, tmpl := range job.Spec.TaskGroups {
		s := batchv1.GroupSummary{Name: tmpl.Name, Phase: batchv1.GroupPending, Desired: tmpl.Count}
		g := w.groups[groupName(job.Name, tmpl.Name)]
		// A group whose status lags its spec (just created, or its count
		// just changed) counts what it has, but the job cannot end on it:
		// counts that lag in opposite directions could add up to want.
		if g == nil || g.Status.ObservedGeneration != g.Generation || g.Spec.Count != tmpl.Count || g.Spec.PerNode != tmpl.PerNode {
			lagging = true
		}
		if g != nil && g.Status.Phase != "" {
			s.Phase, s.Counts = g.Status.Phase, g.Status.Counts
			if tmpl.PerNode {
				s.Desired = g.Status.Desired
			}
		}
		// A perNode group wants as many tasks as nodes match: the job
		// ends only once that group has (it waits while none match).
		if tmpl.PerNode && !s.Phase.Final() {
			waiting = true
		}
		want += s.Desired
		addCounts(&total, s.Counts)
		summaries = append(summaries, s)
	}
	st := &job.Status
	st.Counts = total
	st.Groups = summaries
	st.Desired = want
	st.Phase = phaseOf(total, want, before.Phase, false)
	if (lagging || waiting) && st.Phase.Final() {
		// Written once the groups have caught up (their status brings
		// us back): a final phase is kept for good (settled).
		st.Phase = batchv1.GroupRunning
		if before.Phase == "" || before.Phase == batchv1.GroupPending {
			st.Phase = batchv1.GroupPending
		}
	}
	st.ObservedGeneration = job.Generation
	now := clock.Or(w.r.Clock).Now()
	setPhaseConditions(&st.Conditions, st.Phase, completeCondition(st.Phase, total, want, job.Generation, "tasks"), now)
	refusedMsg := w.refusedMessage()
	newRefusal := setCreateFailed(&st.Conditions, refusedMsg, job.Generation, now)
	if equality.Semantic.DeepEqual(before, st) {
		return w.requeue()
	}
	if err := w.r.Client.Status().Update(ctx, job); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return ctrlkit.Exit() // the newer version brings us back
		}
		return ctrlkit.RequeueIfErrorAndWrap("update FleetJob status", err)
	}
	if before.Phase != st.Phase {
		log.FromContext(ctx).Info("fleet job phase", "phase", st.Phase, "total", total.Total, "completed", total.Completed, "failed", total.Failed)
	}
	if newRefusal && w.r.Recorder != nil {
		w.r.Recorder.Eventf(job, nil, corev1.EventTypeWarning, ReasonFailedCreate, "CreateTaskGroup", "%s", refusedMsg)
	}
	phaseEvent(w.r.Recorder, job, before.Phase, st.Phase, st.Conditions)
	return w.requeue()
}

// refusedMessage is the job's CreateFailed message: the groups the API
// refused, else the first of its groups whose tasks it refused; "" if none.
func (w *jobRun) refusedMessage() string {
	if len(w.refused) > 0 {
		return createFailedMessage(w.refused)
	}
	for _, tmpl := range w.job.Spec.TaskGroups {
		name := groupName(w.job.Name, tmpl.Name)
		if g := w.groups[name]; g != nil {
			if c := meta.FindStatusCondition(g.Status.Conditions, ConditionCreateFailed); c != nil && c.Status == metav1.ConditionTrue {
				return "TaskGroup " + name + ": " + c.Message
			}
		}
	}
	return ""
}

// requeue asks again after CreateRetry if the API refused some groups
// (their tasks' refusals are the groups' to retry).
func (w *jobRun) requeue() (reconcile.Result, error) {
	if len(w.refused) > 0 {
		return ctrlkit.RequeueAfter(w.r.CreateRetry)
	}
	return ctrlkit.NoRequeue()
}
