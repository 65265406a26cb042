package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/manager"
	"github.com/drover-fleet/drover/internal/mqtt/broker"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/testkit"
)

// crlFixture is a cluster (fake) with Drover's CA and a Mosquitto
// directory that trusts it.
type crlFixture struct {
	c   client.WithWatch
	ca  *pki.CA
	dir string
}

func newCRLFixture(t *testing.T) *crlFixture {
	t.Helper()
	ca, err := pki.NewCA("drover-ca", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "drover-system", Name: hub.CASecretName},
		Data: map[string][]byte{corev1.TLSCertKey: ca.CertPEM, corev1.TLSPrivateKeyKey: ca.KeyPEM}}
	f := &crlFixture{c: fake.NewClientBuilder().WithScheme(manager.Scheme()).WithObjects(secret).Build(), ca: ca, dir: t.TempDir()}
	if err := os.WriteFile(filepath.Join(f.dir, "ca.crt"), ca.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// revoke lists a key with one certificate of serial from issuer.
func (f *crlFixture) revoke(t *testing.T, key, serial, issuer string) {
	t.Helper()
	e := hub.RevokedKey{Node: key, Revoked: time.Now(), Expires: time.Now().Add(time.Hour),
		Certificates: []fleetv1.NodeCertificate{{Serial: serial, Issuer: issuer, NotAfter: metav1.NewTime(time.Now().Add(time.Hour))}}}
	if err := hub.RevokeKey(context.Background(), f.c, "drover-system", key, e, time.Now()); err != nil {
		t.Fatal(err)
	}
}

// serials are those crl.pem revokes, by issuer.
func (f *crlFixture) serials() (map[string][]string, error) {
	b, err := broker.ReadCRL(f.dir)
	if err != nil {
		return nil, err
	}
	s, _, err := hub.CRLSerials(b)
	return s, err
}

// TestCRLKeeperWritesOnChange: the CRL is written when the revocation
// list names new certificates of the broker's CA, not otherwise.
func TestCRLKeeperWritesOnChange(t *testing.T) {
	f := newCRLFixture(t)
	k := crlKeeper{c: f.c, ns: "drover-system", dir: f.dir}
	ctx := context.Background()
	// No list yet: an empty CRL, so that the broker admits the CA's certificates.
	if res, err := k.sync(ctx, time.Now()); err != nil || !res.wrote || res.revoked != 0 {
		t.Fatalf("first sync = %+v, %v; want an empty CRL written", res, err)
	}
	if s, err := f.serials(); err != nil || len(s) != 1 || len(s["drover-ca"]) != 0 {
		t.Fatalf("crl.pem revokes %v (%v), want an empty CRL of drover-ca", s, err)
	}
	f.revoke(t, "k1", "a1", "drover-ca")
	f.revoke(t, "k2", "b1", "another-ca") // not the broker's CA: not its CRL
	res, err := k.sync(ctx, time.Now())
	if err != nil || !res.wrote || res.revoked != 1 {
		t.Fatalf("sync after a revocation = %+v, %v; want the CRL written with one certificate", res, err)
	}
	if !strings.Contains(res.String(f.dir, ""), "SIGHUP") {
		t.Errorf("without --pidfile the report %q does not say Mosquitto must be signalled or restarted", res.String(f.dir, ""))
	}
	if s, _ := f.serials(); !slices.Equal(s["drover-ca"], []string{"a1"}) || len(s) != 1 {
		t.Errorf("crl.pem revokes %v, want a1 of drover-ca", s)
	}
	if res, err := k.sync(ctx, time.Now()); err != nil || res.wrote {
		t.Errorf("sync of an unchanged list = %+v, %v; want nothing written", res, err)
	}
	// Half its validity on, the same CRL is signed again.
	if res, err := k.sync(ctx, time.Now().Add(hub.CRLValidity/2+time.Hour)); err != nil || !res.wrote {
		t.Errorf("sync of a half-expired CRL = %+v, %v; want it signed again", res, err)
	}
}

// TestCRLKeeperRefusesACAItCannotSignFor: a broker trusting a CA other
// than the current one (a rotation since mosquitto-config) would refuse
// all its certificates without its CRL; the keeper says what to do and
// leaves the file alone.
func TestCRLKeeperRefusesACAItCannotSignFor(t *testing.T) {
	f := newCRLFixture(t)
	other, err := pki.NewCA("drover-ca-old", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.dir, "ca.crt"), append(f.ca.CertPEM, other.CertPEM...), 0o644); err != nil {
		t.Fatal(err)
	}
	k := crlKeeper{c: f.c, ns: "drover-system", dir: f.dir}
	_, err = k.sync(context.Background(), time.Now())
	if err == nil || !strings.Contains(err.Error(), "mosquitto-config again") {
		t.Errorf("sync = %v, want a refusal saying to run mosquitto-config again", err)
	}
	if b, _ := broker.ReadCRL(f.dir); b != nil {
		t.Errorf("crl.pem written: %q", b)
	}
}

// TestCRLKeeperWatch: --watch writes the CRL again when a key is listed.
func TestCRLKeeperWatch(t *testing.T) {
	f := newCRLFixture(t)
	k := crlKeeper{c: f.c, ns: "drover-system", dir: f.dir}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.watch(ctx, f.c, slog.New(slog.DiscardHandler)) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("watch: %v", err)
		}
	}()
	want := func(serials ...string) func() string {
		return func() string {
			s, err := f.serials()
			if err != nil || !slices.Equal(s["drover-ca"], serials) {
				return fmt.Sprintf("crl.pem revokes %v (%v), want %v", s, err, serials)
			}
			return ""
		}
	}
	testkit.Eventually(t, testkit.DefaultTimeout, want())
	f.revoke(t, "k1", "a1", "drover-ca")
	testkit.Eventually(t, testkit.DefaultTimeout, want("a1"))
	f.revoke(t, "k2", "a2", "drover-ca")
	testkit.Eventually(t, testkit.DefaultTimeout, want("a1", "a2"))
}
