// Command inplace measures one InPlaceUpdatePlan over many FleetNodes in
// several pools with several updaters, against the same number of plain
// apiserver writes from one client in the same run (issue #18's
// benchmark): apiserver writes per node per updater and the wall-time
// ratio. See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
	"github.com/drover-fleet/drover/bench/internal/benchproc"
)

// The simulated updaters' own kinds: Drover knows nothing of them but the
// UpdaterUpdateTask contract.
const (
	group        = "bench.drover.io"
	taskKind     = "BenchUpdateTask"
	templateKind = "BenchUpdateTaskTemplate"
	namespace    = "default"
	poolLabel    = "drover.bench/pool"
)

type options struct {
	nodes, pools, updaters int
	maxUnavailable         string
	timeout                time.Duration
	binDir, workDir, mdOut string
	keep                   bool
	progress               time.Duration
}

func main() {
	var o options
	flag.IntVar(&o.nodes, "nodes", 1000, "FleetNodes to update")
	flag.IntVar(&o.pools, "pools", 10, "NodePools the nodes are spread over (one plan sequence: they update together)")
	flag.IntVar(&o.updaters, "updaters", 2, "updaters per node, one after another")
	flag.StringVar(&o.maxUnavailable, "max-unavailable", "100%", "each pool's strategy.maxUnavailable")
	flag.DurationVar(&o.timeout, "timeout", 20*time.Minute, "give up on the plan after this long")
	flag.StringVar(&o.binDir, "bin-dir", "", "use drover from this directory instead of building it")
	flag.StringVar(&o.workDir, "work-dir", "", "directory for state and logs (default: a new temporary directory)")
	flag.StringVar(&o.mdOut, "md", "", "also write the results (markdown) to this file")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory")
	flag.DurationVar(&o.progress, "progress", 10*time.Second, "how often to print the plan's counts")
	flag.Parse()
	if o.nodes < o.pools || o.pools < 1 || o.updaters < 1 {
		fmt.Fprintln(os.Stderr, "inplace: need -pools ≥ 1, -updaters ≥ 1 and -nodes ≥ -pools")
		os.Exit(2)
	}
	ctrllog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r := &runner{o: o}
	err := r.run(ctx)
	for i := len(r.procs) - 1; i >= 0; i-- {
		r.procs[i].Stop(20 * time.Second)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "inplace:", err)
		fmt.Fprintln(os.Stderr, "inplace: logs in", r.work)
		os.Exit(1)
	}
	if !o.keep && o.workDir == "" {
		_ = os.RemoveAll(r.work)
	}
}

type runner struct {
	o       options
	work    string
	drover  string
	procs   []*benchproc.Proc
	cfg     *rest.Config
	c       client.Client
	apiHTTP *http.Client
	scheme  *k8sruntime.Scheme
	cp, mgr *benchproc.Proc
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func (r *runner) start(name, bin string, args ...string) (*benchproc.Proc, error) {
	p, err := benchproc.Start(r.work, name, bin, args...)
	if err != nil {
		return nil, err
	}
	r.procs = append(r.procs, p)
	return p, nil
}

func (r *runner) run(ctx context.Context) error {
	var err error
	if r.work = r.o.workDir; r.work == "" {
		if r.work, err = os.MkdirTemp("", "drover-inplace-bench-"); err != nil {
			return err
		}
	}
	if err := r.binaries(ctx); err != nil {
		return err
	}
	if err := r.startControl(ctx); err != nil {
		return err
	}
	if err := r.setup(ctx); err != nil {
		return err
	}
	stopUpdaters, err := r.startUpdaters(ctx)
	if err != nil {
		return err
	}
	defer stopUpdaters()
	base, err := r.baseline(ctx)
	if err != nil {
		return err
	}
	res, err := r.runPlan(ctx)
	if err != nil {
		return err
	}
	res.baseline = base
	// The same number of writes as the plan made, from one client: the
	// ratio the goal is about.
	res.sameWrites = int(benchproc.Total(res.writes))
	if res.sameBaseline, err = r.writes(ctx, "bench-same", res.sameWrites); err != nil {
		return err
	}
	md := res.markdown(r.o)
	fmt.Print(md)
	if r.o.mdOut != "" {
		return os.WriteFile(r.o.mdOut, []byte(md), 0o644)
	}
	return nil
}

func (r *runner) binaries(ctx context.Context) error {
	if r.o.binDir != "" {
		r.drover = filepath.Join(r.o.binDir, "drover")
		_, err := os.Stat(r.drover)
		return err
	}
	if _, err := os.Stat("go.mod"); err != nil {
		return errors.New("run from the repository root (go run ./bench/inplace), or pass -bin-dir")
	}
	r.drover = filepath.Join(r.work, "bin", "drover")
	began := time.Now()
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", r.drover, "./cmd/drover").CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/drover: %v\n%s", err, out)
	}
	logf("built ./cmd/drover in %s", time.Since(began).Round(100*time.Millisecond))
	return nil
}

// startControl starts the control plane and the manager (no hub: the
// in-place controllers need FleetNodes, not agents).
func (r *runner) startControl(ctx context.Context) error {
	logf("control plane: starting")
	var err error
	r.cp, err = r.start("controlplane", r.drover, "controlplane", "--data-dir", filepath.Join(r.work, "cp"), "--port", "0", "--crd-dir", "config/crd/bases", "--log-level", "warn")
	if err != nil {
		return err
	}
	kubeconfig, err := r.cp.WaitLine(ctx, "ready kubeconfig=", 5*time.Minute)
	if err != nil {
		return err
	}
	if r.mgr, err = r.start("manager", r.drover, "manager", "--kubeconfig", kubeconfig, "--leader-elect=false", "--log-level", "warn"); err != nil {
		return err
	}
	if r.cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
		return err
	}
	r.cfg.QPS, r.cfg.Burst = -1, 0 // "one client" with no client-side limit
	if r.apiHTTP, err = rest.HTTPClientFor(r.cfg); err != nil {
		return err
	}
	r.scheme = k8sruntime.NewScheme()
	for _, add := range []func(*k8sruntime.Scheme) error{fleetv1.AddToScheme, updatev1.AddToScheme, corev1.AddToScheme, apiextv1.AddToScheme} {
		if err := add(r.scheme); err != nil {
			return err
		}
	}
	r.c, err = client.New(r.cfg, client.Options{Scheme: r.scheme})
	return err
}

func (r *runner) apiSnap(ctx context.Context) (map[string]float64, error) {
	ss, err := benchproc.Scrape(ctx, r.apiHTTP, strings.TrimSuffix(r.cfg.Host, "/")+"/metrics", "apiserver_request_total")
	if err != nil {
		return nil, err
	}
	return benchproc.APIWrites(ss), nil
}

// setup installs the updaters' CRDs and templates, the nodes (Ready, at
// agent version v1) and the pools (template v2).
func (r *runner) setup(ctx context.Context) error {
	for _, kind := range []string{taskKind, templateKind} {
		plural := strings.ToLower(kind) + "s"
		preserve := true
		crd := &apiextv1.CustomResourceDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: plural + "." + group},
			Spec: apiextv1.CustomResourceDefinitionSpec{
				Group: group, Scope: apiextv1.NamespaceScoped,
				Names: apiextv1.CustomResourceDefinitionNames{Plural: plural, Kind: kind, ListKind: kind + "List", Singular: strings.ToLower(kind)},
				Versions: []apiextv1.CustomResourceDefinitionVersion{{
					Name: "v1", Served: true, Storage: true,
					Subresources: &apiextv1.CustomResourceSubresources{Status: &apiextv1.CustomResourceSubresourceStatus{}},
					Schema: &apiextv1.CustomResourceValidation{OpenAPIV3Schema: &apiextv1.JSONSchemaProps{
						Type: "object",
						Properties: map[string]apiextv1.JSONSchemaProps{
							"spec":   {Type: "object", XPreserveUnknownFields: &preserve},
							"status": {Type: "object", XPreserveUnknownFields: &preserve},
						},
					}},
				}},
			},
		}
		if err := r.c.Create(ctx, crd); err != nil {
			return fmt.Errorf("create CRD %s: %w", crd.Name, err)
		}
		if err := wait(ctx, 2*time.Minute, "CRD "+crd.Name+" established", func() (bool, error) {
			if err := r.c.Get(ctx, client.ObjectKeyFromObject(crd), crd); err != nil {
				return false, err
			}
			for _, c := range crd.Status.Conditions {
				if c.Type == apiextv1.Established && c.Status == apiextv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		}); err != nil {
			return err
		}
	}
	for u := range r.o.updaters {
		t := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{"step": int64(u)}}}}}
		t.SetAPIVersion(group + "/v1")
		t.SetKind(templateKind)
		t.SetNamespace(namespace)
		t.SetName(fmt.Sprintf("updater-%d", u))
		if err := r.c.Create(ctx, t); err != nil {
			return fmt.Errorf("create template: %w", err)
		}
	}
	logf("creating %d FleetNodes in %d pools", r.o.nodes, r.o.pools)
	began := time.Now()
	err := parallel(ctx, 8, r.o.nodes, func(i int) error {
		n := &fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%05d", i), Labels: map[string]string{poolLabel: poolName(i % r.o.pools)}},
			Spec: fleetv1.FleetNodeSpec{Approved: true}}
		if err := r.c.Create(ctx, n); err != nil {
			return err
		}
		n.Status.Phase = fleetv1.FleetNodeOnline
		n.Status.AgentVersion = "v1"
		meta.SetStatusCondition(&n.Status.Conditions, metav1.Condition{Type: fleetv1.ReadyCondition, Status: metav1.ConditionTrue, Reason: fleetv1.ReasonConnected})
		return r.c.Status().Update(ctx, n)
	})
	if err != nil {
		return fmt.Errorf("create nodes: %w", err)
	}
	logf("nodes created in %s", time.Since(began).Round(100*time.Millisecond))
	mu := intstr.Parse(r.o.maxUnavailable)
	for p := range r.o.pools {
		pool := &updatev1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: poolName(p)}, Spec: updatev1.NodePoolSpec{
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{poolLabel: poolName(p)}},
			Strategy: updatev1.UpdateStrategy{Type: updatev1.StrategyMaxUnavailable, MaxUnavailable: &mu},
			Template: updatev1.NodeTemplate{AgentVersion: "v2"},
			Drain:    &updatev1.DrainPolicy{Policy: updatev1.DrainNone},
		}}
		if err := r.c.Create(ctx, pool); err != nil {
			return fmt.Errorf("create pool: %w", err)
		}
	}
	// Let the pools' first reconciles (status, no plan) settle.
	return wait(ctx, 2*time.Minute, "pools observed", func() (bool, error) {
		var l updatev1.NodePoolList
		if err := r.c.List(ctx, &l); err != nil {
			return false, err
		}
		for _, p := range l.Items {
			if p.Status.ObservedGeneration != p.Generation || int(p.Status.Nodes) == 0 {
				return false, nil
			}
		}
		return len(l.Items) == r.o.pools, nil
	})
}

func poolName(i int) string { return fmt.Sprintf("pool-%02d", i) }

// startUpdaters runs the simulated updaters: one controller of the bench
// task kind that, as an updater that has nothing to do on the node would,
// answers a task in one status write (updated, or aborted when asked).
func (r *runner) startUpdaters(ctx context.Context) (func(), error) {
	mgr, err := ctrl.NewManager(r.cfg, ctrl.Options{Scheme: r.scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		return nil, err
	}
	task := &unstructured.Unstructured{}
	task.SetAPIVersion(group + "/v1")
	task.SetKind(taskKind)
	u := &simUpdater{c: mgr.GetClient()}
	if err := ctrl.NewControllerManagedBy(mgr).Named("bench-updater").For(task).WithOptions(controller.Options{MaxConcurrentReconciles: 4}).Complete(u); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := mgr.Start(ctx); err != nil {
			logf("simulated updaters: %v", err)
		}
	}()
	return func() { cancel(); wg.Wait() }, nil
}

type simUpdater struct{ c client.Client }

func (s *simUpdater) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	t := &unstructured.Unstructured{}
	t.SetAPIVersion(group + "/v1")
	t.SetKind(taskKind)
	if err := s.c.Get(ctx, req.NamespacedName, t); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	phase, _, _ := unstructured.NestedString(t.Object, "spec", "updatePhase")
	st, _, _ := unstructured.NestedString(t.Object, "status", "updateStatus")
	want := ""
	switch {
	case phase == "updating" && st == "":
		want = "updated"
	case phase == "aborting" && st != "aborted" && st != "updated":
		want = "aborted"
	default:
		return reconcile.Result{}, nil
	}
	before := t.DeepCopy()
	status := want
	cond := map[string]any{"type": "Ready", "status": "True", "reason": "Done", "message": "", "lastTransitionTime": time.Now().UTC().Format(time.RFC3339)}
	if want == "aborted" {
		cond["status"], cond["reason"] = "False", "Aborted"
	}
	if err := unstructured.SetNestedField(t.Object, status, "status", "updateStatus"); err != nil {
		return reconcile.Result{}, err
	}
	if err := unstructured.SetNestedSlice(t.Object, []any{cond}, "status", "conditions"); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, s.c.Status().Patch(ctx, t, client.MergeFrom(before))
}

// baseline times N ConfigMap creates, one at a time, from this client.
func (r *runner) baseline(ctx context.Context) (time.Duration, error) {
	return r.writes(ctx, "bench-baseline", r.o.nodes)
}

// writes times n ConfigMap creates in a new namespace, one at a time.
func (r *runner) writes(ctx context.Context, namespace string, n int) (time.Duration, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if err := r.c.Create(ctx, ns); err != nil {
		return 0, err
	}
	logf("baseline: %d ConfigMap creates from one client", n)
	began := time.Now()
	for i := range n {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: fmt.Sprintf("w-%05d", i)}, Data: map[string]string{"a": "1", "b": "2"}}
		if err := r.c.Create(ctx, cm); err != nil {
			return 0, err
		}
	}
	d := time.Since(began)
	logf("baseline: %s (%.0f writes/s)", d.Round(10*time.Millisecond), float64(n)/d.Seconds())
	return d, nil
}

type result struct {
	wall, baseline time.Duration
	sameWrites     int
	sameBaseline   time.Duration
	writes         map[string]float64
	nodes          updatev1.NodeSummary
	cpuMgr, cpuCP  float64
}

func (r *runner) runPlan(ctx context.Context) (*result, error) {
	plan := &updatev1.InPlaceUpdatePlan{ObjectMeta: metav1.ObjectMeta{Name: "bench"}, Spec: updatev1.InPlaceUpdatePlanSpec{}}
	for p := range r.o.pools {
		plan.Spec.Pools = append(plan.Spec.Pools, updatev1.PlanPool{Name: poolName(p), Sequence: 1})
	}
	for u := range r.o.updaters {
		plan.Spec.Updaters = append(plan.Spec.Updaters, updatev1.Updater{Name: fmt.Sprintf("updater-%d", u), Sequence: int32(u + 1),
			UpdaterUpdateTemplateRef: updatev1.ObjectRef{APIVersion: group + "/v1", Kind: templateKind, Name: fmt.Sprintf("updater-%d", u), Namespace: namespace}})
	}
	mgrCPU0, _ := benchproc.ReadUsage(r.mgr.PID())
	cpCPU0, _ := benchproc.ReadUsage(r.cp.PID())
	before, err := r.apiSnap(ctx)
	if err != nil {
		return nil, err
	}
	logf("plan: %d nodes, %d pools, %d updaters", r.o.nodes, r.o.pools, r.o.updaters)
	began := time.Now()
	if err := r.c.Create(ctx, plan); err != nil {
		return nil, err
	}
	lastLog := time.Now()
	err = wait(ctx, r.o.timeout, "plan updated", func() (bool, error) {
		if err := r.c.Get(ctx, client.ObjectKeyFromObject(plan), plan); err != nil {
			return false, err
		}
		if time.Since(lastLog) >= r.o.progress {
			n := plan.Status.Nodes
			logf("plan %s: %d updated, %d updating of %d", orWaiting(string(plan.Status.UpdateStatus)), n.Updated, n.Updating, n.Total)
			lastLog = time.Now()
		}
		switch plan.Status.UpdateStatus {
		case updatev1.StatusUpdated:
			return true, nil
		case updatev1.StatusFailed, updatev1.StatusAborted:
			return false, fmt.Errorf("plan ended %s", plan.Status.UpdateStatus)
		}
		return false, nil
	})
	wall := time.Since(began)
	if err != nil {
		return nil, err
	}
	after, err := r.apiSnap(ctx)
	if err != nil {
		return nil, err
	}
	res := &result{wall: wall, writes: benchproc.Delta(before, after), nodes: plan.Status.Nodes}
	if u, err := benchproc.ReadUsage(r.mgr.PID()); err == nil {
		res.cpuMgr = (u.CPU - mgrCPU0.CPU).Seconds()
	}
	if u, err := benchproc.ReadUsage(r.cp.PID()); err == nil {
		res.cpuCP = (u.CPU - cpCPU0.CPU).Seconds()
	}
	logf("plan updated in %s", wall.Round(10*time.Millisecond))
	return res, nil
}

func (res *result) markdown(o options) string {
	var b strings.Builder
	desc, model := benchproc.Machine()
	total := benchproc.Total(res.writes)
	perNode := total / float64(o.nodes)
	fmt.Fprintf(&b, "## inplace: one plan over %d nodes, %d pools, %d updaters\n\n", o.nodes, o.pools, o.updaters)
	fmt.Fprintf(&b, "%s, %s; %s; `go run ./bench/inplace -nodes %d -pools %d -updaters %d -max-unavailable %s`\n\n",
		time.Now().UTC().Format("2006-01-02"), desc, model, o.nodes, o.pools, o.updaters, o.maxUnavailable)
	fmt.Fprintln(&b, "| figure | value | goal |")
	fmt.Fprintln(&b, "|---|---|---|")
	fmt.Fprintf(&b, "| plan wall time | %s | |\n", res.wall.Round(10*time.Millisecond))
	fmt.Fprintf(&b, "| baseline: %d ConfigMap creates, one client | %s (%.0f/s) | |\n", o.nodes, res.baseline.Round(10*time.Millisecond), float64(o.nodes)/res.baseline.Seconds())
	fmt.Fprintf(&b, "| ratio plan / baseline (one write per node) | %.2f | |\n", res.wall.Seconds()/res.baseline.Seconds())
	fmt.Fprintf(&b, "| baseline: %d ConfigMap creates (the plan's number of writes), one client | %s (%.0f/s) | |\n", res.sameWrites, res.sameBaseline.Round(10*time.Millisecond), float64(res.sameWrites)/res.sameBaseline.Seconds())
	fmt.Fprintf(&b, "| **ratio** plan / the same number of one-client writes | **%.2f** | ≤ 1.0 |\n", res.wall.Seconds()/res.sameBaseline.Seconds())
	fmt.Fprintf(&b, "| apiserver writes | %.0f (%.1f per node) | |\n", total, perNode)
	fmt.Fprintf(&b, "| **writes per node per updater** | **%.2f** | ≤ 6 |\n", perNode/float64(o.updaters))
	fmt.Fprintf(&b, "| CPU seconds: manager, control plane | %.1f, %.1f | |\n\n", res.cpuMgr, res.cpuCP)
	fmt.Fprintln(&b, "Writes by resource (POST/PUT/PATCH/DELETE between the plan's create and its end; includes the simulated updaters' one status write per task, Events and Leases):")
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, "| resource | writes | per node |")
	fmt.Fprintln(&b, "|---|---|---|")
	keys := make([]string, 0, len(res.writes))
	for k := range res.writes {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return res.writes[keys[i]] > res.writes[keys[j]] })
	for _, k := range keys {
		if res.writes[k] == 0 {
			continue
		}
		fmt.Fprintf(&b, "| %s | %.0f | %.2f |\n", k, res.writes[k], res.writes[k]/float64(o.nodes))
	}
	return b.String()
}

func orWaiting(s string) string {
	if s == "" {
		return "waiting"
	}
	return s
}

// wait polls ok every 200 ms until it is true, fails, or timeout passes.
func wait(ctx context.Context, timeout time.Duration, what string, ok func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		done, err := ok()
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: not within %s", what, timeout)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// parallel runs f(0..n-1) on workers goroutines, stopping at the first error.
func parallel(ctx context.Context, workers, n int, f func(int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil {
					errs <- err
					cancel()
					return
				}
			}
		}()
	}
	go func() {
		defer close(next)
		for i := range n {
			select {
			case next <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	return <-errs
}
