package manager

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	"github.com/drover-fleet/drover/internal/controllers/fleetnode"
)

// Scheme returns a scheme with Kubernetes' built-in kinds and Drover's.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err) // static registration; cannot fail at run time
	}
	if err := fleetv1.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := opsv1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

// Options configure the controllers.
type Options struct {
	// Namespace holds hub Leases. Default: drover-system.
	Namespace string
	// OfflineTimeout: a node whose hub's Lease lapsed this long ago is Offline. Default: 5m.
	OfflineTimeout time.Duration
}

// Setup registers every controller with mgr.
func Setup(mgr ctrl.Manager, opts Options) error {
	if opts.Namespace == "" {
		opts.Namespace = "drover-system"
	}
	if opts.OfflineTimeout <= 0 {
		opts.OfflineTimeout = 5 * time.Minute
	}
	r := &fleetnode.Reconciler{
		Client:         mgr.GetClient(),
		APIReader:      mgr.GetAPIReader(),
		Recorder:       mgr.GetEventRecorder("drover-manager"),
		Namespace:      opts.Namespace,
		OfflineTimeout: opts.OfflineTimeout,
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up FleetNode controller: %w", err)
	}
	return nil
}
