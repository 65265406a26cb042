package demo

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/drover-fleet/drover/pkg/ctrlkit"
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
	res, err := r.Reconcile(t.Context(), reconcile.Request{NamespacedName: app})
	if err == nil || !strings.Contains(err.Error(), "EnsureCreds: load state creds: Secret ns/app-creds is not controlled by app") {
		t.Errorf("Reconcile(ns/app) with a foreign secret = %v, want an ownership error", err)
	}
	// CountPods asked for a requeue after 30s (no pods), joined with
	// the error: controller-runtime would ignore it and warn.
	if !res.IsZero() {
		t.Errorf("Reconcile(ns/app) with a foreign secret = %+v beside the error, want a zero result", res)
	}
}

// TestReconcileRunsTheHooks checks the generated reconciler's lifecycle
// hooks: before and after each of the manager's actions, not the Join
// around them, with each action's outcome.
func TestReconcileRunsTheHooks(t *testing.T) {
	var mu sync.Mutex
	var got []string
	r, _ := newReconciler(appConfigMap())
	r.Hooks = ctrlkit.Hooks{
		BeforeAction: func(_ context.Context, action string) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, "before "+action)
		},
		AfterAction: func(_ context.Context, rep ctrlkit.Report) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, "after "+rep.Name+" "+rep.Outcome.String())
		},
	}
	var traced []string
	r.Observer = ctrlkit.ObserverFunc(func(ctx context.Context, a ctrlkit.Action) (context.Context, func(ctrlkit.Report)) {
		mu.Lock()
		defer mu.Unlock()
		traced = append(traced, ctrlkit.NameOf(a))
		return ctx, func(ctrlkit.Report) {}
	})
	if _, err := r.Reconcile(t.Context(), reconcile.Request{NamespacedName: app}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"before EnsureCreds", "after EnsureCreds noRequeue",
		"before CountPods", "after CountPods requeueAfter",
	}
	if !slices.Equal(got, want) {
		t.Errorf("the hooks saw %q, want %q", got, want)
	}
	// The workflow's observer sees each action once too, and the Join.
	if want := []string{"Join", "EnsureCreds", "CountPods"}; !slices.Equal(traced, want) {
		t.Errorf("the observer saw %q, want %q", traced, want)
	}
}

func TestReconcileOfAMissingObjectIsANoop(t *testing.T) {
	r, _ := newReconciler()
	if res, err := r.Reconcile(t.Context(), reconcile.Request{NamespacedName: app}); err != nil || !res.IsZero() {
		t.Errorf("Reconcile(ns/app) of a deleted object = %+v, %v; want nothing", res, err)
	}
}
