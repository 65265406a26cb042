package fleetnodectl

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/pkg/ctrlkit"
)

// Reconciler reconciles FleetNodes. The actions are declared in
// fleetnode.ctrlkit and implemented by impl; the generated
// FleetNodeManagerReconciler runs them as Workflow assembles them.
type Reconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	// Clock is the time source; nil = the wall clock.
	Clock clock.Clock
	// Observer, if set, sees every action of the workflow (see
	// ctrlkit.Instrument).
	Observer ctrlkit.Observer
}

// +kubebuilder:rbac:groups=fleet.drover.io,resources=fleetnodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=fleet.drover.io,resources=fleetnodes/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SetupWithManager registers the controller.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return r.generated().SetupWithManager(mgr)
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	return r.generated().Reconcile(ctx, req)
}

func (r *Reconciler) generated() *FleetNodeManagerReconciler {
	now := clock.Or(r.Clock).Now
	return &FleetNodeManagerReconciler{
		Client: r.Client,
		NewImpl: func(c client.Client, n *fleetv1.FleetNode) FleetNodeManagerImpl {
			return &impl{client: c, recorder: r.Recorder, now: now, node: n}
		},
		Workflow: func(m *FleetNodeManager, _ *fleetv1.FleetNode) ctrlkit.Action { return Workflow(m) },
		Observer: r.Observer,
	}
}

// Workflow is the controller's workflow: write the node's labels (and the
// approval of a node approved by hand), decide and write the status, then
// announce the decision. Sequential, so that the status is decided on the
// approval just recorded, and a failed or conflicting status patch records
// no Event: the retry will.
func Workflow(m *FleetNodeManager) ctrlkit.Action {
	return ctrlkit.Sequential(m.UpdateNode(), m.UpdateStatus(), m.RecordEvent())
}

// impl implements FleetNodeManagerImpl for one reconcile of node: the
// actions share the decision UpdateStatus makes.
type impl struct {
	client   client.Client
	recorder events.EventRecorder
	now      func() time.Time

	node     *fleetv1.FleetNode
	decision Decision
}

var _ FleetNodeManagerImpl = (*impl)(nil)

// UpdateNode implements FleetNodeManagerImpl.
func (i *impl) UpdateNode(ctx context.Context, logger logr.Logger) (reconcile.Result, error) {
	before := i.node.DeepCopy()
	if !DecideNode(i.node) {
		return ctrlkit.NoRequeue()
	}
	// The optimistic lock keeps an operator's concurrent approval or label
	// edit from being overwritten by what was decided without it.
	if err := i.client.Patch(ctx, i.node, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrlkit.Exit()
		}
		if apierrors.IsConflict(err) {
			logger.V(1).Info("node changed under us; deciding again")
			return ctrlkit.RequeueImmediately()
		}
		return ctrlkit.RequeueIfErrorAndWrap("patch node", err)
	}
	logger.Info("node labels follow the approved ones", "labels", i.node.Labels, "approvedCapacity", i.node.Spec.ApprovedCapacity)
	return ctrlkit.NoRequeue()
}

// UpdateStatus implements FleetNodeManagerImpl.
func (i *impl) UpdateStatus(ctx context.Context, logger logr.Logger) (reconcile.Result, error) {
	before := i.node.DeepCopy()
	i.decision = Decide(i.node, i.now())
	if !i.decision.Changed {
		return ctrlkit.NoRequeue()
	}
	// The optimistic lock keeps a hub's concurrent write (Ready, a claim)
	// from being overwritten: conditions are one list in a merge patch.
	if err := i.client.Status().Patch(ctx, i.node, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsNotFound(err) {
			// Deleted meanwhile: nothing to announce.
			return ctrlkit.Exit()
		}
		if apierrors.IsConflict(err) {
			// A hub wrote the node meanwhile; decide again on the fresh object
			// without logging an error for an expected race.
			logger.V(1).Info("status changed under us; deciding again")
			return ctrlkit.RequeueImmediately()
		}
		return ctrlkit.RequeueIfErrorAndWrap("patch status", err)
	}
	logger.Info("node status decided", "phase", i.node.Status.Phase, "events", len(i.decision.Events))
	return ctrlkit.NoRequeue()
}

// RecordEvent implements FleetNodeManagerImpl.
func (i *impl) RecordEvent(context.Context, logr.Logger) (reconcile.Result, error) {
	if i.recorder == nil {
		return ctrlkit.NoRequeue()
	}
	for _, e := range i.decision.Events {
		i.recorder.Eventf(i.node, nil, e.Type, e.Reason, "Reconcile", "%s", e.Note)
	}
	return ctrlkit.NoRequeue()
}
