package controlplane

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/drover-fleet/drover/internal/testkit"
)

// tWriter sends log output to t.Log.
type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestStartServeInstallStop runs the one in-process control plane this test
// binary may have (see the package doc): start, serve through the written
// kubeconfig, install CRDs twice (create, then update), refuse a second
// Start, stop on cancel.
func TestStartServeInstallStop(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a real kube-apiserver; run without -short")
	}
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	began := time.Now()
	cp, err := Start(ctx, Options{DataDir: dir, Logger: slog.New(slog.NewTextHandler(tWriter{t}, nil))})
	if err != nil {
		t.Fatalf("Start() = %v", err)
	}
	t.Logf("ready in %s", time.Since(began))

	cfg, err := clientcmd.BuildConfigFromFlags("", cp.KubeconfigPath())
	if err != nil {
		t.Fatalf("load %s: %v", cp.KubeconfigPath(), err)
	}
	cs := kubernetes.NewForConfigOrDie(cfg)
	nss, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list namespaces through the kubeconfig: %v", err)
	}
	if len(nss.Items) == 0 {
		t.Error("no namespaces, want default and kube-system")
	}

	manifests := [][]byte{[]byte(crdA + "---\n" + crdB)}
	if err := InstallCRDs(ctx, cp.RESTConfig(), manifests); err != nil {
		t.Fatalf("InstallCRDs() = %v", err)
	}
	if err := InstallCRDs(ctx, cp.RESTConfig(), manifests); err != nil {
		t.Fatalf("InstallCRDs() again (update) = %v", err)
	}
	dyn := dynamic.NewForConfigOrDie(cp.RESTConfig())
	w := &unstructured.Unstructured{}
	w.SetAPIVersion("example.drover.io/v1")
	w.SetKind("Widget")
	w.SetName("w1")
	if _, err := dyn.Resource(schema.GroupVersionResource{Group: "example.drover.io", Version: "v1", Resource: "widgets"}).Namespace("default").Create(ctx, w, metav1.CreateOptions{}); err != nil {
		t.Errorf("create a Widget right after InstallCRDs: %v", err)
	}

	testGarbageCollector(ctx, t, cs)

	if _, err := Start(ctx, Options{DataDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "one control plane per process") {
		t.Errorf("second Start() = %v, want it refused", err)
	}

	cancel()
	stopBegan := time.Now()
	select {
	case <-cp.Done():
	case <-time.After(time.Minute):
		t.Fatal("control plane still running a minute after cancel")
	}
	if err := cp.Wait(); err != nil {
		t.Errorf("Wait() after cancel = %v, want nil", err)
	}
	t.Logf("stopped in %s", time.Since(stopBegan))
	for _, f := range []string{"kubeconfig", "apiserver.log", "etcd.log", "pki/ca.crt", "etcd/member"} {
		if _, err := os.Stat(dir + "/" + f); err != nil {
			t.Errorf("data dir lacks %s: %v", f, err)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		want string
	}{
		{name: "no data dir", opts: Options{}, want: "DataDir is required"},
		{name: "port out of range", opts: Options{DataDir: "x", APIServerPort: 70000}, want: "not a port"},
		{name: "negative timeout", opts: Options{DataDir: "x", ReadyTimeout: -time.Second}, want: "negative"},
		{name: "valid", opts: Options{DataDir: "x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.opts.validate()
			if tt.want == "" {
				if err != nil {
					t.Errorf("validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("validate() = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestDisabledAdmissionPluginsKeepsWebhooksAndNamespaces(t *testing.T) {
	off := strings.Join(disabledAdmissionPlugins(), ",")
	for _, kept := range keptAdmissionPlugins {
		if strings.Contains(","+off+",", ","+kept+",") {
			t.Errorf("disabled plugins %s include %s, want it kept", off, kept)
		}
	}
	for _, gone := range []string{"ServiceAccount", "ResourceQuota", "LimitRanger"} {
		if !strings.Contains(","+off+",", ","+gone+",") {
			t.Errorf("disabled plugins %s lack %s", off, gone)
		}
	}
}

// testGarbageCollector checks that owner references work as in any cluster:
// the embedded control plane runs kube-controller-manager's collector.
func testGarbageCollector(ctx context.Context, t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	cms := cs.CoreV1().ConfigMaps("default")
	pair := func(name string) (owner, child *corev1.ConfigMap) {
		owner, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		block := true
		child, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name + "-child", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID, BlockOwnerDeletion: &block}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return owner, child
	}
	gone := func(name string) bool {
		_, err := cms.Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		testkit.Eventually(t, testkit.DefaultTimeout, func() string {
			if !ok() {
				return "garbage collector: " + what
			}
			return ""
		})
	}
	for _, tt := range []struct {
		policy    metav1.DeletionPropagation
		childGoes bool
	}{
		{metav1.DeletePropagationBackground, true},
		{metav1.DeletePropagationForeground, true},
		{metav1.DeletePropagationOrphan, false},
	} {
		name := "gc-" + strings.ToLower(string(tt.policy))
		owner, child := pair(name)
		if err := cms.Delete(ctx, owner.Name, metav1.DeleteOptions{PropagationPolicy: &tt.policy}); err != nil {
			t.Fatal(err)
		}
		// Foreground and orphan leave the owner Terminating until the
		// collector has done its part and removed its finalizer.
		waitFor(string(tt.policy)+": the owner is gone", func() bool { return gone(owner.Name) })
		if tt.childGoes {
			waitFor(string(tt.policy)+": the dependent is gone", func() bool { return gone(child.Name) })
			continue
		}
		got, err := cms.Get(ctx, child.Name, metav1.GetOptions{})
		if err != nil || len(got.OwnerReferences) != 0 {
			t.Errorf("orphan: dependent %v, owner references %v; want it kept without them", err, got.GetOwnerReferences())
		}
	}
}
