package inplacectl_test

import (
	"context"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
	"github.com/drover-fleet/drover/internal/inplace/inplacectl"
	"github.com/drover-fleet/drover/internal/testenv"
)

var (
	env    *testenv.Env
	scheme = runtime.NewScheme()
)

// waitTimeout bounds every wait across the apiserver and three controllers
// on a loaded 2-core machine.
const waitTimeout = 60 * time.Second

// The external updater's own API, which Drover knows nothing of: its task
// and template kinds keep the UpdaterUpdateTask contract.
const (
	updaterGroup = "updaters.example.com"
	taskKind     = "ScriptUpdateTask"
	templateKind = "ScriptUpdateTaskTemplate"
	templateNS   = "default"
)

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, fleetv1.AddToScheme, batchv1.AddToScheme, updatev1.AddToScheme, apiextv1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	var stop func()
	env, stop = testenv.StartMain(testenv.Options{Scheme: scheme})
	code := m.Run()
	stop()
	os.Exit(code)
}

// installUpdaterCRDs installs the external updater's CRDs once.
func installUpdaterCRDs(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for _, kind := range []string{taskKind, templateKind} {
		plural := strings.ToLower(kind) + "s"
		crd := &apiextv1.CustomResourceDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: plural + "." + updaterGroup},
			Spec: apiextv1.CustomResourceDefinitionSpec{
				Group: updaterGroup, Scope: apiextv1.NamespaceScoped,
				Names: apiextv1.CustomResourceDefinitionNames{Plural: plural, Kind: kind, ListKind: kind + "List", Singular: strings.ToLower(kind)},
				Versions: []apiextv1.CustomResourceDefinitionVersion{{
					Name: "v1", Served: true, Storage: true,
					Subresources: &apiextv1.CustomResourceSubresources{Status: &apiextv1.CustomResourceSubresourceStatus{}},
					Schema: &apiextv1.CustomResourceValidation{OpenAPIV3Schema: &apiextv1.JSONSchemaProps{
						Type: "object",
						Properties: map[string]apiextv1.JSONSchemaProps{
							"spec":   {Type: "object", XPreserveUnknownFields: ptr(true)},
							"status": {Type: "object", XPreserveUnknownFields: ptr(true)},
						},
					}},
				}},
			},
		}
		if err := env.Client.Create(ctx, crd); err != nil && !strings.Contains(err.Error(), "already exists") {
			t.Fatal(err)
		}
		testenv.Eventually(t, waitTimeout, "CRD "+crd.Name+" established", func(ctx context.Context) (bool, error) {
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(crd), crd); err != nil {
				return false, err
			}
			for _, c := range crd.Status.Conditions {
				if c.Type == apiextv1.Established && c.Status == apiextv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
	}
}

func ptr[T any](v T) *T { return &v }

// uniq makes names unique per run, so that -count=2 runs against the same
// control plane.
func uniq(base string) string {
	return base + "-" + strconv.FormatInt(rand.Int64N(1<<30), 36)
}

// externalUpdater is the updater under test: a controller of its own kind
// that knows only the contract. It updates a node in two reconciles, fails
// on the nodes its template lists in failNodes (reason ScriptExited), holds
// forever when hold is set, and aborts when asked.
type externalUpdater struct{ c client.Client }

func (e *externalUpdater) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	t := &unstructured.Unstructured{}
	t.SetAPIVersion(updaterGroup + "/v1")
	t.SetKind(taskKind)
	if err := e.c.Get(ctx, req.NamespacedName, t); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	phase, _, _ := unstructured.NestedString(t.Object, "spec", "updatePhase")
	st, _, _ := unstructured.NestedString(t.Object, "status", "updateStatus")
	if st == "updated" || st == "aborted" || st == "failed" {
		return reconcile.Result{}, nil
	}
	node := t.GetLabels()[updatev1.LabelNode]
	fail, _, _ := unstructured.NestedStringSlice(t.Object, "spec", "failNodes")
	hold, _, _ := unstructured.NestedBool(t.Object, "spec", "hold")
	next, reason, msg := "updating", "Running", "running"
	switch {
	case phase == "aborting":
		next, reason, msg = "aborted", "Aborted", "stopped and rolled back"
	case slices.Contains(fail, node):
		next, reason, msg = "failed", "ScriptExited", "script exited 3 on "+node
	case hold:
	case st == "updating":
		next, reason, msg = "updated", "Done", "done"
	}
	status := map[string]any{"updateStatus": next, "conditions": []any{map[string]any{
		"type": "Ready", "status": map[bool]string{true: "True", false: "False"}[next == "updated"], "reason": reason, "message": msg,
		"lastTransitionTime": time.Now().UTC().Format(time.RFC3339),
	}}}
	if err := unstructured.SetNestedMap(t.Object, status, "status"); err != nil {
		return reconcile.Result{}, err
	}
	if err := e.c.Status().Update(ctx, t); err != nil {
		return reconcile.Result{}, err
	}
	if next == "updating" && !hold {
		return reconcile.Result{Requeue: true}, nil
	}
	return reconcile.Result{}, nil
}

// startManager runs Drover's controllers and the external updater until
// the test ends; their metrics go to the registry it returns.
func startManager(t *testing.T) *prometheus.Registry {
	t.Helper()
	skip := true
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: &skip}})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	opts := inplacectl.Options{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder("test"), AbortTimeout: 20 * time.Second,
		Metrics: inplacectl.NewMetrics(reg)}
	for _, r := range []interface{ SetupWithManager(ctrl.Manager) error }{
		&inplacectl.PlanReconciler{Options: opts}, &inplacectl.PoolReconciler{Options: opts}, &inplacectl.NodeReconciler{Options: opts},
		&inplacectl.HealthCheckReconciler{Options: opts}, &inplacectl.TopologyReconciler{Options: opts},
		&inplacectl.RequestReconciler{Options: opts, AnswerTimeout: 30 * time.Second},
	} {
		if err := r.SetupWithManager(mgr); err != nil {
			t.Fatal(err)
		}
	}
	task := &unstructured.Unstructured{}
	task.SetAPIVersion(updaterGroup + "/v1")
	task.SetKind(taskKind)
	if err := ctrl.NewControllerManagedBy(mgr).Named("external-updater").For(task).Complete(&externalUpdater{c: mgr.GetClient()}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	return reg
}

// metricValue is the value of the series of name whose label has value
// (a counter's value, or a histogram's sample count); -1 if there is none.
func metricValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					if h := m.GetHistogram(); h != nil {
						return float64(h.GetSampleCount())
					}
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return -1
}

// nodes creates Ready FleetNodes labelled pool=<pool>.
func nodes(t *testing.T, pool string, names ...string) {
	t.Helper()
	ctx := context.Background()
	for _, name := range names {
		n := &fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pool": pool}}, Spec: fleetv1.FleetNodeSpec{Approved: true}}
		if err := env.Client.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
		n.Status.Phase = fleetv1.FleetNodeOnline
		n.Status.AgentVersion = "v1"
		meta.SetStatusCondition(&n.Status.Conditions, metav1.Condition{Type: fleetv1.ReadyCondition, Status: metav1.ConditionTrue, Reason: fleetv1.ReasonConnected})
		if err := env.Client.Status().Update(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
}

// cordon marks a node unschedulable as an operator would.
func cordon(t *testing.T, name string) {
	t.Helper()
	var n fleetv1.FleetNode
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, &n); err != nil {
		t.Fatal(err)
	}
	before := n.DeepCopy()
	n.Spec.Unschedulable = true
	if err := env.Client.Patch(context.Background(), &n, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
}

func pool(t *testing.T, name string, strategy updatev1.UpdateStrategy) {
	t.Helper()
	p := &updatev1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: updatev1.NodePoolSpec{
		Selector: metav1.LabelSelector{MatchLabels: map[string]string{"pool": name}},
		Strategy: strategy,
		Template: updatev1.NodeTemplate{AgentVersion: "v2", Files: []updatev1.ConfigFile{{Path: "/etc/app.conf", Content: "a=1"}}},
	}}
	if err := env.Client.Create(context.Background(), p); err != nil {
		t.Fatal(err)
	}
}

// template creates a template of the external updater.
func template(t *testing.T, name string, spec map[string]any) updatev1.ObjectRef {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"template": map[string]any{"spec": spec}}}}
	u.SetAPIVersion(updaterGroup + "/v1")
	u.SetKind(templateKind)
	u.SetNamespace(templateNS)
	u.SetName(name)
	if err := env.Client.Create(context.Background(), u); err != nil {
		t.Fatal(err)
	}
	return updatev1.ObjectRef{APIVersion: updaterGroup + "/v1", Kind: templateKind, Name: name, Namespace: templateNS}
}

func plan(name string, pools []updatev1.PlanPool, updaters ...updatev1.Updater) *updatev1.InPlaceUpdatePlan {
	return &updatev1.InPlaceUpdatePlan{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: updatev1.InPlaceUpdatePlanSpec{Pools: pools, Updaters: updaters}}
}

func waitPlan(t *testing.T, name string, what string, ok func(*updatev1.InPlaceUpdatePlan) bool) *updatev1.InPlaceUpdatePlan {
	t.Helper()
	p := &updatev1.InPlaceUpdatePlan{}
	testenv.Eventually(t, waitTimeout, what, func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, p); err != nil {
			return false, err
		}
		return ok(p), nil
	})
	return p
}

func statusIs(s updatev1.UpdateStatus) func(*updatev1.InPlaceUpdatePlan) bool {
	return func(p *updatev1.InPlaceUpdatePlan) bool { return p.Status.UpdateStatus == s }
}

func nodeStatuses(t *testing.T, pool string) map[string]string {
	t.Helper()
	var l fleetv1.FleetNodeList
	if err := env.Client.List(context.Background(), &l, client.MatchingLabels{"pool": pool}); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, n := range l.Items {
		out[n.Name] = n.Status.UpdateStatus
	}
	return out
}

func TestPlanUpdatesPoolsInSequenceWithAnExternalUpdater(t *testing.T) {
	testenv.Require(t, env)
	installUpdaterCRDs(t)
	x := uniq("seq")
	startManager(t)
	nodes(t, x+"-cp", x+"-cp-1", x+"-cp-2")
	nodes(t, x+"-md", x+"-md-1", x+"-md-2", x+"-md-3")
	cordon(t, x+"-md-3") // by an operator: stays cordoned after the update
	pool(t, x+"-cp", updatev1.UpdateStrategy{})
	two := intstr.FromInt32(2)
	pool(t, x+"-md", updatev1.UpdateStrategy{Type: updatev1.StrategyMaxUnavailable, MaxUnavailable: &two})
	files := template(t, x+"-files", map[string]any{"script": "write-files"})
	version := template(t, x+"-version", map[string]any{"script": "agent-version"})
	p := plan(x, []updatev1.PlanPool{{Name: x + "-cp", Sequence: 1}, {Name: x + "-md", Sequence: 2}},
		updatev1.Updater{Name: "files", Sequence: 1, UpdaterUpdateTemplateRef: files, Responsibilities: []updatev1.Responsibility{{Path: "/files/etc/app.conf", SelectResource: updatev1.SelectConfiguration, Value: "a=1"}}},
		updatev1.Updater{Name: "version", Sequence: 2, UpdaterUpdateTemplateRef: version, Responsibilities: []updatev1.Responsibility{{Path: "/spec/agentVersion", SelectResource: updatev1.SelectNodeSpec, Value: "v2"}}},
	)
	if err := env.Client.Create(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	p = waitPlan(t, x, "plan seq updated", statusIs(updatev1.StatusUpdated))
	for _, seq := range []string{"Sequence1Update", "Sequence2Update"} {
		if !meta.IsStatusConditionTrue(p.Status.Conditions, seq) {
			t.Errorf("condition %s not True: %+v", seq, meta.FindStatusCondition(p.Status.Conditions, seq))
		}
	}
	if p.Status.Nodes.Updated != 5 || p.Status.Nodes.Total != 5 {
		t.Errorf("plan node summary = %+v, want 5 updated of 5", p.Status.Nodes)
	}
	// Every node ran both updaters, one task each, with the contract's labels.
	var tasks unstructured.UnstructuredList
	tasks.SetAPIVersion(updaterGroup + "/v1")
	tasks.SetKind(taskKind + "List")
	if err := env.Client.List(context.Background(), &tasks, client.MatchingLabels{updatev1.LabelUpdateTaskName: x}); err != nil {
		t.Fatal(err)
	}
	if len(tasks.Items) != 10 {
		t.Errorf("tasks = %d, want 10 (5 nodes × 2 updaters)", len(tasks.Items))
	}
	for _, task := range tasks.Items {
		for _, l := range []string{updatev1.LabelPool, updatev1.LabelNode, updatev1.LabelUpdater} {
			if task.GetLabels()[l] == "" {
				t.Errorf("task %s lacks label %s", task.GetName(), l)
			}
		}
		if script, _, _ := unstructured.NestedString(task.Object, "spec", "script"); script == "" {
			t.Errorf("task %s did not get its template's spec", task.GetName())
		}
	}
	// Sequence 1 (the control-plane-like pool) finished before sequence 2 began.
	var cp, md fleetv1.FleetNodeList
	_ = env.Client.List(context.Background(), &cp, client.MatchingLabels{"pool": x + "-cp"})
	_ = env.Client.List(context.Background(), &md, client.MatchingLabels{"pool": x + "-md"})
	var lastCP time.Time
	for _, n := range cp.Items {
		if c := meta.FindStatusCondition(n.Status.Conditions, updatev1.InPlaceUpdateCondition); c != nil && c.LastTransitionTime.After(lastCP) {
			lastCP = c.LastTransitionTime.Time
		}
	}
	for _, n := range md.Items {
		if n.Status.UpdateStartTime == nil || n.Status.UpdateStartTime.Time.Before(lastCP.Truncate(time.Second)) {
			t.Errorf("node %s started %v, before sequence 1 ended at %v", n.Name, n.Status.UpdateStartTime, lastCP)
		}
		if n.Labels[updatev1.LabelPoolRevision] == "" {
			t.Errorf("node %s not moved to the pool's new revision", n.Name)
		}
	}
	// The update cordoned the nodes and undid only its own cordon.
	testenv.Eventually(t, waitTimeout, "update cordons undone", func(ctx context.Context) (bool, error) {
		for _, l := range []string{x + "-cp", x + "-md"} {
			var ns fleetv1.FleetNodeList
			if err := env.Client.List(ctx, &ns, client.MatchingLabels{"pool": l}); err != nil {
				return false, err
			}
			for _, n := range ns.Items {
				if n.Spec.Unschedulable != (n.Name == x+"-md-3") || n.Annotations[inplacectl.AnnotationCordonedBy] != "" {
					return false, nil
				}
			}
		}
		return true, nil
	})
	// The plan released its pools: another plan may run.
	var pl updatev1.NodePool
	testenv.Eventually(t, waitTimeout, "pools released", func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKey{Name: x + "-md"}, &pl); err != nil {
			return false, err
		}
		return pl.Labels[updatev1.LabelUpdateTaskName] == "" && pl.Spec.UpdatePhase == "", nil
	})
}

func TestUpdaterFailureFailsThePlanNamingNodeUpdaterAndReason(t *testing.T) {
	testenv.Require(t, env)
	installUpdaterCRDs(t)
	x := uniq("fail")
	reg := startManager(t)
	nodes(t, x, x+"-1", x+"-2", x+"-3")
	pool(t, x, updatev1.UpdateStrategy{})
	ref := template(t, x+"-files", map[string]any{"failNodes": []any{x + "-1"}})
	if err := env.Client.Create(context.Background(), plan(x, []updatev1.PlanPool{{Name: x, Sequence: 1}},
		updatev1.Updater{Name: "files", Sequence: 1, UpdaterUpdateTemplateRef: ref})); err != nil {
		t.Fatal(err)
	}
	p := waitPlan(t, x, "plan fail failed", statusIs(updatev1.StatusFailed))
	c := meta.FindStatusCondition(p.Status.Conditions, updatev1.FailedCondition)
	if c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("Failed condition = %+v", c)
	}
	for _, want := range []string{x + "-1", "files", "ScriptExited"} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("Failed condition message %q does not name %s", c.Message, want)
		}
	}
	// One at a time, and no new picks after the failure: fail-1 is the
	// first node, so the others never started.
	if got := nodeStatuses(t, x); got[x+"-2"] != "" || got[x+"-3"] != "" || got[x+"-1"] != "failed" {
		t.Errorf("node statuses = %v, want fail-1 failed and the rest not started", got)
	}
	for _, m := range []struct {
		name, label, value string
		want               float64
	}{
		{"drover_inplace_plans_total", "result", "failed", 1},
		{"drover_inplace_plans_total", "result", "updated", 0},
		{"drover_inplace_node_updates_total", "result", "failed", 1},
		{"drover_inplace_node_updates_total", "result", "updated", 0},
		{"drover_inplace_node_update_duration_seconds", "result", "failed", 1},
	} {
		if got := metricValue(t, reg, m.name, m.label, m.value); got != m.want {
			t.Errorf("%s{%s=%q} = %v, want %v", m.name, m.label, m.value, got, m.want)
		}
	}
}

func TestAbortLeavesEveryNodeUpdatedOrAborted(t *testing.T) {
	testenv.Require(t, env)
	installUpdaterCRDs(t)
	x := uniq("abort")
	startManager(t)
	nodes(t, x, x+"-1", x+"-2", x+"-3", x+"-4")
	two := intstr.FromInt32(2)
	pool(t, x, updatev1.UpdateStrategy{Type: updatev1.StrategyMaxUnavailable, MaxUnavailable: &two})
	ref := template(t, x+"-hold", map[string]any{"hold": true})
	if err := env.Client.Create(context.Background(), plan(x, []updatev1.PlanPool{{Name: x, Sequence: 1}},
		updatev1.Updater{Name: "hold", Sequence: 1, UpdaterUpdateTemplateRef: ref})); err != nil {
		t.Fatal(err)
	}
	waitPlan(t, x, "two nodes updating", func(p *updatev1.InPlaceUpdatePlan) bool { return p.Status.Nodes.Updating == 2 })
	// A node in update takes no new tasks.
	for name, st := range nodeStatuses(t, x) {
		if n := getNode(t, name); st == "updating" && (!n.Spec.Unschedulable || n.Annotations[inplacectl.AnnotationCordonedBy] != x) {
			t.Errorf("updating node %s not cordoned by the plan: unschedulable %v, annotations %v", name, n.Spec.Unschedulable, n.Annotations)
		}
	}
	var p updatev1.InPlaceUpdatePlan
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: x}, &p); err != nil {
		t.Fatal(err)
	}
	before := p.DeepCopy()
	p.Spec.UpdatePhase = updatev1.PhaseAborting
	if err := env.Client.Patch(context.Background(), &p, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	waitPlan(t, x, "plan aborted", statusIs(updatev1.StatusAborted))
	for n, st := range nodeStatuses(t, x) {
		if st != "" && st != "aborted" && st != "updated" {
			t.Errorf("node %s ended %q, between states", n, st)
		}
	}
	testenv.Eventually(t, waitTimeout, "cordons undone after the abort", func(ctx context.Context) (bool, error) {
		for name := range nodeStatuses(t, x) {
			if getNode(t, name).Spec.Unschedulable {
				return false, nil
			}
		}
		return true, nil
	})
}

func TestPlanValidationNamesTheFields(t *testing.T) {
	testenv.Require(t, env)
	ref := updatev1.ObjectRef{APIVersion: "x/v1", Kind: "T", Name: "t"}
	p := plan("cel", []updatev1.PlanPool{{Name: "a", Sequence: 1}},
		updatev1.Updater{Name: "os", Sequence: 1, UpdaterUpdateTemplateRef: ref},
		updatev1.Updater{Name: "ntp", Sequence: 1, UpdaterUpdateTemplateRef: ref})
	err := env.Client.Create(context.Background(), p)
	if err == nil || !strings.Contains(err.Error(), "two updaters share a sequence number") {
		t.Errorf("Create(two updaters, one sequence) = %v, want a refusal naming both", err)
	}
	np := &updatev1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: "cel"}, Spec: updatev1.NodePoolSpec{
		Strategy: updatev1.UpdateStrategy{Type: updatev1.StrategyOneAtATime, MaxUnavailable: ptr(intstr.FromInt32(2))}}}
	if err := env.Client.Create(context.Background(), np); err == nil || !strings.Contains(err.Error(), "maxUnavailable is allowed only with type MaxUnavailable") {
		t.Errorf("Create(OneAtATime with maxUnavailable) = %v", err)
	}
	nhc := &updatev1.NodeHealthCheck{ObjectMeta: metav1.ObjectMeta{Name: "cel"}, Spec: updatev1.NodeHealthCheckSpec{
		MaxUnhealthy: ptr(intstr.FromString("40%")), UnhealthyRange: "[1-2]"}}
	if err := env.Client.Create(context.Background(), nhc); err == nil || !strings.Contains(err.Error(), "not both") {
		t.Errorf("Create(maxUnhealthy and unhealthyRange) = %v", err)
	}
}

// setStatus changes a node's status with retries on conflict (the
// controllers write it too).
func setStatus(t *testing.T, name string, mutate func(*fleetv1.FleetNode)) {
	t.Helper()
	testenv.Eventually(t, waitTimeout, "update status of "+name, func(ctx context.Context) (bool, error) {
		var n fleetv1.FleetNode
		if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
			return false, err
		}
		mutate(&n)
		if err := env.Client.Status().Update(ctx, &n); err != nil {
			return false, nil // conflict: read again
		}
		return true, nil
	})
}

func getNode(t *testing.T, name string) *fleetv1.FleetNode {
	t.Helper()
	var n fleetv1.FleetNode
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, &n); err != nil {
		t.Fatal(err)
	}
	return &n
}

func TestHealthCheckSparesAnUpdatingNodeWithinItsTimeout(t *testing.T) {
	testenv.Require(t, env)
	startManager(t)
	x := uniq("nhc")
	nodes(t, x, x+"-updating", x+"-down", x+"-stuck")
	long := metav1.NewTime(time.Now().Add(-2 * time.Hour))
	readyFalse := func(n *fleetv1.FleetNode) {
		meta.SetStatusCondition(&n.Status.Conditions, metav1.Condition{Type: fleetv1.ReadyCondition, Status: metav1.ConditionFalse, Reason: fleetv1.ReasonDisconnected, LastTransitionTime: long})
		// SetStatusCondition keeps the old transition time when the
		// status changes only if the time is zero; set it explicitly.
		meta.FindStatusCondition(n.Status.Conditions, fleetv1.ReadyCondition).LastTransitionTime = long
	}
	// Offline for 2 h, but updating for a minute: the update may restart it.
	setStatus(t, x+"-updating", func(n *fleetv1.FleetNode) {
		readyFalse(n)
		n.Status.UpdateStatus = "updating"
		n.Status.UpdateStartTime = ptr(metav1.NewTime(time.Now().Add(-time.Minute)))
	})
	setStatus(t, x+"-down", readyFalse)
	setStatus(t, x+"-stuck", func(n *fleetv1.FleetNode) {
		n.Status.UpdateStatus = "updating"
		n.Status.UpdateStartTime = &long
	})
	nhc := &updatev1.NodeHealthCheck{ObjectMeta: metav1.ObjectMeta{Name: x}, Spec: updatev1.NodeHealthCheckSpec{
		Selector:             metav1.LabelSelector{MatchLabels: map[string]string{"pool": x}},
		UnhealthyConditions:  []updatev1.UnhealthyCondition{{Type: fleetv1.ReadyCondition, Status: metav1.ConditionFalse, Timeout: metav1.Duration{Duration: time.Minute}}},
		InPlaceUpdateTimeout: &metav1.Duration{Duration: time.Hour},
		Remediation:          &updatev1.Remediation{Action: updatev1.RemediationRestartAgent},
	}}
	if err := env.Client.Create(context.Background(), nhc); err != nil {
		t.Fatal(err)
	}
	condition := func(name string) func(ctx context.Context) (bool, error) {
		return func(ctx context.Context) (bool, error) {
			return meta.FindStatusCondition(getNode(t, name).Status.Conditions, updatev1.HealthCheckSucceededCondition) != nil, nil
		}
	}
	for _, n := range []string{x + "-updating", x + "-down", x + "-stuck"} {
		testenv.Eventually(t, waitTimeout, "node "+n+" checked", condition(n))
	}
	want := map[string]struct {
		status metav1.ConditionStatus
		reason string
		remedy string
	}{
		x + "-updating": {metav1.ConditionTrue, updatev1.ReasonUpdating, ""},
		x + "-down":     {metav1.ConditionFalse, updatev1.ReasonConditionTimeout, "RestartAgent"},
		x + "-stuck":    {metav1.ConditionFalse, updatev1.ReasonUpdateTimeout, "RestartAgent"},
	}
	testenv.Eventually(t, waitTimeout, "verdicts and remediations", func(ctx context.Context) (bool, error) {
		for name, w := range want {
			n := getNode(t, name)
			c := meta.FindStatusCondition(n.Status.Conditions, updatev1.HealthCheckSucceededCondition)
			if c.Status != w.status || c.Reason != w.reason || n.Annotations[inplacectl.AnnotationRemediation] != w.remedy {
				return false, nil
			}
		}
		return true, nil
	})
	testenv.Never(t, 2*time.Second, "the updating node remediated", func(ctx context.Context) (bool, error) {
		return getNode(t, x+"-updating").Annotations[inplacectl.AnnotationRemediation] != "", nil
	})
	var got updatev1.NodeHealthCheck
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: x}, &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.ExpectedNodes != 3 || got.Status.InUpdate != 1 || got.Status.RemediationsAllowed != 0 {
		t.Errorf("status = %+v, want 3 expected, 1 in update, 0 more remediations allowed (100%% of 3 − 2 unhealthy − 1 updating)", got.Status)
	}
	// The remediated node comes back: its update may run again.
	setStatus(t, x+"-down", func(n *fleetv1.FleetNode) {
		meta.SetStatusCondition(&n.Status.Conditions, metav1.Condition{Type: fleetv1.ReadyCondition, Status: metav1.ConditionTrue, Reason: fleetv1.ReasonConnected})
	})
	testenv.Eventually(t, waitTimeout, "remediation recorded as ended", func(ctx context.Context) (bool, error) {
		n := getNode(t, x+"-down")
		return n.Annotations[inplacectl.AnnotationRemediation] == "" && n.Annotations[inplacectl.AnnotationRemediatedAt] != "", nil
	})
}

// TestMaintenanceWindowHoldsStartsAndRolloutToleratesFailures: a pool
// whose maintenance window is closed starts no node and says when the
// next opens; once the window goes, the plan runs, and a rollout's abort
// threshold lets one failed node of four pass.
func TestMaintenanceWindowHoldsStartsAndRolloutToleratesFailures(t *testing.T) {
	testenv.Require(t, env)
	installUpdaterCRDs(t)
	x := uniq("window")
	startManager(t)
	nodes(t, x, x+"-1", x+"-2", x+"-3", x+"-4")
	all := intstr.FromString("100%")
	pool(t, x, updatev1.UpdateStrategy{Type: updatev1.StrategyMaxUnavailable, MaxUnavailable: &all})
	var p updatev1.NodePool
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: x}, &p); err != nil {
		t.Fatal(err)
	}
	before := p.DeepCopy()
	// 29 February: closed now, whatever the day the test runs.
	p.Spec.MaintenanceWindows = []updatev1.MaintenanceWindow{{Schedule: "0 0 29 2 *", Duration: metav1.Duration{Duration: time.Hour}, TimeZone: "Europe/Berlin"}}
	p.Spec.Rollout = &updatev1.Rollout{BaseRatePerMinute: 10, AbortThresholdPercent: 50, MinEndedForAbort: 4}
	if err := env.Client.Patch(context.Background(), &p, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	ref := template(t, x+"-files", map[string]any{"failNodes": []any{x + "-1"}})
	if err := env.Client.Create(context.Background(), plan(x, []updatev1.PlanPool{{Name: x, Sequence: 1}},
		updatev1.Updater{Name: "files", Sequence: 1, UpdaterUpdateTemplateRef: ref})); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "pool blocked outside its window", func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKey{Name: x}, &p); err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(p.Status.Conditions, updatev1.PreflightBlockedCondition)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == updatev1.ReasonOutsideWindow && strings.Contains(c.Message, "-02-2"), nil
	})
	for name, st := range nodeStatuses(t, x) {
		if st != "" {
			t.Errorf("node %s is %q outside the maintenance window, want not started", name, st)
		}
	}
	before = p.DeepCopy()
	p.Spec.MaintenanceWindows = nil
	if err := env.Client.Patch(context.Background(), &p, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	waitPlan(t, x, "plan updated with one failure under the threshold", statusIs(updatev1.StatusUpdated))
	want := map[string]string{x + "-1": "failed", x + "-2": "updated", x + "-3": "updated", x + "-4": "updated"}
	if got := nodeStatuses(t, x); !maps.Equal(got, want) {
		t.Errorf("node statuses = %v, want %v", got, want)
	}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: x}, &p); err != nil {
		t.Fatal(err)
	}
	if c := meta.FindStatusCondition(p.Status.Conditions, updatev1.InPlaceUpdateCondition); c == nil || !strings.Contains(c.Message, "1 failed, under the rollout's abort threshold") {
		t.Errorf("pool InPlaceUpdate condition = %+v, want it to count the failed node", c)
	}
}

// TestDrainWaitsForRunningTasks: a node picked for an update waits for
// the Tasks running on it before its first updater starts, and a pool
// whose drain times out fails the node naming the tasks, stopping none.
func TestDrainWaitsForRunningTasks(t *testing.T) {
	testenv.Require(t, env)
	installUpdaterCRDs(t)
	ctx := context.Background()
	x := uniq("drain")
	startManager(t)
	runningTask := func(name, node string) *batchv1.Task {
		task := &batchv1.Task{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Spec: batchv1.TaskSpec{Command: []string{"sleep", "600"}}}
		if err := env.Client.Create(ctx, task); err != nil {
			t.Fatal(err)
		}
		task.Status.State, task.Status.NodeName = batchv1.TaskRunning, node
		if err := env.Client.Status().Update(ctx, task); err != nil {
			t.Fatal(err)
		}
		return task
	}
	setDrain := func(pool string, d *updatev1.DrainPolicy) {
		var p updatev1.NodePool
		if err := env.Client.Get(ctx, client.ObjectKey{Name: pool}, &p); err != nil {
			t.Fatal(err)
		}
		before := p.DeepCopy()
		p.Spec.Drain = d
		if err := env.Client.Patch(ctx, &p, client.MergeFrom(before)); err != nil {
			t.Fatal(err)
		}
	}
	waitCondition := func(node, reason, substr string) {
		testenv.Eventually(t, waitTimeout, "node "+node+" "+reason, func(ctx context.Context) (bool, error) {
			c := meta.FindStatusCondition(getNode(t, node).Status.Conditions, updatev1.InPlaceUpdateCondition)
			return c != nil && c.Reason == reason && strings.Contains(c.Message, substr), nil
		})
	}

	wait, short := x+"-w", x+"-t"
	nodes(t, wait, wait+"-1")
	nodes(t, short, short+"-1")
	pool(t, wait, updatev1.UpdateStrategy{})
	pool(t, short, updatev1.UpdateStrategy{})
	setDrain(short, &updatev1.DrainPolicy{Policy: updatev1.DrainWait, Timeout: &metav1.Duration{Duration: time.Second}})
	sim := runningTask(x+"-sim", wait+"-1")
	runningTask(x+"-build", short+"-1")
	ref := template(t, x+"-files", map[string]any{})
	for _, p := range []string{wait, short} {
		if err := env.Client.Create(ctx, plan(p, []updatev1.PlanPool{{Name: p, Sequence: 1}},
			updatev1.Updater{Name: "files", Sequence: 1, UpdaterUpdateTemplateRef: ref})); err != nil {
			t.Fatal(err)
		}
	}

	waitCondition(wait+"-1", updatev1.ReasonDraining, "default/"+x+"-sim")
	if st := nodeStatuses(t, wait)[wait+"-1"]; st != "updating" {
		t.Errorf("draining node is %q, want updating", st)
	}
	// Its task ends: the update goes on.
	sim.Status.State = batchv1.TaskCompleted
	if err := env.Client.Status().Update(ctx, sim); err != nil {
		t.Fatal(err)
	}
	waitPlan(t, wait, "plan updated after the drain", statusIs(updatev1.StatusUpdated))

	p := waitPlan(t, short, "plan failed by the drain timeout", statusIs(updatev1.StatusFailed))
	c := meta.FindStatusCondition(getNode(t, short+"-1").Status.Conditions, updatev1.InPlaceUpdateCondition)
	if c == nil || c.Reason != updatev1.ReasonDrainTimeout || !strings.Contains(c.Message, "default/"+x+"-build") {
		t.Errorf("node condition = %+v, want DrainTimeout naming the task", c)
	}
	if f := meta.FindStatusCondition(p.Status.Conditions, updatev1.FailedCondition); f == nil || !strings.Contains(f.Message, "drain") {
		t.Errorf("plan Failed condition = %+v, want it to name the drain", f)
	}
	var build batchv1.Task
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: x + "-build"}, &build); err != nil || build.Status.State != batchv1.TaskRunning {
		t.Errorf("task %s = %v, %v: want it left running", x+"-build", build.Status.State, err)
	}
}
