package controlplane

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/controller-manager/pkg/informerfactory"
	"k8s.io/kubernetes/pkg/controller/garbagecollector"
)

// gcSyncPeriod is how often the garbage collector looks for new resource
// kinds (CRDs installed after it started) and the REST mapper forgets what
// it knew. kube-controller-manager waits 30s; discovery is cheap here.
const gcSyncPeriod = 10 * time.Second

// gcWorkers is kube-controller-manager's default --concurrent-gc-syncs.
const gcWorkers = 20

// startGarbageCollector runs kube-controller-manager's garbage collector
// against the embedded apiserver until ctx ends, so that owner references
// mean what they mean in any cluster: dependents go with their owner, and
// `kubectl delete --cascade=foreground|orphan` finishes instead of leaving
// the owner Terminating for ever (its finalizer is the collector's to
// remove). It is the one kube-controller-manager controller Drover needs;
// the rest (Pods, Nodes, Services) have nothing to act on here. The
// returned function waits for it to stop.
func startGarbageCollector(ctx context.Context, cfg *rest.Config) (stopped func(), err error) {
	cfg = rest.CopyConfig(cfg)
	// Each deletion takes two requests (kube-controller-manager doubles
	// the QPS of its collector for the same reason).
	cfg.QPS, cfg.Burst = 100, 200
	cfg.UserAgent = "drover-controlplane/garbage-collector"
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("garbage collector client: %w", err)
	}
	mc, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("garbage collector metadata client: %w", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("garbage collector discovery client: %w", err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	shared := informers.NewSharedInformerFactory(kc, 0)
	metaInformers := metadatainformer.NewSharedInformerFactory(mc, 0)
	started := make(chan struct{})
	gc, err := garbagecollector.NewGarbageCollector(ctx, kc, mc, mapper, garbagecollector.DefaultIgnoredResources(),
		informerfactory.NewInformerFactory(shared, metaInformers), started)
	if err != nil {
		return nil, fmt.Errorf("start the garbage collector: %w", err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { gc.Run(ctx, gcWorkers, gcSyncPeriod) })
	wg.Go(func() { gc.Sync(ctx, dc, gcSyncPeriod) })
	wg.Go(func() { wait.UntilWithContext(ctx, func(context.Context) { mapper.Reset() }, gcSyncPeriod) })
	shared.Start(ctx.Done())
	metaInformers.Start(ctx.Done())
	close(started)
	return func() {
		wg.Wait()
		shared.Shutdown()
		metaInformers.Shutdown()
	}, nil
}
