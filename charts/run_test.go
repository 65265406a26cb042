package charts

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/testenv"
	"github.com/drover-fleet/drover/internal/testkit"
)

// procTimeout bounds each wait for a process across the control plane
// (a manager, a hub, an agent) on a loaded machine.
const procTimeout = 2 * time.Minute

// TestChartRunsInAnotherNamespace installs the chart with helm in the
// namespace "fleet" and runs what its Deployment and StatefulSet would:
// `drover manager` and `drover hub` with the rendered arguments (addresses
// moved to loopback, $(POD_NAME) as the kubelet would expand it) as the
// chart's ServiceAccounts. Then it follows NOTES.txt: a bootstrap token
// and the CA with the drover CLI, and an agent that joins through the hub
// drover-hub-0. The chart's RBAC, in a namespace config/rbac does not
// name, lets both do their work, and the hub advertises its pod's DNS name.
func TestChartRunsInAnotherNamespace(t *testing.T) {
	tl := needTools(t)
	// Its own control plane: the manager installs the tenancy webhook,
	// which no other test should meet.
	env := testenv.Start(t, testenv.Options{})
	drover := testenv.Binary(t, "./cmd/drover")
	agent := testenv.Binary(t, "./cmd/drover-agent")
	const ns = "fleet"
	ctx := context.Background()

	// A real helm install. --take-ownership: the control plane installed
	// config/rbac and config/admission itself (as someone who applied them
	// by hand before would have); their cluster-wide objects move to the
	// release.
	out := tl.run(t, tl.helm, "install", "drover", "charts/drover", "--namespace", ns, "--create-namespace",
		"--take-ownership", "--kubeconfig", env.Kubeconfig)
	checkNotes(t, out, "drover token create --namespace "+ns, "drover ca --namespace "+ns)
	objs := decode(t, tl.run(t, tl.helm, "get", "manifest", "drover", "--namespace", ns, "--kubeconfig", env.Kubeconfig))
	if got := find(t, objs, "ClusterRoleBinding", "", "drover-hub"); !strings.Contains(fmt.Sprint(got.Object["subjects"]), "namespace:"+ns) {
		t.Errorf("ClusterRoleBinding drover-hub binds %v, want the ServiceAccount in %s", got.Object["subjects"], ns)
	}

	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kubeconfig := func(sa string) string {
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa,
			&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("token of %s: %v", sa, err)
		}
		ca := env.Config.CAData
		if len(ca) == 0 {
			if ca, err = os.ReadFile(env.Config.CAFile); err != nil {
				t.Fatal(err)
			}
		}
		cfg := clientcmdapi.NewConfig()
		cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: env.Config.Host, CertificateAuthorityData: ca}
		cfg.AuthInfos[sa] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
		cfg.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: sa}
		cfg.CurrentContext = "c"
		path := filepath.Join(dir, sa+".kubeconfig")
		if err := clientcmd.WriteToFile(*cfg, path); err != nil {
			t.Fatal(err)
		}
		return path
	}

	dep := find(t, objs, "Deployment", ns, "drover-manager")
	sa, _, _ := unstructured.NestedString(dep.Object, "spec", "template", "spec", "serviceAccountName")
	// No --webhook-service: the kube-apiserver here has no Service network
	// (it would look the Service's name up in DNS); it calls the webhook at
	// its loopback address instead (the --webhook-service flag and its
	// Service are checked by checkWorkloads).
	mgrArgs := local(container(t, dep).Args, map[string]string{"--webhook-service": drop})
	mgr := testkit.StartProc(t, "drover manager", drover, append([]string{"--kubeconfig", kubeconfig(sa)}, mgrArgs...)...)
	signer := mgr.WaitLine(t, regexp.MustCompile(`ready signer=(\S+)`), procTimeout)[1]
	mgr.WaitLine(t, regexp.MustCompile(`ready webhook=(\S+)`), procTimeout)

	sts := find(t, objs, "StatefulSet", ns, "drover-hub")
	sa, _, _ = unstructured.NestedString(sts.Object, "spec", "template", "spec", "serviceAccountName")
	hubArgs := local(container(t, sts).Args, map[string]string{"$(POD_NAME)": "drover-hub-0", "--signer": signer})
	hubProc := testkit.StartProc(t, "drover hub", drover, append([]string{"--kubeconfig", kubeconfig(sa)}, hubArgs...)...)
	hubAddr := hubProc.WaitLine(t, regexp.MustCompile(`ready hub=(\S+)`), procTimeout)[1]

	// NOTES.txt's steps, with the admin's kubeconfig.
	cli := func(args ...string) string {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		var stderr bytes.Buffer
		cmd := exec.CommandContext(cctx, drover, append([]string{"--kubeconfig", env.Kubeconfig}, args...)...)
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("drover %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		return string(out)
	}
	token := strings.TrimSpace(cli("token", "create", "--namespace", ns, "--ttl", "1h", "--auto-approve"))
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, []byte(cli("ca", "--namespace", ns)), 0o600); err != nil {
		t.Fatal(err)
	}
	testkit.StartProc(t, "drover-agent", agent, "--node", "chart-node", "--hub", hubAddr, "--token", token, "--ca-file", caFile,
		"--state-dir", filepath.Join(dir, "agent"), "--work-dir", filepath.Join(dir, "agent-work"))

	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	nodes := dyn.Resource(schema.GroupVersionResource{Group: "fleet.drover.io", Version: "v1alpha1", Resource: "fleetnodes"})
	testenv.Eventually(t, procTimeout, "FleetNode chart-node Online on hub drover-hub-0", func(ctx context.Context) (bool, error) {
		n, err := nodes.Get(ctx, "chart-node", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		phase, _, _ := unstructured.NestedString(n.Object, "status", "phase")
		served, _, _ := unstructured.NestedString(n.Object, "status", "hub")
		if phase != "Online" || served != "drover-hub-0" {
			return false, fmt.Errorf("phase %q, hub %q", phase, served)
		}
		return true, nil
	})

	// The hub's Lease, in the release's namespace, advertises its pod's
	// DNS name (what `drover logs` and the other hubs dial).
	lease, err := cs.CoordinationV1().Leases(ns).Get(ctx, hub.LeaseName("drover-hub-0"), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the hub's Lease: %v", err)
	}
	_, port, _ := strings.Cut(hubAddr, ":")
	if got, want := lease.Annotations[hub.AnnotationHubAddress], "drover-hub-0.drover-hub-headless."+ns+".svc:"+port; got != want {
		t.Errorf("hub Lease advertises %q, want %q", got, want)
	}
	if _, err := cs.CoordinationV1().Leases(ns).Get(ctx, "drover-manager", metav1.GetOptions{}); err != nil {
		t.Errorf("the manager's leader-election Lease: %v", err)
	}
	// Neither was refused anything by the chart's RBAC.
	forbidden := regexp.MustCompile(`(?i)forbidden|cannot (get|list|watch|create|update|patch|delete)`)
	for _, p := range []*testkit.Proc{mgr, hubProc} {
		if m := testkit.GrepLines(p.Output(), forbidden); m != "" {
			t.Errorf("%s was refused something:\n%s", p.Name, m)
		}
	}
}

// drop as a value of local's repl leaves the flag out.
const drop = "\x00drop"

// local rewrites a rendered container's arguments to run here: every
// address on loopback with a free port, values of repl for whole flags
// ("--signer", or drop) or substrings ("$(POD_NAME)"), and 127.0.0.1 added
// to the hub's and the signer's certificate names (dialled there here).
func local(args []string, repl map[string]string) []string {
	addrFlags := map[string]bool{"--health-probe-bind-address": true, "--metrics-bind-address": true, "--webhook-bind-address": true,
		"--signer-bind-address": true, "--hub-listen": true, "--mqtt-listen": true}
	out := make([]string, 0, len(args))
	for _, a := range args {
		name, value, hasValue := strings.Cut(a, "=")
		switch {
		case hasValue && addrFlags[name] && value != "" && value != "0":
			a = name + "=127.0.0.1:0"
		case hasValue && repl[name] == drop:
			continue
		case hasValue && repl[name] != "":
			a = name + "=" + repl[name]
		case name == "--hub-hosts" || name == "--signer-hosts":
			a += ",127.0.0.1"
		}
		for from, to := range repl {
			if !strings.HasPrefix(from, "--") {
				a = strings.ReplaceAll(a, from, to)
			}
		}
		out = append(out, a)
	}
	return out
}
