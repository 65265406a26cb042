package fleetnodectl

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/pkg/ctrlkit"
)

// Reconciler reconciles FleetNodes. The actions are declared in
// fleetnode.ctrlkit and implemented by impl; Reconcile runs them as
// Workflow assembles them.
type Reconciler struct {
	Client client.Client
	// APIReader reads hub Leases, uncached.
	APIReader client.Reader
	Recorder  events.EventRecorder
	// Namespace holds hub Leases.
	Namespace string
	// OfflineTimeout after a hub's Lease lapses, its nodes are Offline.
	OfflineTimeout time.Duration
	// Now is the clock; nil = time.Now.
	Now func() time.Time
	// Observer, if set, sees every action of the workflow (see
	// ctrlkit.Instrument).
	Observer ctrlkit.Observer
}

// +kubebuilder:rbac:groups=fleet.drover.io,resources=fleetnodes,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=fleet.drover.io,resources=fleetnodes/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SetupWithManager registers the controller.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Now == nil {
		r.Now = time.Now
	}
	return ctrl.NewControllerManagedBy(mgr).For(&fleetv1.FleetNode{}).Named("fleetnode").Complete(r)
}

// Workflow is the controller's workflow: decide and write the status, then
// announce the decision and schedule the next look. Sequential, so that a
// failed or conflicting status patch records no Event: the retry will.
func Workflow(m *FleetNodeManager) ctrlkit.Action {
	return ctrlkit.Sequential(m.UpdateStatus(), m.RecordEvent(), m.RequeueForRecheck())
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var n fleetv1.FleetNode
	if err := r.Client.Get(ctx, req.NamespacedName, &n); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	// The state loaders get their own copy: UpdateStatus changes n in
	// memory before the patch.
	state := NewFleetNodeManagerState(hubLeaseReader{Reader: r.APIReader, namespace: r.Namespace}, n.DeepCopy())
	wf := Workflow(NewFleetNodeManager(state, r.newImpl(&n)))
	if r.Observer != nil {
		wf = ctrlkit.Instrument(wf, ctrlkit.InstrumentOptions{Observer: r.Observer})
	}
	return ctrlkit.IgnoreExit(wf.Run(ctx))
}

func (r *Reconciler) newImpl(n *fleetv1.FleetNode) *impl {
	now := r.Now
	if now == nil {
		now = time.Now
	}
	return &impl{client: r.Client, recorder: r.Recorder, offlineTimeout: r.OfflineTimeout, now: now, node: n}
}

// hubLeasePrefix is the name of a hub's Lease without the hub's name.
const hubLeasePrefix = "drover-hub-"

// hubLeaseReader reads hub Leases for the generated state loaders. A
// FleetNode is cluster-scoped, so the loaders ask in no namespace; the
// Leases live in namespace. A node with no hub has no Lease, and the API is
// not asked for "drover-hub-".
type hubLeaseReader struct {
	client.Reader
	namespace string
}

func (h hubLeaseReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*coordinationv1.Lease); ok {
		if key.Name == hubLeasePrefix {
			return apierrors.NewNotFound(coordinationv1.Resource("leases"), key.Name)
		}
		key.Namespace = h.namespace
	}
	return h.Reader.Get(ctx, key, obj, opts...)
}

// impl implements FleetNodeManagerImpl for one reconcile of node: the
// actions share the decision UpdateStatus makes.
type impl struct {
	client         client.Client
	recorder       events.EventRecorder
	offlineTimeout time.Duration
	now            func() time.Time

	node     *fleetv1.FleetNode
	decision Decision
}

var _ FleetNodeManagerImpl = (*impl)(nil)

// UpdateStatus implements FleetNodeManagerImpl.
func (i *impl) UpdateStatus(ctx context.Context, logger logr.Logger, hubLease *coordinationv1.Lease) (reconcile.Result, error) {
	before := i.node.DeepCopy()
	i.decision = Decide(i.node, hubLease, i.now(), i.offlineTimeout)
	if !i.decision.Changed {
		return ctrlkit.NoRequeue()
	}
	// The optimistic lock keeps a hub's concurrent claim from being overwritten.
	if err := i.client.Status().Patch(ctx, i.node, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsNotFound(err) {
			// Deleted meanwhile: nothing to announce or recheck.
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
	logger.Info("node status decided", "phase", i.node.Status.Phase, "event", i.decision.Event)
	return ctrlkit.NoRequeue()
}

// RecordEvent implements FleetNodeManagerImpl.
func (i *impl) RecordEvent(context.Context, logr.Logger) (reconcile.Result, error) {
	d := i.decision
	if d.Event == "" || i.recorder == nil {
		return ctrlkit.NoRequeue()
	}
	typ := corev1.EventTypeNormal
	if d.Event == fleetv1.ReasonHubLost || d.Event == fleetv1.ReasonRevoked {
		typ = corev1.EventTypeWarning
	}
	i.recorder.Eventf(i.node, nil, typ, d.Event, "Reconcile", d.EventNote)
	return ctrlkit.NoRequeue()
}

// RequeueForRecheck implements FleetNodeManagerImpl.
func (i *impl) RequeueForRecheck(context.Context, logr.Logger) (reconcile.Result, error) {
	return ctrlkit.RequeueAfter(i.decision.RecheckAfter)
}
