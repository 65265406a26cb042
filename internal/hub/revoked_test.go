package hub

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
)

// TestRevocationListIsBounded: entries go once their certificates have
// expired, a key listed again keeps the later expiry, and the list refuses
// to grow past MaxRevokedKeys.
func TestRevocationListIsBounded(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientBuilder().WithScheme(testScheme()).Build()
	now := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	read := func() map[string]RevokedKey {
		t.Helper()
		var cm corev1.ConfigMap
		if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: RevokedKeysName}, &cm); err != nil {
			t.Fatal(err)
		}
		return parseRevokedKeys(&cm, now)
	}
	n := &fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{fleetv1.AnnotationRegistrationKey: "k1"}}}
	key, e, ok := RevocationFor(n, now)
	if !ok || key != "k1" || !e.Expires.Equal(now.Add(DefaultCertificateValidity)) {
		t.Fatalf("RevocationFor = %q %+v %v", key, e, ok)
	}
	later := metav1.NewTime(now.Add(2 * DefaultCertificateValidity))
	n.Status.CertificateExpiry = &later
	if _, e, _ := RevocationFor(n, now); !e.Expires.Equal(later.Time) {
		t.Errorf("expiry %v, want the node's later certificate expiry %v", e.Expires, later.Time)
	}
	if _, _, ok := RevocationFor(&fleetv1.FleetNode{}, now); ok {
		t.Error("a node without a recorded key has a revocation")
	}

	if err := RevokeKey(ctx, c, "ns", "k1", RevokedKey{Node: "n1", Revoked: now, Expires: now.Add(time.Hour)}, now); err != nil {
		t.Fatal(err)
	}
	// Listed again with an earlier expiry: the later one stays.
	if err := RevokeKey(ctx, c, "ns", "k1", RevokedKey{Node: "n1", Revoked: now, Expires: now.Add(time.Minute)}, now); err != nil {
		t.Fatal(err)
	}
	if got := read()["k1"]; !got.Expires.Equal(now.Add(time.Hour)) {
		t.Errorf("k1 expires %v, want %v", got.Expires, now.Add(time.Hour))
	}
	// Two hours on, k1's certificates have expired: listing k2 drops it.
	if err := RevokeKey(ctx, c, "ns", "k2", RevokedKey{Node: "n2", Expires: now.Add(3 * time.Hour)}, now.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got := read(); len(got) != 1 || got["k2"].Node != "n2" {
		t.Errorf("list %v, want k2 alone", got)
	}

	// Full: one more is refused with a reason.
	var cm corev1.ConfigMap
	if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: RevokedKeysName}, &cm); err != nil {
		t.Fatal(err)
	}
	for i := range MaxRevokedKeys {
		cm.Data[fmt.Sprintf("full-%d", i)] = `{"node":"x","expires":"2030-01-01T00:00:00Z"}`
	}
	if err := c.Update(ctx, &cm); err != nil {
		t.Fatal(err)
	}
	err := RevokeKey(ctx, c, "ns", "k3", RevokedKey{Node: "n3", Expires: now.Add(time.Hour)}, now)
	if err == nil || !strings.Contains(err.Error(), "rotate Drover's CA") {
		t.Errorf("RevokeKey on a full list = %v, want a refusal saying to rotate the CA", err)
	}
}
