package hub

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol"
)

func nodeCert(serial, issuer string, notAfter time.Time) fleetv1.NodeCertificate {
	return fleetv1.NodeCertificate{Serial: serial, Issuer: issuer, NotAfter: metav1.NewTime(notAfter)}
}

// TestRevocationListsTheNodesCertificates: a revocation lists the node's
// unexpired certificates, lasts until the last expires, and a key listed
// again adds the certificates it lacked.
func TestRevocationListsTheNodesCertificates(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientBuilder().WithScheme(testScheme()).Build()
	now := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	n := &fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{fleetv1.AnnotationRegistrationKey: "k1"}}}
	n.Status.Certificates = []fleetv1.NodeCertificate{
		nodeCert("a0", "ca", now.Add(-time.Minute)),
		nodeCert("a1", "ca", now.Add(time.Hour)),
		nodeCert("a2", "ca", now.Add(DefaultCertificateValidity+time.Hour)),
	}
	_, e, _ := RevocationFor(n, now)
	if got := e.Certificates; len(got) != 2 || got[0].Serial != "a1" || got[1].Serial != "a2" {
		t.Errorf("listed certificates %+v, want the unexpired a1 and a2", got)
	}
	if want := now.Add(DefaultCertificateValidity + time.Hour); !e.Expires.Equal(want) {
		t.Errorf("expires %v, want the last certificate's expiry %v", e.Expires, want)
	}
	if err := RevokeKey(ctx, c, "ns", "k1", e, now); err != nil {
		t.Fatal(err)
	}
	// A hub signed a3 as the node was revoked: listing again adds it.
	again := e
	again.Certificates = []fleetv1.NodeCertificate{nodeCert("a3", "ca", now.Add(2*time.Hour))}
	if err := RevokeKey(ctx, c, "ns", "k1", again, now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: RevokedKeysName}, &cm); err != nil {
		t.Fatal(err)
	}
	got := parseRevokedKeys(&cm, now)["k1"]
	var serials []string
	for _, c := range got.Certificates {
		serials = append(serials, c.Serial)
	}
	if !slices.Equal(serials, []string{"a1", "a2", "a3"}) || !got.Revoked.Equal(now) {
		t.Errorf("entry %+v, want a1, a2, a3 revoked at %v", got, now)
	}
	if !got.covers(again) || got.covers(RevokedKey{Certificates: []fleetv1.NodeCertificate{nodeCert("a4", "ca", now)}}) {
		t.Error("covers() does not tell listed certificates from others")
	}
}

// TestFullRevocationListFitsAConfigMap: an entry lists at most
// maxRevokedCertificates, and a list of the largest entries is refused
// before it outgrows a ConfigMap's 1 MiB.
func TestFullRevocationListFitsAConfigMap(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientBuilder().WithScheme(testScheme()).Build()
	now := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	var certs []fleetv1.NodeCertificate
	for i := range maxRevokedCertificates + 3 {
		certs = append(certs, nodeCert(fmt.Sprintf("%040x", i), strings.Repeat("c", 64), now.Add(time.Hour)))
	}
	largest := func(i int) (string, RevokedKey) {
		return fmt.Sprintf("%064d", i), RevokedKey{Node: fmt.Sprintf("%0*d", protocol.MaxNodeNameBytes, i), Revoked: now, Expires: now.Add(time.Hour), Certificates: certs}
	}
	key, e := largest(0)
	if err := RevokeKey(ctx, c, "ns", key, e, now); err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: RevokedKeysName}, &cm); err != nil {
		t.Fatal(err)
	}
	if got := parseRevokedKeys(&cm, now)[key].Certificates; len(got) != maxRevokedCertificates {
		t.Fatalf("an entry lists %d certificates, want at most %d", len(got), maxRevokedCertificates)
	}
	// Filled with copies of the largest entry, as far as the list takes.
	entry := cm.Data[key]
	size := len(key) + len(entry)
	for i := 1; size+len(key)+len(entry) <= maxRevokedBytes; i++ {
		k, _ := largest(i)
		cm.Data[k] = entry
		size += len(k) + len(entry)
	}
	if err := c.Update(ctx, &cm); err != nil {
		t.Fatal(err)
	}
	key, e = largest(len(cm.Data))
	err := RevokeKey(ctx, c, "ns", key, e, now)
	if err == nil || !strings.Contains(err.Error(), "rotate Drover's CA") {
		t.Fatalf("RevokeKey on a full list = %v, want a refusal saying to rotate the CA", err)
	}
	if size > 1<<20-64<<10 {
		t.Errorf("full list: %d bytes in %d entries, want room under 1 MiB for the rest of the ConfigMap", size, len(cm.Data))
	}
}

// TestCRL: one CRL per CA, signed by it, listing the unexpired revoked
// certificates it issued, and nothing else.
func TestCRL(t *testing.T) {
	now := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	a, err := pki.NewCA("ca-a", now.Add(-time.Hour), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b, err := pki.NewCA("ca-b", now.Add(-time.Hour), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	entry := func(e RevokedKey) string { j, _ := json.Marshal(e); return string(j) }
	cm := &corev1.ConfigMap{Data: map[string]string{
		"k1": entry(RevokedKey{Node: "n1", Revoked: now.Add(-time.Minute), Expires: now.Add(time.Hour), Certificates: []fleetv1.NodeCertificate{
			nodeCert("a1", "ca-a", now.Add(time.Hour)), nodeCert("b1", "ca-b", now.Add(time.Hour)),
			nodeCert("a0", "ca-a", now.Add(-time.Second)), // expired: off the CRL
			nodeCert("c1", "ca-c", now.Add(time.Hour)),    // a CA not asked for
		}}),
		"k2": entry(RevokedKey{Node: "n2", Revoked: now, Expires: now.Add(time.Hour), Certificates: []fleetv1.NodeCertificate{
			nodeCert("a2", "ca-a", now.Add(time.Hour)),
		}}),
		// The entry expired: its certificate did too, whatever it says.
		"k3": entry(RevokedKey{Node: "n3", Revoked: now.Add(-2 * time.Hour), Expires: now, Certificates: []fleetv1.NodeCertificate{
			nodeCert("a3", "ca-a", now.Add(time.Hour)),
		}}),
		"k4": "not json",
	}}
	out, err := CRL([]*pki.CA{a, b}, cm, now)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{"ca-a": {"a1", "a2"}, "ca-b": {"b1"}}
	var issuers []string
	rest := out
	for {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		l, err := x509.ParseRevocationList(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		ca := map[string]*pki.CA{"ca-a": a, "ca-b": b}[l.Issuer.CommonName]
		if ca == nil {
			t.Fatalf("a CRL of %q", l.Issuer.CommonName)
		}
		if err := l.CheckSignatureFrom(ca.Cert); err != nil {
			t.Errorf("CRL of %s: %v", l.Issuer.CommonName, err)
		}
		if !l.NextUpdate.Equal(now.Add(CRLValidity)) || l.ThisUpdate.After(now) {
			t.Errorf("CRL of %s valid %v to %v, want from before %v for %v", l.Issuer.CommonName, l.ThisUpdate, l.NextUpdate, now, CRLValidity)
		}
		var got []string
		for _, e := range l.RevokedCertificateEntries {
			got = append(got, e.SerialNumber.Text(16))
			if e.SerialNumber.Text(16) == "a1" && !e.RevocationTime.Equal(now.Add(-time.Minute)) {
				t.Errorf("a1 revoked at %v, want when its key was listed, %v", e.RevocationTime, now.Add(-time.Minute))
			}
		}
		if !slices.Equal(got, want[l.Issuer.CommonName]) {
			t.Errorf("CRL of %s revokes %v, want %v", l.Issuer.CommonName, got, want[l.Issuer.CommonName])
		}
		issuers = append(issuers, l.Issuer.CommonName)
	}
	if !slices.Equal(issuers, []string{"ca-a", "ca-b"}) {
		t.Errorf("CRLs of %v, want one of each CA", issuers)
	}
	serials, next, err := CRLSerials(out)
	if err != nil || !next.Equal(now.Add(CRLValidity)) || !slices.Equal(serials["ca-a"], want["ca-a"]) || !slices.Equal(serials["ca-b"], want["ca-b"]) {
		t.Errorf("CRLSerials = %v, %v, %v; want %v", serials, next, err, want)
	}
	// Nothing revoked: still one (empty) CRL per CA, else the broker
	// would refuse every certificate of a CA without one.
	empty, err := CRL([]*pki.CA{a, b}, nil, now)
	if err != nil {
		t.Fatal(err)
	}
	if s, _, _ := CRLSerials(empty); len(s) != 2 || len(s["ca-a"])+len(s["ca-b"]) != 0 {
		t.Errorf("CRLs of an empty list: %v, want two empty ones", s)
	}
}
