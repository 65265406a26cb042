package charts

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/drover-fleet/drover/config/rbac"
	"github.com/drover-fleet/drover/internal/testenv"
)

// TestHelmLint: `helm lint --strict` is clean with the defaults and with
// every optional part on.
func TestHelmLint(t *testing.T) {
	tl := needTools(t)
	for _, set := range [][]string{nil, {"serviceMonitor.enabled=true", "networkPolicy.enabled=true", "hub.service.type=LoadBalancer", "hub.mqtt.enabled=false", "manager.webhook.enabled=false"}} {
		args := []string{"lint", "--strict", "charts/drover", "--namespace", "drover-system"}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		out := tl.run(t, tl.helm, args...)
		if !strings.Contains(out, "1 chart(s) linted, 0 chart(s) failed") || strings.Contains(out, "[WARNING]") || strings.Contains(out, "[ERROR]") {
			t.Errorf("helm %s:\n%s", strings.Join(args, " "), out)
		}
	}
}

// TestNotes: what `helm install` prints says how to get a bootstrap token
// and Drover's CA and join an agent (TestChartRunsInAnotherNamespace runs
// those commands), and where the hubs are for the Service type.
func TestNotes(t *testing.T) {
	tl := needTools(t)
	// helm install --dry-run (client) still asks a cluster for its version
	// and for objects the release would take over.
	env := controlPlane(t)
	for _, c := range []struct {
		set  []string
		want []string
	}{
		{nil, []string{"drover token create --namespace drover-system", "drover ca --namespace drover-system > ca.crt",
			"drover-agent --node edge-1 --hub HUB:7443 --token <token>", "drover approve edge-1", "drover-hub.drover-system.svc"}},
		{[]string{"hub.service.type=LoadBalancer"}, []string{"get service drover-hub -o jsonpath='{.status.loadBalancer.ingress[0]}'", "hub.extraHosts"}},
		{[]string{"hub.service.type=NodePort", "hub.grpc.port=9000"}, []string{"nodePort", "--hub HUB:9000"}},
	} {
		// --take-ownership: the control plane installed config/rbac and
		// config/admission itself.
		args := []string{"install", "drover", "charts/drover", "--namespace", "drover-system", "--dry-run=client",
			"--take-ownership", "--kubeconfig", env.Kubeconfig}
		for _, s := range c.set {
			args = append(args, "--set", s)
		}
		out := tl.run(t, tl.helm, args...)
		checkNotes(t, out, c.want...)
	}
}

// checkNotes checks that the NOTES helm install printed have every want.
func checkNotes(t *testing.T, out string, want ...string) {
	t.Helper()
	_, notes, ok := strings.Cut(out, "\nNOTES:\n")
	if !ok {
		t.Fatalf("helm install printed no NOTES:\n%s", out)
	}
	for _, w := range want {
		if !strings.Contains(notes, w) {
			t.Errorf("NOTES lack %q:\n%s", w, notes)
		}
	}
}

// TestChartRefusesOldKubernetes: the chart fails on a cluster without
// ValidatingAdmissionPolicy v1.
func TestChartRefusesOldKubernetes(t *testing.T) {
	tl := needTools(t)
	_, err := tl.try(tl.helm, "template", "drover", "charts/drover", "--kube-version", "v1.29.9")
	if err == nil || !strings.Contains(err.Error(), "Drover needs Kubernetes 1.30 or later") {
		t.Errorf("helm template --kube-version v1.29.9: %v, want a refusal naming Kubernetes 1.30", err)
	}
}

// TestHelmDryRunApply renders the chart with the defaults and with the
// ServiceMonitor and NetworkPolicy on, and applies each output to a real
// kube-apiserver with a server-side dry run: every object is valid there.
func TestHelmDryRunApply(t *testing.T) {
	tl := needTools(t)
	env := controlPlane(t)
	a := newApplier(t, env)
	a.create(t, "testdata/servicemonitor-crd.yaml")
	for _, ns := range []string{"drover-system", "fleet"} {
		a.namespace(t, ns)
	}
	cases := []struct {
		name, ns string
		set      []string
		want     []string // kinds that must be there besides the defaults'
	}{
		{name: "defaults", ns: "drover-system"},
		{name: "monitoring and network policy", ns: "drover-system", set: []string{"serviceMonitor.enabled=true", "values:charts/testdata/networkpolicy-values.yaml"}, want: []string{"ServiceMonitor", "NetworkPolicy"}},
		{name: "another namespace, LoadBalancer, no MQTT, no webhook", ns: "fleet", set: []string{"hub.service.type=LoadBalancer", "hub.service.externalTrafficPolicy=Local", "hub.mqtt.enabled=false", "manager.webhook.enabled=false", "hub.extraHosts={hubs.example.com}"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			objs := tl.helmTemplate(t, c.ns, c.set...)
			kinds := map[string]int{}
			for _, o := range objs {
				kinds[o.GetKind()]++
			}
			for _, k := range append([]string{"CustomResourceDefinition", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
				"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Deployment", "StatefulSet", "Service", "PodDisruptionBudget"}, c.want...) {
				if kinds[k] == 0 {
					t.Errorf("no %s rendered (have %v)", k, kinds)
				}
			}
			if !slices.Contains(c.want, "ServiceMonitor") && kinds["ServiceMonitor"] > 0 {
				t.Error("ServiceMonitor rendered while serviceMonitor.enabled is false")
			}
			a.dryRun(t, objs)
			checkWorkloads(t, objs, c.ns)
		})
	}
}

// TestKustomizeDryRunApply builds config/default with kustomize and applies
// it with a server-side dry run; its workloads are the chart's defaults.
func TestKustomizeDryRunApply(t *testing.T) {
	tl := needTools(t)
	env := controlPlane(t)
	a := newApplier(t, env)
	objs := tl.kustomizeBuild(t)
	find(t, objs, "Namespace", "", "drover-system")
	a.dryRun(t, objs)
	checkWorkloads(t, objs, "drover-system")
	checkRBAC(t, objs, "drover-system")

	// The same Deployment, StatefulSet and Services as the chart renders
	// with its defaults, but for the labels Helm adds.
	chart := tl.helmTemplate(t, "drover-system")
	for _, k := range []struct{ kind, name string }{
		{"Deployment", "drover-manager"}, {"StatefulSet", "drover-hub"},
		{"Service", "drover-webhook"}, {"Service", "drover-signer"}, {"Service", "drover-manager-metrics"},
		{"Service", "drover-hub"}, {"Service", "drover-hub-headless"},
		{"PodDisruptionBudget", "drover-manager"}, {"PodDisruptionBudget", "drover-hub"},
	} {
		got := withoutLabels(find(t, objs, k.kind, "drover-system", k.name).Object["spec"])
		want := withoutLabels(find(t, chart, k.kind, "drover-system", k.name).Object["spec"])
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s %s: config/default differs from the chart's defaults:\nkustomize: %v\nhelm:      %v", k.kind, k.name, got, want)
		}
	}
}

// TestChartRBACIsConfigRBAC: the chart grants what config/rbac grants (the
// manifests config/rbac's test checks against a real apiserver), in the
// release's namespace, and nothing else.
func TestChartRBACIsConfigRBAC(t *testing.T) {
	tl := needTools(t)
	for _, ns := range []string{"drover-system", "fleet"} {
		t.Run(ns, func(t *testing.T) {
			checkRBAC(t, tl.helmTemplate(t, ns), ns)
		})
	}
}

// TestFlagsAreTheBinarys runs every rendered container's arguments through
// the real `drover` binary's flag parsing (with --help, so that nothing
// starts): an unknown flag or a bad value fails.
func TestFlagsAreTheBinarys(t *testing.T) {
	tl := needTools(t)
	drover := testenv.Binary(t, "./cmd/drover")
	parses := func(args []string) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, drover, append(slices.Clone(args), "--help")...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("drover %s: %w\n%s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	// The check itself: a flag the binary lacks fails.
	if parses([]string{"manager", "--no-such-flag=1"}) == nil {
		t.Fatal("drover manager --no-such-flag=1 --help passed: the flag check checks nothing")
	}
	sets := map[string][]string{
		"defaults":  nil,
		"all off":   {"hub.mqtt.enabled=false", "manager.webhook.enabled=false", "manager.leaderElect=false", "featureGates=disableNodeTaskV1alpha2=false"},
		"kustomize": nil,
	}
	for name, set := range sets {
		t.Run(name, func(t *testing.T) {
			var objs []*unstructured.Unstructured
			if name == "kustomize" {
				objs = tl.kustomizeBuild(t)
			} else {
				objs = tl.helmTemplate(t, "drover-system", set...)
			}
			for _, w := range []struct{ kind, name string }{{"Deployment", "drover-manager"}, {"StatefulSet", "drover-hub"}} {
				c := container(t, find(t, objs, w.kind, "drover-system", w.name))
				// The kubelet expands $(POD_NAME); a StatefulSet's pod is NAME-N.
				args := slices.Clone(c.Args)
				for i := range args {
					args[i] = strings.ReplaceAll(args[i], "$(POD_NAME)", w.name+"-0")
				}
				if err := parses(args); err != nil {
					t.Errorf("%s %s: %v", w.kind, w.name, err)
				}
			}
		})
	}
}

// TestCRDsAreConfigs: charts/drover/crds is config/crd/bases, byte for byte
// (go generate ./charts copies them).
func TestCRDsAreConfigs(t *testing.T) {
	want, err := filepath.Glob("../config/crd/bases/*.yaml")
	if err != nil || len(want) == 0 {
		t.Fatalf("config/crd/bases: %v (%d files)", err, len(want))
	}
	got, _ := filepath.Glob("drover/crds/*")
	if len(got) != len(want) {
		t.Errorf("charts/drover/crds has %d files, config/crd/bases %d: run go generate ./charts", len(got), len(want))
	}
	for _, w := range want {
		a, _ := os.ReadFile(w)
		b, err := os.ReadFile(filepath.Join("drover", "crds", filepath.Base(w)))
		if err != nil || string(a) != string(b) {
			t.Errorf("charts/drover/crds/%s differs from %s (%v): run go generate ./charts", filepath.Base(w), w, err)
		}
	}
}

// TestKustomizationsListEveryManifest: the Kustomization files of config/
// name every manifest beside them, so a new CRD or role reaches
// `kubectl apply -k config/default`.
func TestKustomizationsListEveryManifest(t *testing.T) {
	for _, c := range []struct{ dir, glob string }{
		{"../config/crd", "bases/*.yaml"}, {"../config/rbac", "*.yaml"}, {"../config/admission", "*.yaml"},
	} {
		b, err := os.ReadFile(filepath.Join(c.dir, "Kustomization"))
		if err != nil {
			t.Fatal(err)
		}
		objs, err := decodeYAML(b)
		if err != nil || len(objs) != 1 {
			t.Fatalf("%s/Kustomization: %v", c.dir, err)
		}
		listed, _, _ := unstructured.NestedStringSlice(objs[0].Object, "resources")
		files, _ := filepath.Glob(filepath.Join(c.dir, c.glob))
		var want []string
		for _, f := range files {
			rel, _ := filepath.Rel(c.dir, f)
			want = append(want, filepath.ToSlash(rel))
		}
		slices.Sort(listed)
		if !slices.Equal(listed, want) {
			t.Errorf("%s/Kustomization lists %v, the directory has %v", c.dir, listed, want)
		}
	}
}

// checkWorkloads checks what the binaries need of the rendered workloads:
// the manager a leader-elected Deployment of 2 with the webhook and signer
// behind Services, hubs a StatefulSet named by their pods, every address
// flag's port declared on the container and every probe on /healthz and
// /readyz, run as config/rbac's ServiceAccounts without root.
func checkWorkloads(t *testing.T, objs []*unstructured.Unstructured, ns string) {
	t.Helper()
	dep := find(t, objs, "Deployment", ns, "drover-manager")
	if r, _, _ := unstructured.NestedInt64(dep.Object, "spec", "replicas"); r != 2 {
		t.Errorf("manager replicas %d, want 2", r)
	}
	mgr := container(t, dep)
	if mgr.Args[0] != "manager" || flag(mgr.Args, "leader-elect") != "true" || flag(mgr.Args, "namespace") != ns {
		t.Errorf("manager args %v: want manager --leader-elect=true --namespace=%s", mgr.Args, ns)
	}
	sts := find(t, objs, "StatefulSet", ns, "drover-hub")
	hub := container(t, sts)
	if hub.Args[0] != "hub" || flag(hub.Args, "hub-name") != "$(POD_NAME)" || flag(hub.Args, "namespace") != ns {
		t.Errorf("hub args %v: want hub --hub-name=$(POD_NAME) --namespace=%s", hub.Args, ns)
	}
	if e := hub.Env["POD_NAME"]; e != "metadata.name" {
		t.Errorf("hub env POD_NAME from %q, want the pod's metadata.name", e)
	}
	if svc, _, _ := unstructured.NestedString(sts.Object, "spec", "serviceName"); svc == "" ||
		!strings.HasPrefix(flag(hub.Args, "hub-hosts"), "$(POD_NAME)."+svc+"."+ns+".svc,") {
		t.Errorf("hub --hub-hosts=%s: the first name (advertised on the hub's Lease) must be the pod's DNS name under serviceName %q", flag(hub.Args, "hub-hosts"), svc)
	} else {
		find(t, objs, "Service", ns, svc)
	}

	// The ServiceAccounts are the ones config/rbac binds.
	for _, w := range []struct {
		obj  *unstructured.Unstructured
		role string
	}{{dep, "drover-manager"}, {sts, "drover-hub"}} {
		sa, _, _ := unstructured.NestedString(w.obj.Object, "spec", "template", "spec", "serviceAccountName")
		if got := boundServiceAccount(t, w.role); sa != got {
			t.Errorf("%s runs as ServiceAccount %q; config/rbac binds ClusterRole %s to %q", w.obj.GetName(), sa, w.role, got)
		}
		find(t, objs, "ServiceAccount", ns, sa)
		nonRoot, _, _ := unstructured.NestedBool(w.obj.Object, "spec", "template", "spec", "securityContext", "runAsNonRoot")
		c := container(t, w.obj)
		if !nonRoot || !c.ReadOnlyRoot || c.PrivEsc {
			t.Errorf("%s: runAsNonRoot %v, readOnlyRootFilesystem %v, allowPrivilegeEscalation %v", w.obj.GetName(), nonRoot, c.ReadOnlyRoot, c.PrivEsc)
		}
		if c.Probes["liveness"] != "/healthz" || c.Probes["readiness"] != "/readyz" ||
			c.ProbePorts["liveness"] != addrPort(t, flag(c.Args, "health-probe-bind-address")) {
			t.Errorf("%s: probes %v on ports %v, want /healthz and /readyz on --health-probe-bind-address=%s", w.obj.GetName(), c.Probes, c.ProbePorts, flag(c.Args, "health-probe-bind-address"))
		}
		if !c.HasLimits {
			t.Errorf("%s: no resources", w.obj.GetName())
		}
	}

	// Every address a binary listens on is a declared container port.
	for _, c := range []struct {
		c     podContainer
		flags map[string]string // flag -> port name
	}{
		{mgr, map[string]string{"health-probe-bind-address": "probes", "metrics-bind-address": "metrics", "webhook-bind-address": "webhook", "signer-bind-address": "signer"}},
		{hub, map[string]string{"health-probe-bind-address": "probes", "metrics-bind-address": "metrics", "hub-listen": "grpc", "mqtt-listen": "mqtt"}},
	} {
		for f, port := range c.flags {
			v := flag(c.c.Args, f)
			if v == "" || v == "0" {
				if _, ok := c.c.Ports[port]; ok {
					t.Errorf("%s: port %s declared while --%s=%q is off", c.c.Name, port, f, v)
				}
				continue
			}
			if got, ok := c.c.Ports[port]; !ok || got != addrPort(t, v) {
				t.Errorf("%s: --%s=%s but container port %q is %d (declared: %v)", c.c.Name, f, v, port, got, ok)
			}
		}
	}

	// --webhook-service and --signer name Services in front of those ports.
	if ws := flag(mgr.Args, "webhook-service"); ws != "" {
		nsName, port, _ := strings.Cut(ws, ":")
		svcNS, name, _ := strings.Cut(nsName, "/")
		p, _ := strconv.Atoi(port)
		checkService(t, find(t, objs, "Service", svcNS, name), int64(p), "webhook", "manager")
	} else if flag(mgr.Args, "webhook-bind-address") != "0" {
		t.Error("the manager serves the webhook without --webhook-service")
	}
	host, port, err := net.SplitHostPort(flag(hub.Args, "signer"))
	if err != nil {
		t.Fatalf("hub --signer=%q: %v", flag(hub.Args, "signer"), err)
	}
	name, rest, _ := strings.Cut(host, ".")
	if !strings.HasPrefix(rest, ns+".") {
		t.Errorf("hub --signer=%s: not a Service of namespace %s", flag(hub.Args, "signer"), ns)
	}
	p, _ := strconv.Atoi(port)
	checkService(t, find(t, objs, "Service", ns, name), int64(p), "signer", "manager")
	if !slices.Contains(strings.Split(flag(mgr.Args, "signer-hosts"), ","), host) {
		t.Errorf("the hubs reach the signer at %s, not in its certificate (--signer-hosts=%s)", host, flag(mgr.Args, "signer-hosts"))
	}
	checkService(t, find(t, objs, "Service", ns, "drover-hub"), addrPort(t, flag(hub.Args, "hub-listen")), "grpc", "hub")

	// PodDisruptionBudgets, if any, select their workload's pods.
	for _, w := range []*unstructured.Unstructured{dep, sts} {
		for _, o := range objs {
			if o.GetKind() != "PodDisruptionBudget" || o.GetName() != w.GetName() {
				continue
			}
			sel, _, _ := unstructured.NestedStringMap(o.Object, "spec", "selector", "matchLabels")
			pods, _, _ := unstructured.NestedStringMap(w.Object, "spec", "template", "metadata", "labels")
			if !isSubset(sel, pods) {
				t.Errorf("PodDisruptionBudget %s selects %v, not the pods of %s %s (%v)", o.GetName(), sel, w.GetKind(), w.GetName(), pods)
			}
		}
	}

	// The ServiceMonitor, if any, selects the metrics Services.
	for _, sm := range objs {
		if sm.GetKind() != "ServiceMonitor" {
			continue
		}
		sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
		var matched []string
		for _, o := range objs {
			if o.GetKind() == "Service" && o.GetNamespace() == ns && isSubset(sel, o.GetLabels()) {
				matched = append(matched, o.GetName())
				ports, _, _ := unstructured.NestedSlice(o.Object, "spec", "ports")
				if !slices.ContainsFunc(ports, func(p any) bool { return p.(map[string]any)["name"] == "metrics" }) {
					t.Errorf("ServiceMonitor selects Service %s, which has no port named metrics", o.GetName())
				}
			}
		}
		slices.Sort(matched)
		if !slices.Equal(matched, []string{"drover-hub-headless", "drover-manager-metrics"}) {
			t.Errorf("ServiceMonitor selects Services %v, want the manager's and the hubs' metrics", matched)
		}
	}
}

func checkService(t *testing.T, svc *unstructured.Unstructured, port int64, target, component string) {
	t.Helper()
	sel, _, _ := unstructured.NestedStringMap(svc.Object, "spec", "selector")
	if sel["app.kubernetes.io/component"] != component {
		t.Errorf("Service %s selects %v, want the %s", svc.GetName(), sel, component)
	}
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	for _, p := range ports {
		m := p.(map[string]any)
		if m["port"] == port && m["targetPort"] == target {
			return
		}
	}
	t.Errorf("Service %s has no port %d -> %s: %v", svc.GetName(), port, target, ports)
}

func isSubset(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}

// podContainer is what the checks read of a workload's only container.
type podContainer struct {
	Name         string
	Args         []string
	Env          map[string]string // name -> fieldPath
	Ports        map[string]int64  // name -> containerPort
	Probes       map[string]string // liveness/readiness -> path
	ProbePorts   map[string]int64
	ReadOnlyRoot bool
	PrivEsc      bool
	HasLimits    bool
}

func container(t *testing.T, o *unstructured.Unstructured) podContainer {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	if len(cs) != 1 {
		t.Fatalf("%s %s has %d containers, want 1", o.GetKind(), o.GetName(), len(cs))
	}
	c := cs[0].(map[string]any)
	pc := podContainer{Env: map[string]string{}, Ports: map[string]int64{}, Probes: map[string]string{}, ProbePorts: map[string]int64{}}
	pc.Name, _, _ = unstructured.NestedString(c, "name")
	pc.Args, _, _ = unstructured.NestedStringSlice(c, "args")
	if len(pc.Args) == 0 {
		t.Fatalf("%s %s: no args", o.GetKind(), o.GetName())
	}
	envs, _, _ := unstructured.NestedSlice(c, "env")
	for _, e := range envs {
		m := e.(map[string]any)
		fp, _, _ := unstructured.NestedString(m, "valueFrom", "fieldRef", "fieldPath")
		pc.Env[m["name"].(string)] = fp
	}
	ports, _, _ := unstructured.NestedSlice(c, "ports")
	for _, p := range ports {
		m := p.(map[string]any)
		pc.Ports[m["name"].(string)] = m["containerPort"].(int64)
	}
	for _, kind := range []string{"liveness", "readiness"} {
		pc.Probes[kind], _, _ = unstructured.NestedString(c, kind+"Probe", "httpGet", "path")
		port, _, _ := unstructured.NestedFieldNoCopy(c, kind+"Probe", "httpGet", "port")
		if name, ok := port.(string); ok {
			pc.ProbePorts[kind] = pc.Ports[name]
		} else if n, ok := port.(int64); ok {
			pc.ProbePorts[kind] = n
		}
	}
	pc.ReadOnlyRoot, _, _ = unstructured.NestedBool(c, "securityContext", "readOnlyRootFilesystem")
	esc, found, _ := unstructured.NestedBool(c, "securityContext", "allowPrivilegeEscalation")
	pc.PrivEsc = esc || !found
	_, pc.HasLimits, _ = unstructured.NestedMap(c, "resources", "limits")
	return pc
}

// flag returns the value of --name=value in args ("" if absent).
func flag(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

func addrPort(t *testing.T, addr string) int64 {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Errorf("address %q: %v", addr, err)
		return -1
	}
	p, err := strconv.ParseInt(port, 10, 32)
	if err != nil {
		t.Errorf("address %q: %v", addr, err)
	}
	return p
}

// configRBAC is config/rbac's objects (but its Namespace).
func configRBAC(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	files, err := rbac.Manifests()
	if err != nil {
		t.Fatal(err)
	}
	var out []*unstructured.Unstructured
	for _, f := range files {
		objs, err := decodeYAML(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if o.GetKind() != "Namespace" {
				out = append(out, o)
			}
		}
	}
	return out
}

// boundServiceAccount is the ServiceAccount config/rbac binds ClusterRole
// role to.
func boundServiceAccount(t *testing.T, role string) string {
	t.Helper()
	for _, o := range configRBAC(t) {
		if o.GetKind() != "ClusterRoleBinding" {
			continue
		}
		if ref, _, _ := unstructured.NestedString(o.Object, "roleRef", "name"); ref != role {
			continue
		}
		subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
		if len(subjects) != 1 {
			t.Fatalf("ClusterRoleBinding %s has %d subjects", o.GetName(), len(subjects))
		}
		return subjects[0].(map[string]any)["name"].(string)
	}
	t.Fatalf("config/rbac binds no ClusterRole %s", role)
	return ""
}

var rbacKinds = []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}

// checkRBAC: the RBAC objects of objs are config/rbac's, with drover-system
// as ns, equal but for labels.
func checkRBAC(t *testing.T, objs []*unstructured.Unstructured, ns string) {
	t.Helper()
	key := func(o *unstructured.Unstructured) string {
		return o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
	}
	want := map[string]any{}
	for _, o := range configRBAC(t) {
		b, _ := o.MarshalJSON()
		s := strings.NewReplacer(`"drover-system"`, strconvQuote(ns), `:drover-system:`, ":"+ns+":").Replace(string(b))
		var c unstructured.Unstructured
		if err := c.UnmarshalJSON([]byte(s)); err != nil {
			t.Fatal(err)
		}
		want[key(&c)] = withoutLabels(c.Object)
	}
	got := map[string]any{}
	for _, o := range objs {
		if slices.Contains(rbacKinds, o.GetKind()) {
			got[key(o)] = withoutLabels(o.Object)
		}
	}
	for k, w := range want {
		g, ok := got[k]
		switch {
		case !ok:
			t.Errorf("%s: in config/rbac, not rendered", k)
		case !reflect.DeepEqual(g, w):
			t.Errorf("%s differs from config/rbac's:\n got: %v\nwant: %v", k, g, w)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: rendered, not in config/rbac (grant nothing config/rbac does not)", k)
		}
	}
	// Aggregation labels are part of what a ClusterRole grants.
	for _, o := range objs {
		if o.GetKind() == "ClusterRole" && o.GetName() == "drover-view" && o.GetLabels()["rbac.authorization.k8s.io/aggregate-to-view"] != "true" {
			t.Error("drover-view lost its aggregate-to-view label")
		}
	}
}

func strconvQuote(s string) string { return strconv.Quote(s) }

// withoutLabels copies v without its "labels" maps (Helm adds its own);
// selectors stay. checkRBAC checks the aggregation labels on their own.
func withoutLabels(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range v {
			if k != "labels" {
				out[k] = withoutLabels(e)
			}
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = withoutLabels(e)
		}
		return out
	default:
		return v
	}
}

// applier applies objects to the control plane with a server-side dry run.
type applier struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func newApplier(t *testing.T, env *testenv.Env) *applier {
	t.Helper()
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return &applier{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}
}

func (a *applier) resource(o *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := o.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", gvk, err)
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		if o.GetNamespace() == "" {
			return nil, fmt.Errorf("%s %s: namespaced, but no namespace in the manifest", gvk.Kind, o.GetName())
		}
		return a.dyn.Resource(m.Resource).Namespace(o.GetNamespace()), nil
	}
	return a.dyn.Resource(m.Resource), nil
}

// dryRun applies every object (server-side apply, dryRun=All), the way
// `kubectl apply --server-side --dry-run=server` does.
func (a *applier) dryRun(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, o := range objs {
		r, err := a.resource(o)
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		if _, err := r.Apply(ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: "drover-chart-test", Force: true, DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Errorf("apply --dry-run=server %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
	}
}

// create creates the objects of a file for real (a CRD the chart needs).
func (a *applier) create(t *testing.T, file string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeYAML(b)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, o := range objs {
		r, err := a.resource(o)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Apply(ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: "drover-chart-test", Force: true}); err != nil {
			t.Fatalf("apply %s: %v", o.GetName(), err)
		}
	}
	// A new kind is served once discovery shows it.
	for _, o := range objs {
		if o.GetKind() != "CustomResourceDefinition" {
			continue
		}
		group, _, _ := unstructured.NestedString(o.Object, "spec", "group")
		kind, _, _ := unstructured.NestedString(o.Object, "spec", "names", "kind")
		testenv.Eventually(t, 60*time.Second, kind+" is served", func(context.Context) (bool, error) {
			a.mapper.Reset()
			_, err := a.mapper.RESTMapping(schema.GroupKind{Group: group, Kind: kind})
			return err == nil, err
		})
	}
}

// namespace creates ns for real: namespaced objects cannot be dry-run
// into a namespace that does not exist.
func (a *applier) namespace(t *testing.T, ns string) {
	t.Helper()
	o := &unstructured.Unstructured{}
	o.SetAPIVersion("v1")
	o.SetKind("Namespace")
	o.SetName(ns)
	r, err := a.resource(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := r.Create(ctx, o, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}
