package controlplane

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/kubernetes/pkg/controller/clusterroleaggregation"
)

// startRoleAggregation runs kube-controller-manager's ClusterRole
// aggregation controller until ctx ends, so that roles labelled
// rbac.authorization.k8s.io/aggregate-to-view (edit, admin) add their rules
// to the built-in view, edit and admin roles as in any cluster: binding
// `view` then lets a person read FleetJobs and Tasks and their logs. The
// returned function waits for it to stop.
func startRoleAggregation(ctx context.Context, cfg *rest.Config) (stopped func(), err error) {
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "drover-controlplane/clusterrole-aggregation"
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("clusterrole aggregation client: %w", err)
	}
	shared := informers.NewSharedInformerFactory(kc, 0)
	c := clusterroleaggregation.NewClusterRoleAggregation(shared.Rbac().V1().ClusterRoles(), kc.RbacV1())
	var wg sync.WaitGroup
	// kube-controller-manager's --concurrent-clusterrole-aggregation default.
	wg.Go(func() { c.Run(ctx, 5) })
	shared.Start(ctx.Done())
	return func() {
		wg.Wait()
		shared.Shutdown()
	}, nil
}
