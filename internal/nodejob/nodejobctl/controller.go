package nodejobctl

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/kname"
	"github.com/drover-fleet/drover/internal/nodejob"
	"github.com/drover-fleet/drover/pkg/ctrlkit"
)

// Reconciler runs one kind of node job. T is *opsv1.NodeUpgradeJob or
// *opsv1.ImagePrePullJob.
type Reconciler[T opsv1.NodeJob] struct {
	Client client.Client
	// APIReader reads a slice afresh after a write conflict. Default: Client.
	APIReader client.Reader
	Recorder  events.EventRecorder
	// New returns an empty job of the kind.
	New func() T
	// Clock; nil = the real one.
	Clock clock.Clock
}

// +kubebuilder:rbac:groups=operations.drover.io,resources=nodeupgradejobs;imageprepulljobs,verbs=get;list;watch
// +kubebuilder:rbac:groups=operations.drover.io,resources=nodeupgradejobs/status;imageprepulljobs/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=operations.drover.io,resources=nodetaskslices,verbs=get;list;watch;create;update;patch;delete

// SetupWithManager registers the controller; it also indexes nothing and
// watches the job's slices through their owner reference.
func (r *Reconciler[T]) SetupWithManager(mgr ctrl.Manager) error {
	r.Clock = clock.Or(r.Clock)
	if r.APIReader == nil {
		r.APIReader = r.Client
	}
	job := r.New()
	return ctrl.NewControllerManagedBy(mgr).
		Named(lower(job.JobKind())).
		For(job).
		Watches(&opsv1.NodeTaskSlice{}, handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(), job, handler.OnlyControllerOwner())).
		Complete(r)
}

func lower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// Reconcile implements reconcile.Reconciler. It is wired by hand, not the
// generated NodeUpgradeJobManagerReconciler: one generic reconciler serves
// both kinds, and a job that is gone still has its slices deleted (the
// generated Reconcile stops at NotFound).
func (r *Reconciler[T]) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	job := r.New()
	if err := r.Client.Get(ctx, req.NamespacedName, job); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, r.deleteStaleSlices(ctx, job.JobKind(), req.Name, "")
		}
		return ctrl.Result{}, err
	}
	w := &run[T]{r: r, job: job, now: r.Clock.Now()}
	m, err := newManager(r.Client, job, w)
	if err != nil {
		return ctrl.Result{}, err
	}
	wf := ctrlkit.Optimize(Workflow(m, job))
	// Each action's outcome and duration, at debug level (--log-level debug).
	wf = ctrlkit.Instrument(wf, ctrlkit.InstrumentOptions{Observer: ctrlkit.LogObserver{Level: 1}})
	return ctrlkit.Reconcile(ctx, wf)
}

// Actions are the actions nodejob.ctrlkit declares, which the generated
// managers of both kinds offer.
type Actions interface {
	DeleteStaleSlices() ctrlkit.Action
	ResolveNodes() ctrlkit.Action
	CreateSlices() ctrlkit.Action
	LoadSlices() ctrlkit.Action
	StepNodes() ctrlkit.Action
	UpdateStatus() ctrlkit.Action
	RequeueForTimeouts() ctrlkit.Action
}

var (
	_ Actions = (*NodeUpgradeJobManager)(nil)
	_ Actions = (*ImagePrePullJobManager)(nil)
)

// Workflow is the controller's workflow for job:
//
//   - the slices of an earlier job of the same name go first, whatever the
//     phase: a job deleted and re-created with the same name starts clean,
//     whether or not a garbage collector runs;
//   - a final job stops there (a late report may still change a slice; it
//     never moves the phase);
//   - a new job (no phase) resolves its nodes, creates its slices with the
//     first admission in them and goes to Init;
//   - a running one loads its slices, steps them and writes the status.
//
// Sequential, because each step works on what the one before found. The
// requeue for the next node that may time out is joined beside it, so it
// applies whatever the sequence ended with (a requeue on a status conflict,
// an exit), except an error, which controller-runtime retries anyway.
func Workflow(m Actions, job opsv1.NodeJob) ctrlkit.Action {
	phase := job.JobStatus().Phase
	return ctrlkit.JoinOrdered(
		ctrlkit.Sequential(
			m.DeleteStaleSlices(),
			ctrlkit.ExitIf(phase.Final()),
			ctrlkit.IfElse(phase == "",
				ctrlkit.Sequential(m.ResolveNodes(), m.CreateSlices(), m.UpdateStatus()),
				ctrlkit.Sequential(m.LoadSlices(), m.StepNodes(), m.UpdateStatus()),
			),
		),
		m.RequeueForTimeouts(),
	)
}

// newManager returns the generated manager of job's kind running w.
func newManager[T opsv1.NodeJob](c client.Reader, job T, w *run[T]) (Actions, error) {
	switch j := any(job).(type) {
	case *opsv1.NodeUpgradeJob:
		return NewNodeUpgradeJobManager(NewNodeUpgradeJobManagerState(c, j.DeepCopy()), any(w).(NodeUpgradeJobManagerImpl)), nil
	case *opsv1.ImagePrePullJob:
		return NewImagePrePullJobManager(NewImagePrePullJobManagerState(c, j.DeepCopy()), any(w).(ImagePrePullJobManagerImpl)), nil
	}
	return nil, fmt.Errorf("node job controller: no ctrlkit manager for %T; declare one in nodejob.ctrlkit", job)
}

// DeleteStaleSlices implements the managers' Impl.
func (w *run[T]) DeleteStaleSlices(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	return ctrlkit.RequeueIfError(w.r.deleteStaleSlices(ctx, w.job.JobKind(), w.job.GetName(), w.job.GetUID()))
}

// RequeueForTimeouts implements the managers' Impl: the step or the first
// admission said when the next node may time out.
func (w *run[T]) RequeueForTimeouts(context.Context, logr.Logger) (reconcile.Result, error) {
	return ctrlkit.RequeueAfter(w.recheck)
}

// deleteStaleSlices deletes the slices of job kind/name whose job uid is
// not keep ("" = all of them).
func (r *Reconciler[T]) deleteStaleSlices(ctx context.Context, kind, name string, keep types.UID) error {
	var list opsv1.NodeTaskSliceList
	if err := r.Client.List(ctx, &list, client.MatchingLabels{opsv1.LabelJobKind: kind, opsv1.LabelJobName: kname.LabelValue(name)}); err != nil {
		return fmt.Errorf("list slices of %s %s: %w", kind, name, err)
	}
	for i := range list.Items {
		s := &list.Items[i]
		if s.Job.Name != name || s.Job.UID == keep {
			continue
		}
		if err := r.Client.Delete(ctx, s); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("delete stale NodeTaskSlice %s: %w", s.Name, err)
		}
	}
	return nil
}

// run is one reconcile of one job; its actions share these fields.
type run[T opsv1.NodeJob] struct {
	r   *Reconciler[T]
	job T
	now time.Time

	targets []opsv1.NodeTaskStatus       // Init: the initial entries
	nodes   map[string]nodejob.NodeState // Init: the FleetNodes, for admission
	slices  []opsv1.NodeTaskSlice
	recheck time.Duration
}

// ResolveNodes implements the managers' Impl.
func (w *run[T]) ResolveNodes(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	names, sel := w.job.Target()
	var list fleetv1.FleetNodeList
	// Read only: a deep copy of every FleetNode per reconcile was most of
	// the manager's CPU in a 2,000-node job.
	if err := w.r.Client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return ctrlkit.RequeueIfErrorAndWrap("list FleetNodes", err)
	}
	byName := make(map[string]bool, len(list.Items))
	w.nodes = nodeStates(list.Items)
	for _, n := range list.Items {
		byName[n.Name] = true
	}
	pending := func(name string) opsv1.NodeTaskStatus {
		return opsv1.NodeTaskStatus{NodeName: name, Phase: opsv1.NodeTaskPhasePending}
	}
	switch {
	case len(names) > 0:
		for _, name := range names {
			e := pending(name)
			if !byName[name] {
				// Recorded, not dropped: the operator asked for this node.
				e.Phase, e.Reason = opsv1.NodeTaskPhaseFailure, fmt.Sprintf("FleetNode %s does not exist", name)
				t := metav1.NewMicroTime(w.now.Truncate(time.Microsecond))
				e.UpdateTime = &t
			}
			w.targets = append(w.targets, e)
		}
	case sel != nil:
		s, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil {
			return ctrlkit.RequeueIfErrorAndWrap("labelSelector", err)
		}
		for _, n := range list.Items {
			if s.Matches(labels.Set(n.Labels)) {
				w.targets = append(w.targets, pending(n.Name))
			}
		}
	}
	sort.Slice(w.targets, func(i, j int) bool { return w.targets[i].NodeName < w.targets[j].NodeName })
	return ctrlkit.NoRequeue()
}

// CreateSlices writes the job's NodeTaskSlices with the first admission
// already in them: the nodes that fit within concurrency are InProgress
// from the start, so the hubs dispatch them when the slices appear, instead
// of one more round of writes to every slice. Slices that already exist
// (an earlier reconcile created them and the cache has not seen the job's
// Init status yet, or it stopped half-way) are kept as they are.
func (w *run[T]) CreateSlices(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	kind := w.job.JobKind()
	per := nodejob.NodesPerSlice(w.job.ImageCount())
	var fresh []int // indexes into w.slices of the slices to create
	for i := 0; i*per < len(w.targets); i++ {
		name := nodejob.SliceName(kind, w.job.GetName(), w.job.GetUID(), i)
		var old opsv1.NodeTaskSlice
		err := w.r.Client.Get(ctx, client.ObjectKey{Name: name}, &old)
		switch {
		case err == nil && old.Job.UID == w.job.GetUID():
			w.slices = append(w.slices, old)
			continue
		case err != nil && !apierrors.IsNotFound(err):
			return ctrlkit.RequeueIfErrorAndWrap("get NodeTaskSlice "+name, err)
		}
		part := w.targets[i*per : min((i+1)*per, len(w.targets))]
		s := opsv1.NodeTaskSlice{
			ObjectMeta: metav1.ObjectMeta{
				Name: name,
				Labels: map[string]string{
					opsv1.LabelJobKind: kind,
					opsv1.LabelJobName: kname.LabelValue(w.job.GetName()),
					opsv1.LabelJobUID:  string(w.job.GetUID()),
				},
			},
			Job:   opsv1.JobReference{Kind: kind, Name: w.job.GetName(), UID: w.job.GetUID()},
			Nodes: part,
		}
		if err := controllerutil.SetControllerReference(w.job, &s, w.r.Client.Scheme()); err != nil {
			return ctrlkit.RequeueIfErrorAndWrap("owner reference", err)
		}
		fresh = append(fresh, len(w.slices))
		w.slices = append(w.slices, s)
	}
	if len(fresh) == 0 {
		return ctrlkit.NoRequeue()
	}
	// The first admission, over every entry (those of existing slices
	// count towards concurrency); only the new slices take its changes.
	res := w.step(w.entries(), w.nodes)
	w.recheck = res.RecheckAfter
	at := map[string]*opsv1.NodeTaskStatus{}
	for _, i := range fresh {
		for j := range w.slices[i].Nodes {
			at[w.slices[i].Nodes[j].NodeName] = &w.slices[i].Nodes[j]
		}
	}
	for _, c := range res.Changes {
		if e := at[c.From.NodeName]; e != nil {
			c.Apply(e)
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(sliceWriters)
	for _, i := range fresh {
		g.Go(func() error {
			s := w.slices[i].DeepCopy()
			if err := w.r.Client.Create(gctx, s); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("create NodeTaskSlice %s: %w", s.Name, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return ctrlkit.RequeueIfError(err)
	}
	return ctrlkit.NoRequeue()
}

// nodeStates is what Step needs of each FleetNode.
func nodeStates(items []fleetv1.FleetNode) map[string]nodejob.NodeState {
	out := make(map[string]nodejob.NodeState, len(items))
	for _, n := range items {
		out[n.Name] = nodejob.NodeState{Exists: true, Phase: string(n.Status.Phase), Hub: n.Status.Hub}
	}
	return out
}

// step runs nodejob.Step over entries with the job's knobs.
func (w *run[T]) step(entries []opsv1.NodeTaskStatus, nodes map[string]nodejob.NodeState) nodejob.Result {
	exec := w.job.Execution()
	return nodejob.Step(w.now, nodejob.Inputs{
		Concurrency: int(max(exec.Concurrency, 1)),
		Timeout:     time.Duration(max(exec.TimeoutSeconds, 1)) * time.Second,
		Aborted:     w.job.Aborted(),
	}, entries, nodes)
}

// LoadSlices implements the managers' Impl.
func (w *run[T]) LoadSlices(_ context.Context, _ logr.Logger, slices []opsv1.NodeTaskSlice) (reconcile.Result, error) {
	if int32(len(slices)) < w.job.JobStatus().Slices {
		// The cache has not seen every slice created at Init yet; counting
		// now would miss nodes.
		return ctrlkit.RequeueAfter(200 * time.Millisecond)
	}
	w.slices = slices
	sort.Slice(w.slices, func(i, j int) bool { return w.slices[i].Name < w.slices[j].Name })
	return ctrlkit.NoRequeue()
}

func (w *run[T]) entries() []opsv1.NodeTaskStatus {
	var out []opsv1.NodeTaskStatus
	for _, s := range w.slices {
		out = append(out, s.Nodes...)
	}
	return out
}

// StepNodes implements the managers' Impl.
func (w *run[T]) StepNodes(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	entries := w.entries()
	// Step reads the FleetNodes only to admit or fail Pending nodes; once
	// every node has started, reconciles (one per slice write) skip them.
	var nodes map[string]nodejob.NodeState
	if slices.ContainsFunc(entries, func(e opsv1.NodeTaskStatus) bool { return e.Phase == opsv1.NodeTaskPhasePending }) {
		var list fleetv1.FleetNodeList
		if err := w.r.Client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
			return ctrlkit.RequeueIfErrorAndWrap("list FleetNodes", err)
		}
		nodes = nodeStates(list.Items)
	}
	res := w.step(entries, nodes)
	w.recheck = res.RecheckAfter
	if len(res.Changes) == 0 {
		return ctrlkit.NoRequeue()
	}
	bySlice := map[string][]nodejob.Change{}
	where := map[string]string{}
	for _, s := range w.slices {
		for _, e := range s.Nodes {
			where[e.NodeName] = s.Name
		}
	}
	for _, c := range res.Changes {
		bySlice[where[c.From.NodeName]] = append(bySlice[where[c.From.NodeName]], c)
	}
	// Slices are independent objects: admitting a 10,000-node job touches
	// all of them, and one write at a time took seconds.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(sliceWriters)
	for i := range w.slices {
		changes := bySlice[w.slices[i].Name]
		if len(changes) == 0 {
			continue
		}
		g.Go(func() error {
			updated, err := w.writeSlice(gctx, w.slices[i], changes)
			if err != nil {
				return fmt.Errorf("update NodeTaskSlice %s: %w", w.slices[i].Name, err)
			}
			w.slices[i] = updated
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return ctrlkit.RequeueIfError(err)
	}
	return ctrlkit.NoRequeue()
}

// sliceWriters bounds the slice writes of one reconcile in flight at once.
const sliceWriters = 8

// writeSlice applies changes to slice, re-reading it on a conflict: an
// entry a hub changed meanwhile keeps the hub's version.
func (w *run[T]) writeSlice(ctx context.Context, s opsv1.NodeTaskSlice, changes []nodejob.Change) (opsv1.NodeTaskSlice, error) {
	first := true
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if !first {
			if err := w.r.APIReader.Get(ctx, client.ObjectKeyFromObject(&s), &s); err != nil {
				return err
			}
		}
		first = false
		applied := false
		for _, c := range changes {
			for j := range s.Nodes {
				if s.Nodes[j].NodeName == c.From.NodeName && c.Apply(&s.Nodes[j]) {
					applied = true
				}
			}
		}
		if !applied {
			return nil
		}
		return w.r.Client.Update(ctx, &s)
	})
	return s, err
}

// UpdateStatus implements the managers' Impl.
func (w *run[T]) UpdateStatus(ctx context.Context, logger logr.Logger) (reconcile.Result, error) {
	st := w.job.JobStatus()
	before := st.DeepCopy()
	entries := w.entries()
	counts := nodejob.Count(entries)
	exec := w.job.Execution()
	v := nodejob.Phase(counts, exec.FailureTolerate)
	initializing := st.Phase == ""
	phase := v.Phase
	switch {
	case initializing && v.Phase != opsv1.JobPhaseFailure:
		phase = opsv1.JobPhaseInit
	case w.job.Aborted() && (v.Phase == opsv1.JobPhaseCompleted || v.Phase == opsv1.JobPhaseFailure):
		phase, v.Reason, v.Message = opsv1.JobPhaseFailure, opsv1.ReasonAborted, "aborted by an operator; "+v.Message
	}
	st.Phase = phase
	st.Counts = counts
	st.Failures = nodejob.Failures(entries, opsv1.MaxFailuresOnJob)
	st.Slices = int32(len(w.slices))
	st.ObservedGeneration = w.job.GetGeneration()
	now := metav1.NewTime(w.now.Truncate(time.Second))
	if st.StartTime == nil {
		st.StartTime = &now
	}
	if phase.Final() {
		st.CompletionTime = &now
		failed := phase == opsv1.JobPhaseFailure
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: opsv1.ConditionFailed, Status: cond(failed), Reason: v.Reason, Message: v.Message, ObservedGeneration: st.ObservedGeneration, LastTransitionTime: now})
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: opsv1.ConditionComplete, Status: cond(!failed), Reason: v.Reason, Message: v.Message, ObservedGeneration: st.ObservedGeneration, LastTransitionTime: now})
	}
	if equalStatus(before, st) {
		return ctrlkit.NoRequeue()
	}
	if err := w.r.Client.Status().Update(ctx, w.job); err != nil {
		if apierrors.IsConflict(err) {
			return ctrlkit.RequeueImmediately()
		}
		if apierrors.IsNotFound(err) {
			return ctrlkit.Exit()
		}
		return ctrlkit.RequeueIfErrorAndWrap("update status", err)
	}
	logger.Info("node job status", "phase", phase, "total", counts.Total, "successful", counts.Successful, "failed", counts.Failure, "unknown", counts.Unknown)
	w.events(before.Phase, phase, v)
	return ctrlkit.NoRequeue()
}

func (w *run[T]) events(from, to opsv1.JobPhase, v nodejob.Verdict) {
	rec := w.r.Recorder
	if rec == nil || from == to {
		return
	}
	if from == "" && v.ToleranceErr != nil {
		rec.Eventf(w.job, nil, corev1.EventTypeWarning, opsv1.ReasonInvalidFailureTolerate, "Init", "%v", v.ToleranceErr)
	}
	switch to {
	case opsv1.JobPhaseInit:
		c := w.job.JobStatus().Counts
		rec.Eventf(w.job, nil, corev1.EventTypeNormal, "Initialized", "Init", "%d nodes in %d NodeTaskSlices", c.Total, len(w.slices))
	case opsv1.JobPhaseCompleted:
		rec.Eventf(w.job, nil, corev1.EventTypeNormal, v.Reason, "Complete", "%s", v.Message)
	case opsv1.JobPhaseFailure:
		rec.Eventf(w.job, nil, corev1.EventTypeWarning, v.Reason, "Fail", "%s", v.Message)
	}
}

func cond(b bool) metav1.ConditionStatus {
	if b {
		return metav1.ConditionTrue
	}
	return metav1.ConditionFalse
}

func equalStatus(a, b *opsv1.NodeJobStatus) bool {
	x, y := a.DeepCopy(), b.DeepCopy()
	// Times are set only when something else changes.
	x.StartTime, y.StartTime = nil, nil
	x.CompletionTime, y.CompletionTime = nil, nil
	if len(x.Conditions) != len(y.Conditions) || x.Phase != y.Phase || x.Counts != y.Counts || x.Slices != y.Slices || x.ObservedGeneration != y.ObservedGeneration || len(x.Failures) != len(y.Failures) {
		return false
	}
	for i := range x.Failures {
		if x.Failures[i] != y.Failures[i] {
			return false
		}
	}
	return a.StartTime != nil
}
