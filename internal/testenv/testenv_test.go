package testenv_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/drover-fleet/drover/internal/testenv"
)

func TestStartServesNamespacesAndCRDs(t *testing.T) {
	env := testenv.Start(t, testenv.Options{})
	ctx := t.Context()

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "testenv-smoke"}}
	testenv.CreateAndWait(t, env.Client, ns, func(o client.Object) bool {
		return o.(*corev1.Namespace).Status.Phase == corev1.NamespaceActive
	})
	got := &corev1.Namespace{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: ns.Name}, got); err != nil {
		t.Fatalf("Get(namespace %s) = %v, want it", ns.Name, err)
	}
	if got.UID != ns.UID {
		t.Errorf("Get(namespace %s).UID = %s, want %s", ns.Name, got.UID, ns.UID)
	}

	// The CRDs of config/crd/bases were installed and are Established.
	crds := &unstructured.UnstructuredList{}
	crds.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinitionList"})
	if err := env.Client.List(ctx, crds); err != nil {
		t.Fatalf("List(CRDs) = %v", err)
	}
	var names []string
	for _, c := range crds.Items {
		names = append(names, c.GetName())
	}
	if !contains(names, "fleetnodes.fleet.drover.io") {
		t.Errorf("CRDs = %v, want fleetnodes.fleet.drover.io among them", names)
	}

	// The kubeconfig works for kubectl, as users will use it.
	if kubectl, err := exec.LookPath("kubectl"); err == nil {
		out, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", env.Kubeconfig, "get", "namespace", ns.Name, "-o", "name").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "namespace/"+ns.Name {
			t.Errorf("kubectl get namespace %s = %q, %v; want namespace/%s", ns.Name, out, err, ns.Name)
		}
	}
}

func TestRestartKeepsState(t *testing.T) {
	dir := t.TempDir()
	first := testenv.Start(t, testenv.Options{DataDir: dir})
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "survives-restart", Namespace: "default"},
		Data:       map[string]string{"answer": "42"},
	}
	testenv.CreateAndWait(t, first.Client, cm, nil)
	if err := first.Stop(); err != nil {
		t.Fatalf("Stop() = %v, want a clean shutdown", err)
	}

	second := testenv.Start(t, testenv.Options{DataDir: dir})
	got := &corev1.ConfigMap{}
	testenv.WaitFor(t, second.Client, testenv.ShortTimeout, client.ObjectKeyFromObject(cm), got, nil)
	if got.UID != cm.UID || got.Data["answer"] != "42" {
		t.Errorf("after restart: ConfigMap uid=%s data=%v, want uid=%s data=%v", got.UID, got.Data, cm.UID, cm.Data)
	}
	if second.Kubeconfig != first.Kubeconfig {
		t.Errorf("kubeconfig path changed across restart: %s, then %s", first.Kubeconfig, second.Kubeconfig)
	}
}

func TestStartSkipsUnderShort(t *testing.T) {
	if !testing.Short() {
		t.Skip("checks the -short behaviour")
	}
	ran := false
	t.Run("inner", func(t *testing.T) {
		testenv.Start(t, testenv.Options{})
		ran = true
	})
	if ran {
		t.Error("Start returned under -short, want it to skip the test")
	}
}

func TestEventuallyReportsLastError(t *testing.T) {
	ft := &fakeT{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		testenv.Eventually(ft, 3*testenv.PollInterval, "never true", func(context.Context) (bool, error) {
			return false, errString("boom")
		})
	}()
	<-done
	if !strings.Contains(ft.msg, "never true") || !strings.Contains(ft.msg, "boom") {
		t.Errorf("Eventually failure = %q, want it to name the condition and the last error", ft.msg)
	}
}

func TestRepoRootHasGoMod(t *testing.T) {
	root := testenv.RepoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil || !strings.Contains(string(b), "module github.com/drover-fleet/drover") {
		t.Fatalf("RepoRoot() = %q: go.mod there = %v, want Drover's", root, err)
	}
}

type errString string

func (e errString) Error() string { return string(e) }

// fakeT records Fatalf and ends the goroutine like testing.T does.
type fakeT struct {
	testing.TB
	msg string
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
