package hub

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// TestEnsureNamespace: the namespace is read first and created only when
// missing, so a hub with get but not create on namespaces starts.
func TestEnsureNamespace(t *testing.T) {
	const ns = "drover-test"
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "namespaces"}, ns, nil)
	for _, tc := range []struct {
		name                  string
		exists                bool
		getForbidden, mayMake bool
		wantCreate            bool   // a create was attempted
		wantErr               string // "" for none
		wantNS                bool   // the namespace exists afterwards
	}{
		{name: "exists, no create right", exists: true, wantNS: true},
		{name: "missing, created", mayMake: true, wantCreate: true, wantNS: true},
		{name: "missing, no create right", wantCreate: true, wantErr: "may not create it"},
		{name: "cannot read, creates", getForbidden: true, mayMake: true, wantCreate: true, wantNS: true},
		{name: "cannot read, exists", exists: true, getForbidden: true, mayMake: true, wantCreate: true, wantNS: true},
		{name: "cannot read nor create: goes on", exists: true, getForbidden: true, wantCreate: true, wantNS: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scheme := runtime.NewScheme()
			if err := corev1.AddToScheme(scheme); err != nil {
				t.Fatal(err)
			}
			b := fake.NewClientBuilder().WithScheme(scheme)
			if tc.exists {
				b = b.WithObjects(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
			}
			created := false
			c := b.WithInterceptorFuncs(interceptor.Funcs{
				Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
					if tc.getForbidden {
						return forbidden
					}
					return c.Get(ctx, key, obj, opts...)
				},
				Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
					created = true
					if !tc.mayMake {
						return forbidden
					}
					return c.Create(ctx, obj, opts...)
				},
			}).Build()
			err := EnsureNamespace(context.Background(), c, ns)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("EnsureNamespace: %v; want error %q", err, tc.wantErr)
			}
			if created != tc.wantCreate {
				t.Errorf("create attempted = %v, want %v", created, tc.wantCreate)
			}
			tc.getForbidden = false
			err = c.Get(context.Background(), client.ObjectKey{Name: ns}, &corev1.Namespace{})
			if got := err == nil; got != tc.wantNS {
				t.Errorf("namespace exists afterwards = %v (%v), want %v", got, err, tc.wantNS)
			}
		})
	}
}
