package pki

import (
	"crypto/x509"
	"strings"
	"testing"
	"time"
)

func TestSignClientCSR(t *testing.T) {
	now := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	ca, err := NewCA("drover-ca", now, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	_, csr, err := NewKeyAndCSR("node-a")
	if err != nil {
		t.Fatal(err)
	}

	der, err := ca.SignClientCSR(csr, "node-a", now, time.Hour)
	if err != nil {
		t.Fatalf("SignClientCSR(node-a) = %v, want nil", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("signed certificate does not verify against the CA: %v", err)
	}
	if cert.Subject.CommonName != "node-a" {
		t.Errorf("CN = %q, want node-a", cert.Subject.CommonName)
	}

	if _, err := ca.SignClientCSR(csr, "node-b", now, time.Hour); err == nil || !strings.Contains(err.Error(), `not node "node-b"`) {
		t.Errorf("SignClientCSR(request for node-a, as node-b) = %v, want a CN mismatch error", err)
	}
	if _, err := ca.SignClientCSR([]byte("garbage"), "node-a", now, time.Hour); err == nil {
		t.Error("SignClientCSR(garbage) = nil, want error")
	}
}

func TestParseCARoundTrip(t *testing.T) {
	now := time.Now()
	ca, err := NewCA("drover-ca", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	again, err := ParseCA(ca.CertPEM, ca.KeyPEM)
	if err != nil {
		t.Fatalf("ParseCA(NewCA()) = %v", err)
	}
	certPEM, _, err := again.IssueServing("hub", []string{"127.0.0.1", "localhost"}, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ParseCert(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: "localhost"}); err != nil {
		t.Errorf("serving certificate from the re-parsed CA does not verify: %v", err)
	}
	if _, err := ParseCA(certPEM, ca.KeyPEM); err == nil {
		t.Error("ParseCA(non-CA certificate) = nil, want error")
	}
}

// TestKeyFingerprintMatchesTheRequest: the key hash a hub records at
// registration (from the request) is the one it finds in every certificate
// signed for that key, and another key's certificate differs.
func TestKeyFingerprintMatchesTheRequest(t *testing.T) {
	now := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	ca, err := NewCA("drover-ca", now, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	_, csr, err := NewKeyAndCSR("node-a")
	if err != nil {
		t.Fatal(err)
	}
	want, err := CSRKeyFingerprint(csr)
	if err != nil {
		t.Fatal(err)
	}
	der, err := ca.SignClientCSR(csr, "node-a", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	if got := KeyFingerprint(cert); got != want {
		t.Errorf("KeyFingerprint(certificate) = %s, want the request's %s", got, want)
	}
	if got := CertPEMKeyFingerprint(EncodeCert(der)); got != want {
		t.Errorf("CertPEMKeyFingerprint = %s, want %s", got, want)
	}
	if got := CertPEMKeyFingerprint([]byte("garbage")); got != "" {
		t.Errorf("CertPEMKeyFingerprint(garbage) = %q, want empty", got)
	}
	_, other, err := NewKeyAndCSR("node-a")
	if err != nil {
		t.Fatal(err)
	}
	if fp, _ := CSRKeyFingerprint(other); fp == want {
		t.Error("two keys share a fingerprint")
	}
}

// TestCrossSignChainsANewCAToTheOld: a peer that trusts only the old CA
// verifies a certificate of the new one through the cross certificate; a
// peer that trusts the new one needs none.
func TestCrossSignChainsANewCAToTheOld(t *testing.T) {
	now := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	oldCA, err := NewCA("drover-ca", now, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	newCA, err := NewCA("drover-ca-2", now, 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	crossDER, err := oldCA.CrossSign(newCA.Cert, now)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, _, err := newCA.IssueServing("hub", []string{"127.0.0.1"}, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certs, err := ParseCerts(append(certPEM, EncodeCert(crossDER)...))
	if err != nil || len(certs) != 2 {
		t.Fatalf("ParseCerts: %d certificates, %v", len(certs), err)
	}
	if !certs[1].NotAfter.Equal(oldCA.Cert.NotAfter) {
		t.Errorf("cross certificate valid until %v, want the old CA's end %v", certs[1].NotAfter, oldCA.Cert.NotAfter)
	}
	inter := x509.NewCertPool()
	inter.AddCert(certs[1])
	at := now.Add(time.Minute)
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: oldCA.Pool(), Intermediates: inter, CurrentTime: at, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("trusting the old CA, with the cross certificate: %v", err)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: oldCA.Pool(), CurrentTime: at, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Error("trusting the old CA, without the cross certificate: verified")
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: newCA.Pool(), Intermediates: inter, CurrentTime: at, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("trusting the new CA: %v", err)
	}
}
