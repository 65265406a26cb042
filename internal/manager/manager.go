package manager

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	serverlessv1 "github.com/drover-fleet/drover/api/serverless/v1alpha1"
	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
	"github.com/drover-fleet/drover/internal/fleetnode/fleetnodectl"
	"github.com/drover-fleet/drover/internal/inplace/agentupdater"
	"github.com/drover-fleet/drover/internal/inplace/inplacectl"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobctl"
	"github.com/drover-fleet/drover/internal/serverless/appctl"
	"github.com/drover-fleet/drover/internal/task/taskctl"
	"github.com/drover-fleet/drover/internal/tenancy/tenancyadmit"
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
	if err := batchv1.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := updatev1.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := serverlessv1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

// Options configure the controllers.
type Options struct {
	// NodeJobs runs the NodeUpgradeJob and ImagePrePullJob controllers
	// (off with --feature-gates=disableNodeTaskV1alpha2).
	NodeJobs bool
	// Tasks runs the FleetJob, TaskGroup and Task controllers and the task
	// scheduler (taskctl.drover.io).
	Tasks bool
	// Apps runs the Application controller (serverless.drover.io): the
	// instances of each Application and the binding of its sessions.
	Apps bool
	// Admission, when set, serves and installs the tenancy webhook, which
	// refuses work that no NodeGrant allows (internal/tenancy/tenancyadmit).
	Admission *tenancyadmit.Options
}

// Parts are what Setup started that a caller may wait for.
type Parts struct {
	// Admission is the tenancy webhook's server; nil without
	// Options.Admission.
	Admission *tenancyadmit.Server
	// Apps is the Application controller, whose Open binds sessions
	// in-process; nil without Options.Apps.
	Apps *appctl.Controller
}

// Setup registers every controller with mgr.
func Setup(mgr ctrl.Manager, opts Options) (*Parts, error) {
	p := &Parts{}
	if opts.Admission != nil {
		s, err := tenancyadmit.Setup(mgr, *opts.Admission)
		if err != nil {
			return nil, fmt.Errorf("set up the tenancy webhook: %w", err)
		}
		p.Admission = s
	}
	r := &fleetnodectl.Reconciler{
		Client:   mgr.GetClient(),
		Recorder: mgr.GetEventRecorder("drover-manager"),
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up FleetNode controller: %w", err)
	}
	if err := setupInPlace(mgr); err != nil {
		return nil, err
	}
	if opts.Tasks {
		if err := taskctl.Setup(mgr, taskctl.Options{}); err != nil {
			return nil, err
		}
	}
	if opts.Apps {
		c, err := appctl.Setup(mgr, appctl.Options{})
		if err != nil {
			return nil, err
		}
		p.Apps = c
	}
	if !opts.NodeJobs {
		return p, nil
	}
	rec := mgr.GetEventRecorder("drover-manager")
	upgrades := &nodejobctl.Reconciler[*opsv1.NodeUpgradeJob]{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: rec,
		New: func() *opsv1.NodeUpgradeJob { return &opsv1.NodeUpgradeJob{} }}
	if err := upgrades.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up NodeUpgradeJob controller: %w", err)
	}
	pulls := &nodejobctl.Reconciler[*opsv1.ImagePrePullJob]{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: rec,
		New: func() *opsv1.ImagePrePullJob { return &opsv1.ImagePrePullJob{} }}
	if err := pulls.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up ImagePrePullJob controller: %w", err)
	}
	return p, nil
}

// setupInPlace registers the in-place update controllers (update.drover.io):
// plans, pools, the FleetNode update controller and health checks.
func setupInPlace(mgr ctrl.Manager) error {
	o := inplacectl.Options{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder("drover-manager"),
		Metrics: inplacectl.NewMetrics(metrics.Registry)}
	if err := (&inplacectl.PlanReconciler{Options: o}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up InPlaceUpdatePlan controller: %w", err)
	}
	if err := (&inplacectl.PoolReconciler{Options: o}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up NodePool controller: %w", err)
	}
	if err := (&inplacectl.NodeReconciler{Options: o}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up FleetNode in-place update controller: %w", err)
	}
	if err := (&inplacectl.HealthCheckReconciler{Options: o}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up NodeHealthCheck controller: %w", err)
	}
	if err := (&inplacectl.TopologyReconciler{Options: o}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up NodePool topology controller: %w", err)
	}
	if err := (&inplacectl.RequestReconciler{Options: o}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up ExternalUpdateRequest controller: %w", err)
	}
	if err := (&agentupdater.Reconciler{Client: mgr.GetClient(), Recorder: o.Recorder}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the built-in agent-version updater: %w", err)
	}
	return nil
}
