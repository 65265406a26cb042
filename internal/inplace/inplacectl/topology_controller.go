package inplacectl

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
	"github.com/drover-fleet/drover/internal/inplace"
	"github.com/drover-fleet/drover/pkg/ctrlkit"
)

// TopologyReconciler turns template changes of autoUpdate pools into
// ExternalUpdateRequests (the seed's Topology controller).
type TopologyReconciler struct{ Options }

// +kubebuilder:rbac:groups=update.drover.io,resources=nodepools,verbs=get;list;watch
// +kubebuilder:rbac:groups=update.drover.io,resources=externalupdaterequests,verbs=get;list;watch;create
// +kubebuilder:rbac:groups=update.drover.io,resources=externalupdaterequests/status,verbs=patch
// +kubebuilder:rbac:groups=update.drover.io,resources=inplaceupdateplans,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=fleet.drover.io,resources=fleetnodes,verbs=get;list;watch;patch

// SetupWithManager registers the controller on NodePools (a node joining
// a pool does not make a new request: the running plan's pool picks it).
func (r *TopologyReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	return ctrl.NewControllerManagedBy(mgr).Named("nodepool-topology").
		For(&updatev1.NodePool{}).
		Complete(r.generated())
}

// Reconcile implements reconcile.Reconciler.
func (r *TopologyReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	return r.generated().Reconcile(ctx, req)
}

func (r *TopologyReconciler) generated() *TopologyManagerReconciler {
	return &TopologyManagerReconciler{
		Client: r.Client,
		NewImpl: func(c client.Client, p *updatev1.NodePool) TopologyManagerImpl {
			return &topologyImpl{Options: r.Options, pool: p}
		},
		Workflow: func(m *TopologyManager, p *updatev1.NodePool) ctrlkit.Action {
			return ctrlkit.Sequential(ctrlkit.ExitIf(!p.Spec.AutoUpdate || p.DeletionTimestamp != nil), m.RequestUpdate(), m.SupersedeOlder())
		},
		Observer: r.Observer,
	}
}

type topologyImpl struct {
	Options
	pool     *updatev1.NodePool
	revision string
}

var _ TopologyManagerImpl = (*topologyImpl)(nil)

// RequestName names the update request of pool at revision: one per
// template revision, so a request is made once however often the pool is
// reconciled.
func RequestName(pool, revision string) string {
	if len(pool) > 200 {
		pool = pool[:200]
	}
	return pool + "-" + revision
}

// RequestUpdate implements TopologyManagerImpl.
func (i *topologyImpl) RequestUpdate(ctx context.Context, logger logr.Logger) (reconcile.Result, error) {
	i.revision = inplace.Revision(i.pool.Spec.Template)
	name := RequestName(i.pool.Name, i.revision)
	var existing updatev1.ExternalUpdateRequest
	err := i.reader().Get(ctx, client.ObjectKey{Name: name}, &existing)
	if err == nil {
		return ctrlkit.NoRequeue()
	}
	if !apierrors.IsNotFound(err) {
		return ctrlkit.RequeueIfErrorAndWrap("get update request", err)
	}
	sel, err := metav1.LabelSelectorAsSelector(&i.pool.Spec.Selector)
	if err != nil {
		return ctrlkit.RequeueIfErrorAndWrap("pool "+i.pool.Name+" selector", reconcile.TerminalError(err))
	}
	var all fleetv1.FleetNodeList
	if err := i.Client.List(ctx, &all, client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return ctrlkit.RequeueIfErrorAndWrap("list nodes", err)
	}
	facts := map[string]inplace.NodeFacts{}
	for _, n := range all.Items {
		if n.Labels[updatev1.LabelPoolRevision] == i.revision {
			continue
		}
		facts[n.Name] = inplace.NodeFacts{AgentVersion: n.Status.AgentVersion}
	}
	change := inplace.PoolChangeSet(i.pool.Spec.Template, facts)
	need := map[string]bool{}
	for _, n := range change.Nodes {
		need[n] = true
	}
	// Nodes already at the target need nothing: they are at the new
	// revision as they are (the seed: only the rest update).
	for idx := range all.Items {
		n := &all.Items[idx]
		if _, ok := facts[n.Name]; !ok || need[n.Name] {
			continue
		}
		before := n.DeepCopy()
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels[updatev1.LabelPoolRevision] = i.revision
		if err := i.Client.Patch(ctx, n, client.MergeFrom(before)); err != nil {
			return ctrlkit.RequeueIfErrorAndWrap("label node "+n.Name+" at the new revision", err)
		}
	}
	req := &updatev1.ExternalUpdateRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{updatev1.LabelPool: i.pool.Name}},
		Spec:       updatev1.ExternalUpdateRequestSpec{Pool: i.pool.Name, Revision: i.revision, Nodes: int32(len(change.Nodes))},
	}
	for _, c := range change.Changes {
		req.Spec.Changes = append(req.Spec.Changes, updatev1.Responsibility{Path: c.Path, SelectResource: c.SelectResource, Value: c.Value})
	}
	if err := controllerutil.SetControllerReference(i.pool, req, i.Client.Scheme()); err != nil {
		return ctrlkit.RequeueIfErrorAndWrap("own update request", err)
	}
	if err := i.Client.Create(ctx, req); err != nil && !apierrors.IsAlreadyExists(err) {
		return ctrlkit.RequeueIfErrorAndWrap("create update request", err)
	}
	logger.Info("template changed: update request made", "request", name, "nodes", len(change.Nodes), "changes", len(change.Changes))
	i.event(i.pool, corev1.EventTypeNormal, "UpdateRequested",
		fmt.Sprintf("template revision %s changes %d path(s) on %d node(s): ExternalUpdateRequest %s asks the updaters", i.revision, len(change.Changes), len(change.Nodes), name))
	return ctrlkit.NoRequeue()
}

// SupersedeOlder implements TopologyManagerImpl.
func (i *topologyImpl) SupersedeOlder(ctx context.Context, logger logr.Logger) (reconcile.Result, error) {
	var reqs updatev1.ExternalUpdateRequestList
	if err := i.Client.List(ctx, &reqs, client.MatchingLabels{updatev1.LabelPool: i.pool.Name}); err != nil {
		return ctrlkit.RequeueIfErrorAndWrap("list update requests", err)
	}
	for idx := range reqs.Items {
		r := &reqs.Items[idx]
		if r.Spec.Revision == i.revision || r.Spec.Pool != i.pool.Name {
			continue
		}
		switch r.Status.Phase {
		case updatev1.RequestFailed, updatev1.RequestUpdated, updatev1.RequestSuperseded:
			continue
		case updatev1.RequestPlanned:
			// A newer change while its plan runs: abort that plan; the
			// new one waits until it has ended (the plan controller).
			if err := i.abortPlan(ctx, logger, r.Status.Plan); err != nil {
				return ctrlkit.RequeueIfErrorAndWrap("abort superseded plan", err)
			}
			continue
		}
		before := r.DeepCopy()
		r.Status.Phase = updatev1.RequestSuperseded
		setCondition(&r.Status.Conditions, "Ready", "False", updatev1.ReasonSuperseded, "the pool's template changed again (revision "+i.revision+") before this request was planned", r.Generation)
		if err := i.Client.Status().Patch(ctx, r, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			return requeueOnConflict(err)
		}
	}
	return ctrlkit.NoRequeue()
}

func (i *topologyImpl) abortPlan(ctx context.Context, logger logr.Logger, name string) error {
	if name == "" {
		return nil
	}
	var p updatev1.InPlaceUpdatePlan
	if err := i.Client.Get(ctx, client.ObjectKey{Name: name}, &p); err != nil {
		return client.IgnoreNotFound(err)
	}
	if p.Status.UpdateStatus.Done() || p.Spec.UpdatePhase == updatev1.PhaseAborting {
		return nil
	}
	before := p.DeepCopy()
	p.Spec.UpdatePhase = updatev1.PhaseAborting
	if err := i.Client.Patch(ctx, &p, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("abort plan %s: %w", name, err)
	}
	logger.Info("newer template: aborting the running plan", "plan", name, "revision", i.revision)
	i.event(&p, corev1.EventTypeNormal, "Superseded", "pool "+i.pool.Name+"'s template changed again (revision "+i.revision+"): aborting; the next plan starts once this one ended")
	return nil
}
