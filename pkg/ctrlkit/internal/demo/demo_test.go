package demo

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/drover-fleet/drover/pkg/ctrlkit/gen"
)

// The generated file must be what the generator writes today, so that a
// DSL or generator change without go generate fails here.
func TestGeneratedCodeIsUpToDate(t *testing.T) {
	cmd := gen.Command{Getenv: func(string) string { return "demo" }}
	if err := cmd.Run([]string{"check", "-o", "zz_generated.ctrlkit.go", "demo.ctrlkit"}); err != nil {
		t.Fatal(err)
	}
}

func newReconciler(objs ...client.Object) (*AppManagerReconciler, client.Client) {
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(objs...).Build()
	return &AppManagerReconciler{Client: c, NewImpl: NewImpl, Workflow: Workflow}, c
}

var app = types.NamespacedName{Namespace: "ns", Name: "app"}

func appConfigMap() *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: app.Namespace, Name: app.Name, UID: "app-uid"}}
}

func TestReconcileCreatesCredsAndCountsPods(t *testing.T) {
	cm := appConfigMap()
	controller := true
	owned := metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: cm.Name, UID: cm.UID, Controller: &controller}
	pod := func(name string, refs ...metav1.OwnerReference) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{"app": "app"}, OwnerReferences: refs}}
	}
	r, c := newReconciler(cm, pod("mine", owned), pod("stray"))

	res, err := r.Reconcile(t.Context(), reconcile.Request{NamespacedName: app})
	if err != nil || !res.IsZero() {
		t.Fatalf("Reconcile(ns/app) = %+v, %v; want no requeue", res, err)
	}
	var secret corev1.Secret
	if err := c.Get(t.Context(), types.NamespacedName{Namespace: "ns", Name: "app-creds"}, &secret); err != nil {
		t.Fatalf("Reconcile(ns/app) did not create the secret: %v", err)
	}
	if !metav1.IsControlledBy(&secret, cm) {
		t.Errorf("secret owner references = %v, want controlled by the ConfigMap", secret.OwnerReferences)
	}
	var got corev1.ConfigMap
	if err := c.Get(t.Context(), app, &got); err != nil {
		t.Fatal(err)
	}
	if n := got.Annotations[PodCountAnnotation]; n != "1" {
		t.Errorf("pod count = %q, want 1 (the stray pod is not owned)", n)
	}

	// Second pass: the secret exists and is ours, nothing to create.
	if res, err := r.Reconcile(t.Context(), reconcile.Request{NamespacedName: app}); err != nil || !res.IsZero() {
		t.Errorf("second Reconcile(ns/app) = %+v, %v; want no requeue", res, err)
	}
}

func TestReconcileWaitsForPods(t *testing.T) {
	r, _ := newReconciler(appConfigMap())
	res, err := r.Reconcile(t.Context(), reconcile.Request{NamespacedName: app})
	if err != nil || res.RequeueAfter != 30*time.Second {
		t.Errorf("Reconcile(ns/app) without pods = %+v, %v; want a requeue after 30s", res, err)
	}
}

func TestReconcileRefusesSomeoneElsesSecret(t *testing.T) {
	foreign := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "app-creds"}}
	r, _ := newReconciler(appConfigMap(), foreign)
	_, err := r.Reconcile(t.Context(), reconcile.Request{NamespacedName: app})
	if err == nil || !strings.Contains(err.Error(), "EnsureCreds: load state creds: Secret ns/app-creds is not controlled by app") {
		t.Errorf("Reconcile(ns/app) with a foreign secret = %v, want an ownership error", err)
	}
}

func TestReconcileOfAMissingObjectIsANoop(t *testing.T) {
	r, _ := newReconciler()
	if res, err := r.Reconcile(t.Context(), reconcile.Request{NamespacedName: app}); err != nil || !res.IsZero() {
		t.Errorf("Reconcile(ns/app) of a deleted object = %+v, %v; want nothing", res, err)
	}
}
