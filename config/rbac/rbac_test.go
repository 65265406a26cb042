package rbac_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	"github.com/drover-fleet/drover/config/rbac"
	"github.com/drover-fleet/drover/internal/bootstrap"
	"github.com/drover-fleet/drover/internal/manager"
	"github.com/drover-fleet/drover/internal/testenv"
	"github.com/drover-fleet/drover/internal/testkit"
)

const (
	ns         = "drover-system"
	hubSA      = "system:serviceaccount:drover-system:drover-hub"
	managerSA  = "system:serviceaccount:drover-system:drover-manager"
	logReader  = "log-reader"
	viewer     = "viewer"
	editor     = "editor"
	runTimeout = 2 * time.Minute
)

// apply creates every object of the manifests.
func apply(t *testing.T, c client.Client) {
	t.Helper()
	files, err := rbac.Manifests()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(f), 4096)
		for {
			var u unstructured.Unstructured
			if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatal(err)
			}
			if len(u.Object) == 0 {
				continue
			}
			// `drover controlplane` installs them too: then they must be
			// there already.
			if err := c.Create(context.Background(), &u); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatalf("create %s %s: %v", u.GetKind(), u.GetName(), err)
			}
		}
	}
}

func TestRBAC(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Scheme: manager.Scheme()})
	ctx := context.Background()
	apply(t, env.Client)
	// A person allowed to read task logs in namespace team-a only.
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "logs", Namespace: "team-a"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "drover-task-log-reader"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: logReader}},
	}); err != nil {
		t.Fatal(err)
	}

	// People bound to the built-in view and edit roles in team-a.
	for user, role := range map[string]string{viewer: "view", editor: "edit"} {
		if err := env.Client.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: user, Namespace: "team-a"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}},
		}); err != nil {
			t.Fatal(err)
		}
	}
	// The aggregation controller adds drover-view's and drover-edit's rules
	// to view and edit soon after the control plane starts.
	testenv.Eventually(t, 30*time.Second, "view and edit aggregate drover-view and drover-edit", func(ctx context.Context) (bool, error) {
		for user, verb := range map[string]string{viewer: "list", editor: "create"} {
			sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{User: user,
				ResourceAttributes: &authzv1.ResourceAttributes{Namespace: "team-a", Verb: verb, Group: batchv1.GroupVersion.Group, Resource: "fleetjobs"}}}
			if err := env.Client.Create(ctx, sar); err != nil {
				return false, err
			}
			if !sar.Status.Allowed {
				return false, fmt.Errorf("%s may not %s fleetjobs yet", user, verb)
			}
		}
		return true, nil
	})

	t.Run("SubjectAccessReview", func(t *testing.T) {
		type check struct {
			user                  string
			verb, group, resource string
			namespace, name       string
			allowed               bool
		}
		var (
			batch = batchv1.GroupVersion.Group
			fleet = fleetv1.GroupVersion.Group
			ops   = "operations.drover.io"
			apps  = "serverless.drover.io"
		)
		checks := []check{
			// The hub: what it needs.
			{hubSA, "create", fleet, "fleetnodes", "", "", true},
			{hubSA, "watch", fleet, "fleetnodes", "", "", true},
			{hubSA, "patch", fleet, "fleetnodes/status", "", "", true},
			{hubSA, "list", batch, "tasks", "", "", true},
			{hubSA, "patch", batch, "tasks", "team-a", "", true},
			{hubSA, "patch", batch, "tasks/status", "team-a", "", true},
			{hubSA, "update", ops, "nodetaskslices", "", "", true},
			{hubSA, "watch", ops, "imageprepulljobs", "", "", true},
			{hubSA, "create", "authentication.k8s.io", "tokenreviews", "", "", false}, // hubs take no tokens
			{hubSA, "create", "authorization.k8s.io", "subjectaccessreviews", "", "", true},
			{hubSA, "get", "", "configmaps", "kube-system", "extension-apiserver-authentication", true},
			{hubSA, "create", fleet, "fleetnodes/certificate", "", "", true}, // asks the manager's signer
			{hubSA, "get", "", "configmaps", ns, "drover-ca-bundle", true},
			{hubSA, "watch", "", "configmaps", ns, "drover-revoked-keys", true},
			{hubSA, "update", "", "configmaps", ns, "drover-revoked-keys", true},
			{hubSA, "update", "", "configmaps", ns, "kube-root-ca.crt", false},
			{hubSA, "update", "coordination.k8s.io", "leases", ns, "drover-hub-a", true},
			{hubSA, "create", "events.k8s.io", "events", "team-a", "", true},
			{hubSA, "get", "", "namespaces", "", ns, true},
			// The hub: what it must not do.
			{hubSA, "delete", batch, "fleetjobs", "team-a", "", false},
			{hubSA, "update", batch, "fleetjobs", "team-a", "", false},
			{hubSA, "create", batch, "tasks", "team-a", "", false},
			{hubSA, "delete", batch, "tasks", "team-a", "", false},
			{hubSA, "update", fleet, "fleetnodes", "", "", false}, // approving a node is a person's call
			{hubSA, "patch", fleet, "fleetnodes", "", "", false},  // an agent's labels reach a node only as approved
			{hubSA, "delete", fleet, "fleetnodes", "", "", false},
			{hubSA, "update", ops, "nodeupgradejobs/status", "", "", false},
			{hubSA, "delete", ops, "nodetaskslices", "", "", false},
			{hubSA, "get", "", "secrets", "default", "regcred", false}, // until bound per namespace
			{hubSA, "get", "", "secrets", ns, "drover-ca", false},      // the signer holds the CA key
			{hubSA, "list", "", "secrets", ns, "", false},              // nor bootstrap tokens
			{hubSA, "create", "", "secrets", ns, "", false},
			{hubSA, "update", "", "configmaps", ns, "drover-ca-bundle", false},
			{hubSA, "list", "", "secrets", "kube-system", "", false},
			{hubSA, "get", "", "configmaps", "kube-system", "kubeadm-config", false},
			{hubSA, "update", "coordination.k8s.io", "leases", "kube-system", "kube-scheduler", false},
			{hubSA, "delete", "", "namespaces", "", "team-a", false},
			{hubSA, "create", "", "namespaces", "", "", false}, // made at install (00_namespace.yaml)
			{hubSA, "get", "", "namespaces", "", "team-a", false},
			// The manager: what it needs.
			{managerSA, "create", batch, "taskgroups", "team-a", "", true},
			{managerSA, "update", batch, "taskgroups", "team-a", "", true},
			{managerSA, "create", batch, "tasks", "team-a", "", true},
			{managerSA, "delete", batch, "tasks", "team-a", "", true},
			{managerSA, "update", batch, "fleetjobs/status", "team-a", "", true},
			{managerSA, "update", batch, "tasks/status", "team-a", "", true},
			{managerSA, "update", batch, "fleetjobs/finalizers", "team-a", "", true},
			{managerSA, "create", ops, "nodetaskslices", "", "", true},
			{managerSA, "update", ops, "nodeupgradejobs/status", "", "", true},
			{managerSA, "patch", fleet, "fleetnodes/status", "", "", true},
			{managerSA, "watch", fleet, "nodegrants", "", "", true},
			{managerSA, "list", "", "namespaces", "", "", true},
			{managerSA, "patch", fleet, "fleetnodes", "", "", true}, // approved labels into metadata.labels
			{managerSA, "get", "coordination.k8s.io", "leases", ns, "drover-hub-a", true},
			{managerSA, "create", "coordination.k8s.io", "leases", ns, "", true},
			{managerSA, "create", "", "events", ns, "", true},
			{managerSA, "watch", fleet, "nodegrants", "", "", true},
			{managerSA, "watch", "", "namespaces", "", "", true},
			{managerSA, "create", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", "", true},
			{managerSA, "update", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", "drover-tenancy", true},
			{managerSA, "get", "", "secrets", ns, "drover-webhook-tls", true},
			{managerSA, "get", "", "secrets", ns, "drover-ca", true}, // the signer
			{managerSA, "watch", "", "secrets", ns, "", true},        // bootstrap tokens, cached
			{managerSA, "create", "authentication.k8s.io", "tokenreviews", "", "", true},
			{managerSA, "create", "authorization.k8s.io", "subjectaccessreviews", "", "", true},
			{managerSA, "update", "", "configmaps", ns, "drover-ca-bundle", true},
			{managerSA, "watch", "", "configmaps", ns, "drover-revoked-keys", true},
			{managerSA, "update", "", "secrets", ns, "drover-webhook-tls", true},
			{managerSA, "watch", apps, "applications", "", "", true},
			{managerSA, "update", apps, "applications/status", "team-a", "", true},
			{managerSA, "create", apps, "instanceslices", "team-a", "", true},
			{managerSA, "update", apps, "instanceslices", "team-a", "", true},
			{managerSA, "update", apps, "applicationsessions", "team-a", "", true}, // binds a session
			{managerSA, "patch", apps, "applicationsessions", "team-a", "", true},  // removes its finalizer
			{managerSA, "update", apps, "applicationsessions/status", "team-a", "", true},
			{managerSA, "update", apps, "applications/finalizers", "team-a", "", true},
			// The manager: what it must not do.
			{managerSA, "delete", batch, "fleetjobs", "team-a", "", false},
			{managerSA, "patch", batch, "tasks", "team-a", "", false}, // the hub's finalizer
			{managerSA, "create", fleet, "fleetnodes", "", "", false},
			{managerSA, "update", "", "secrets", ns, "drover-ca", false}, // rotating it is an operator's call
			{managerSA, "list", "", "secrets", "kube-system", "", false},
			{managerSA, "update", "", "configmaps", ns, "drover-revoked-keys", false},
			{managerSA, "update", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", "other", false},
			{managerSA, "delete", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", "drover-tenancy", false},
			{managerSA, "create", fleet, "nodegrants", "", "", false},
			{managerSA, "delete", apps, "applications", "team-a", "", false},
			{managerSA, "update", apps, "instanceslices/status", "team-a", "", false}, // the hubs'
			{managerSA, "create", "", "namespaces", "", "", false},
			{managerSA, "update", "coordination.k8s.io", "leases", "kube-system", "kube-controller-manager", false},
			// A person bound to drover-task-log-reader in team-a.
			{logReader, "get", batch, "tasks/log", "team-a", "scan-0", true},
			{logReader, "get", batch, "tasks/log", "default", "scan-0", false},
			{logReader, "delete", batch, "tasks", "team-a", "scan-0", false},
			// People bound to view and edit in team-a (aggregated roles).
			{viewer, "list", batch, "fleetjobs", "team-a", "", true},
			{viewer, "watch", batch, "tasks", "team-a", "", true},
			{viewer, "get", batch, "tasks/log", "team-a", "scan-0", true},
			{viewer, "create", batch, "fleetjobs", "team-a", "", false},
			{viewer, "list", batch, "tasks", "default", "", false},
			{editor, "create", batch, "fleetjobs", "team-a", "", true},
			{editor, "delete", batch, "tasks", "team-a", "scan-0", true},
			{editor, "update", batch, "tasks/status", "team-a", "scan-0", false},
			{editor, "create", ops, "nodeupgradejobs", "", "", false},
			{viewer, "watch", apps, "instanceslices", "team-a", "", true},
			{viewer, "create", apps, "applicationsessions", "team-a", "", false},
			{editor, "create", apps, "applications", "team-a", "", true},
			{editor, "delete", apps, "applicationsessions", "team-a", "", true},
			{editor, "update", apps, "instanceslices", "team-a", "", false},
		}
		for _, c := range checks {
			resource, sub, _ := strings.Cut(c.resource, "/")
			sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
				User: c.user,
				ResourceAttributes: &authzv1.ResourceAttributes{Namespace: c.namespace, Verb: c.verb, Group: c.group,
					Resource: resource, Subresource: sub, Name: c.name},
			}}
			if strings.HasPrefix(c.user, "system:serviceaccount:") {
				sar.Spec.Groups = []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
			}
			if err := env.Client.Create(ctx, sar); err != nil {
				t.Fatal(err)
			}
			if sar.Status.Allowed != c.allowed {
				t.Errorf("%s %s %s.%s %s/%s: allowed = %v, want %v (%s)", c.user, c.verb, c.resource, c.group,
					c.namespace, c.name, sar.Status.Allowed, c.allowed, sar.Status.Reason)
			}
		}
	})

	t.Run("manager, hub and agent as the ServiceAccounts", func(t *testing.T) {
		runAsServiceAccounts(t, env)
	})
}

// runAsServiceAccounts runs `drover manager` and `drover hub` with the
// tokens of their ServiceAccounts, and an agent through that hub; a task
// runs end to end and `drover logs` reads it through the hub. Neither
// process may have been refused anything.
func runAsServiceAccounts(t *testing.T, env *testenv.Env) {
	if testing.Short() {
		t.Skip(testenv.SkipReason)
	}
	ctx := context.Background()
	drover := testenv.Binary(t, "./cmd/drover")
	agent := testenv.Binary(t, "./cmd/drover-agent")
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kubeconfig := func(namespace, sa string) string {
		tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, sa,
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

	mgr := testkit.StartProc(t, "drover manager", drover, "--kubeconfig", kubeconfig(ns, "drover-manager"), "manager",
		"--metrics-bind-address", "0", "--leader-elect", "--webhook-bind-address", "127.0.0.1:0",
		"--signer-bind-address", "127.0.0.1:0")
	signerAddr := mgr.WaitLine(t, regexp.MustCompile(`ready signer=(\S+)`), runTimeout)[1]
	// The embedded MQTT broker too: its certificates come from the signer.
	hub := testkit.StartProc(t, "drover hub", drover, "--kubeconfig", kubeconfig(ns, "drover-hub"), "hub",
		"--hub-name", "rbac", "--hub-listen", "127.0.0.1:0", "--mqtt-listen", "127.0.0.1:0", "--metrics-bind-address", "0",
		"--heartbeat-interval", "1s", "--offline-timeout", "20s", "--signer", signerAddr)
	addr := hub.WaitLine(t, regexp.MustCompile(`ready hub=(\S+)`), runTimeout)[1]

	// An agent registers through the hub with an auto-approve token.
	tok, err := bootstrap.Generate()
	if err != nil {
		t.Fatal(err)
	}
	tok.AutoApprove = true
	if err := bootstrap.Create(ctx, env.Client, ns, tok); err != nil {
		t.Fatal(err)
	}
	var caSecret corev1.Secret
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "drover-ca"}, &caSecret); err != nil {
		t.Fatalf("the manager's signer did not create Drover's CA: %v", err)
	}
	caFile := filepath.Join(dir, "drover-ca.crt")
	if err := os.WriteFile(caFile, caSecret.Data[corev1.TLSCertKey], 0o600); err != nil {
		t.Fatal(err)
	}
	// The task runs as nobody: its dir must be reachable, unlike the
	// test's own 0700 temp dir.
	work, err := os.MkdirTemp("", "drover-rbac-work-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(work) })
	if err := os.Chmod(work, 0o711); err != nil {
		t.Fatal(err)
	}
	testkit.StartProc(t, "drover-agent", agent, "--node", "rbac-node", "--hub", addr, "--token", tok.String(), "--ca-file", caFile,
		"--state-dir", filepath.Join(dir, "agent"), "--work-dir", filepath.Join(work, "agent"), "--labels", "kind=rbac", "--heartbeat-interval", "1s")

	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "rbac-tasks"}}); err != nil {
		t.Fatal(err)
	}
	// The manager's tenancy webhook admits work only where a NodeGrant
	// allows it.
	mgr.WaitLine(t, regexp.MustCompile(`ready webhook=(\S+)`), runTimeout)
	if err := env.Client.Create(ctx, &fleetv1.NodeGrant{ObjectMeta: metav1.ObjectMeta{Name: "rbac-tasks"},
		Spec: fleetv1.NodeGrantSpec{Namespaces: []string{"rbac-tasks"}}}); err != nil {
		t.Fatal(err)
	}
	job := &batchv1.FleetJob{
		ObjectMeta: metav1.ObjectMeta{Name: "rbac", Namespace: "rbac-tasks"},
		Spec: batchv1.FleetJobSpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kind": "rbac"}},
			TaskGroups: []batchv1.TaskGroupTemplate{{Name: "g", Count: 1, Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{
				// Running past the hub's finalizer delay, so that deleting it
				// below makes the hub let it go (and record an Event).
				Command: []string{"sh", "-c", "echo ran as the drover service accounts; sleep 1"}}}}},
		},
	}
	if err := env.Client.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, runTimeout, "the task completes", func(ctx context.Context) (bool, error) {
		var task batchv1.Task
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "rbac-tasks", Name: "rbac-g-0"}, &task); err != nil {
			return false, err
		}
		switch task.Status.State {
		case batchv1.TaskCompleted:
			return true, nil
		case batchv1.TaskFailed:
			t.Fatalf("the task failed: %+v", task.Status)
		}
		return false, fmt.Errorf("task state %q", task.Status.State)
	})
	var node fleetv1.FleetNode
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "rbac-node"}, &node); err != nil || node.Status.Phase != fleetv1.FleetNodeOnline || node.Status.Hub != "rbac" {
		t.Errorf("FleetNode rbac-node: phase %q hub %q (%v); want Online on hub rbac", node.Status.Phase, node.Status.Hub, err)
	}
	// The admin's client certificate: the hub trusts the kube-apiserver's
	// client CA (kube-system ConfigMap) and asks a SubjectAccessReview.
	out, err := exec.Command(drover, "--kubeconfig", env.Kubeconfig, "logs", "-n", "rbac-tasks", "rbac-g-0").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ran as the drover service accounts") {
		t.Errorf("drover logs: %v\n%s", err, out)
	}
	// A node job: the manager creates its NodeTaskSlices and writes its
	// status, the hub writes the agent's report (the pull fails: nothing
	// listens there) into the slice. A node that never reported would be
	// Unknown after the job's timeout (300 s), not Failure.
	pull := &opsv1.ImagePrePullJob{ObjectMeta: metav1.ObjectMeta{Name: "rbac-pull"}, Spec: opsv1.ImagePrePullJobSpec{
		NodeNames: []string{"rbac-node"}, Images: []string{"127.0.0.1:1/drover/none:v1"}}}
	if err := env.Client.Create(ctx, pull); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, runTimeout, "the node job ends with the agent's report", func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pull), pull); err != nil {
			return false, err
		}
		st := pull.Status
		if st.Phase != opsv1.JobPhaseFailure || st.Counts.Failure != 1 {
			return false, fmt.Errorf("job phase %q, counts %+v", st.Phase, st.Counts)
		}
		return true, nil
	})
	// Someone who may read task logs in rbac-tasks and find hubs, and
	// nothing else, with a bearer token: the manager's signer reviews it
	// and signs an operator certificate, which the hub takes (the token
	// never reaches the hub; hubs may not create TokenReviews).
	reader := []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "rbac-tasks", Name: "reader"}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "rbac-tasks", Name: "reader-logs"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "drover-task-log-reader"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "rbac-tasks", Name: "reader"}}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "reader-hub-locator"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "drover-hub-locator"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "rbac-tasks", Name: "reader"}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "reader-hub-locator"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "drover-hub-locator"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "rbac-tasks", Name: "reader"}}},
	}
	for _, o := range reader {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	// Without --ca-file: the reader gets Drover's CA certificates from
	// the public bundle, not from the Secret (which it may not read).
	out, err = exec.Command(drover, "--kubeconfig", kubeconfig("rbac-tasks", "reader"), "logs", "-n", "rbac-tasks", "rbac-g-0").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ran as the drover service accounts") {
		t.Errorf("drover logs as a log reader: %v\n%s", err, out)
	}
	// Both record Events, sent in the background: the manager on the job,
	// the hub when it lets a deleted Task go. (The job has Completed: the
	// task is not made again.)
	if err := env.Client.Delete(ctx, &batchv1.Task{ObjectMeta: metav1.ObjectMeta{Namespace: "rbac-tasks", Name: "rbac-g-0"}}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, runTimeout, "Events from the manager and the hub", func(ctx context.Context) (bool, error) {
		l, err := cs.EventsV1().Events("rbac-tasks").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		from := map[string]bool{}
		for _, e := range l.Items {
			from[e.ReportingController] = true
		}
		if !from["drover-manager"] || !from["drover-hub"] {
			return false, fmt.Errorf("events from %v; want drover-manager and drover-hub", from)
		}
		return true, nil
	})
	// The manager is the leader (its Lease) and the hub renews its own.
	for _, lease := range []string{"drover-manager", "drover-hub-rbac"} {
		var l unstructured.Unstructured
		l.SetAPIVersion("coordination.k8s.io/v1")
		l.SetKind("Lease")
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: lease}, &l); err != nil {
			t.Errorf("Lease %s: %v", lease, err)
		}
	}
	// The hub may neither label a node (what an agent reports reaches
	// metadata.labels only as approved, by the manager) nor approve, revoke
	// or cordon it.
	hubCfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig(ns, "drover-hub"))
	if err != nil {
		t.Fatal(err)
	}
	asHub, err := client.New(hubCfg, client.Options{Scheme: env.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	// The hub holds no CA key and reads no token; registration and
	// renewal go through the manager's signer.
	checkHubHoldsNoCA(t, asHub)
	registerAndRenew(t, addr, pool(t, caSecret.Data[corev1.TLSCertKey]), tok.String(), "rbac-renewed")
	patchNode := func(p string) error {
		n := &fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: "rbac-node"}}
		return asHub.Patch(ctx, n, client.RawPatch(types.MergePatchType, []byte(p)))
	}
	for _, p := range []string{`{"metadata":{"labels":{"pool":"gpu"}}}`, `{"spec":{"unschedulable":true}}`} {
		if err := patchNode(p); !apierrors.IsForbidden(err) {
			t.Errorf("the hub patching a node with %s: %v, want forbidden", p, err)
		}
	}
	// The manager carried the labels the agent registered with, approved by
	// the auto-approve token, into metadata.labels.
	testenv.Eventually(t, runTimeout, "the agent's approved label on the node", func(ctx context.Context) (bool, error) {
		var n fleetv1.FleetNode
		if err := env.Client.Get(ctx, client.ObjectKey{Name: "rbac-node"}, &n); err != nil {
			return false, err
		}
		if n.Spec.ApprovedLabels["kind"] != "rbac" || n.Labels["kind"] != "rbac" {
			return false, fmt.Errorf("approved labels %v, labels %v", n.Spec.ApprovedLabels, n.Labels)
		}
		return true, nil
	})
	for _, p := range []*testkit.Proc{mgr, hub} {
		if re := regexp.MustCompile(`(?i)forbidden|cannot (get|list|watch|create|update|patch) resource`); re.MatchString(p.Output()) {
			t.Errorf("%s was refused something:\n%s", p.Name, testkit.GrepLines(p.Output(), re))
		}
	}
}

func pool(t *testing.T, pemCerts []byte) *x509.CertPool {
	t.Helper()
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(pemCerts) {
		t.Fatal("no CA certificate")
	}
	return p
}
