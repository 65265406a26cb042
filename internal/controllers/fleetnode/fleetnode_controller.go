package fleetnode

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
)

// Reconciler reconciles FleetNodes.
type Reconciler struct {
	Client    client.Client
	APIReader client.Reader
	Recorder  events.EventRecorder
	// Namespace holds hub Leases.
	Namespace string
	// OfflineTimeout after a hub's Lease lapses, its nodes are Offline.
	OfflineTimeout time.Duration
	// Now is the clock; nil = time.Now.
	Now func() time.Time
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

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	logger := log.FromContext(ctx)
	var n fleetv1.FleetNode
	if err := r.Client.Get(ctx, req.NamespacedName, &n); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var lease *coordinationv1.Lease
	if n.Status.Hub != "" {
		var l coordinationv1.Lease
		err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: "drover-hub-" + n.Status.Hub}, &l)
		switch {
		case err == nil:
			lease = &l
		case !apierrors.IsNotFound(err):
			return ctrl.Result{}, err
		}
	}
	before := n.DeepCopy()
	d := Decide(&n, lease, r.Now(), r.OfflineTimeout)
	if d.Changed {
		// The optimistic lock keeps a hub's concurrent claim from being overwritten.
		if err := r.Client.Status().Patch(ctx, &n, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			return ctrl.Result{}, client.IgnoreNotFound(err)
		}
		logger.Info("node status decided", "phase", n.Status.Phase, "event", d.Event)
	}
	if d.Event != "" && r.Recorder != nil {
		typ := corev1.EventTypeNormal
		if d.Event == fleetv1.ReasonHubLost || d.Event == fleetv1.ReasonRevoked {
			typ = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(&n, nil, typ, d.Event, "Reconcile", d.EventNote)
	}
	return ctrl.Result{RequeueAfter: d.RecheckAfter}, nil
}
