package controlplane

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"os"
	"slices"
	"testing"
	"time"
)

var testNow = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestEnsurePKICreatesWhatTheAPIServerNeeds(t *testing.T) {
	dir := t.TempDir()
	p, err := ensurePKI(dir, testNow)
	if err != nil {
		t.Fatalf("ensurePKI() = %v", err)
	}
	ca := readCert(t, p.files.caCert())
	if !ca.IsCA {
		t.Errorf("ca.crt IsCA = false, want true")
	}
	serving := readCert(t, p.files.servingCert())
	if err := serving.VerifyHostname("127.0.0.1"); err != nil {
		t.Errorf("serving cert VerifyHostname(127.0.0.1) = %v", err)
	}
	if err := serving.VerifyHostname("localhost"); err != nil {
		t.Errorf("serving cert VerifyHostname(localhost) = %v", err)
	}
	admin := readCert(t, p.files.adminCert())
	if admin.Subject.CommonName != AdminUser || !slices.Equal(admin.Subject.Organization, []string{AdminGroup}) {
		t.Errorf("admin cert subject = %v, want CN=%s O=%s", admin.Subject, AdminUser, AdminGroup)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	for name, c := range map[string]*x509.Certificate{"serving": serving, "admin": admin} {
		usage := x509.ExtKeyUsageServerAuth
		if name == "admin" {
			usage = x509.ExtKeyUsageClientAuth
		}
		if _, err := c.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: testNow, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			t.Errorf("%s cert does not verify against the CA: %v", name, err)
		}
	}
	for _, f := range []string{p.files.caKey(), p.files.servingKey(), p.files.adminKey(), p.files.saKey()} {
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s mode = %v, want 0600", f, st.Mode().Perm())
		}
	}
	if _, err := os.Stat(p.files.saPub()); err != nil {
		t.Errorf("sa.pub: %v", err)
	}
}

func TestEnsurePKIReusesOnRestart(t *testing.T) {
	dir := t.TempDir()
	first, err := ensurePKI(dir, testNow)
	if err != nil {
		t.Fatal(err)
	}
	saKey, _ := os.ReadFile(first.files.saKey())
	second, err := ensurePKI(dir, testNow.Add(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first.caPEM, second.caPEM) || !bytes.Equal(first.adminCertPEM, second.adminCertPEM) || !bytes.Equal(first.adminKeyPEM, second.adminKeyPEM) {
		t.Error("second ensurePKI changed the CA or admin pair, want them reused")
	}
	saKey2, _ := os.ReadFile(second.files.saKey())
	if !bytes.Equal(saKey, saKey2) {
		t.Error("second ensurePKI changed the service-account key, want it reused")
	}
}

func TestEnsurePKIRenewsExpiringLeavesButKeepsCA(t *testing.T) {
	dir := t.TempDir()
	first, err := ensurePKI(dir, testNow)
	if err != nil {
		t.Fatal(err)
	}
	later := testNow.Add(leafValidity - leafRenewBefore + time.Hour)
	second, err := ensurePKI(dir, later)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first.caPEM, second.caPEM) {
		t.Error("CA changed, want it kept")
	}
	if bytes.Equal(first.adminCertPEM, second.adminCertPEM) {
		t.Error("admin cert near expiry was kept, want it re-issued")
	}
	if got := readCert(t, second.files.servingCert()).NotAfter; !got.After(later.Add(leafRenewBefore)) {
		t.Errorf("renewed serving cert NotAfter = %v, want well after %v", got, later)
	}
}

func TestEnsurePKIRepairsMismatchedKey(t *testing.T) {
	dir := t.TempDir()
	first, err := ensurePKI(dir, testNow)
	if err != nil {
		t.Fatal(err)
	}
	// A crash between writing a new key and its cert leaves them unpaired.
	other, _ := os.ReadFile(first.files.servingKey())
	if err := os.WriteFile(first.files.adminKey(), other, 0o600); err != nil {
		t.Fatal(err)
	}
	second, err := ensurePKI(dir, testNow)
	if err != nil {
		t.Fatalf("ensurePKI() with a mismatched admin key = %v, want it repaired", err)
	}
	if _, _, err := loadPair(second.files.adminCert(), second.files.adminKey()); err != nil {
		t.Errorf("admin pair after repair: %v", err)
	}
}

func TestEnsurePKINewCAReissuesLeaves(t *testing.T) {
	dir := t.TempDir()
	first, err := ensurePKI(dir, testNow)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(first.files.caCert())
	os.Remove(first.files.caKey())
	second, err := ensurePKI(dir, testNow)
	if err != nil {
		t.Fatal(err)
	}
	ca := readCert(t, second.files.caCert())
	if err := readCert(t, second.files.adminCert()).CheckSignatureFrom(ca); err != nil {
		t.Errorf("admin cert not signed by the new CA: %v", err)
	}
}
