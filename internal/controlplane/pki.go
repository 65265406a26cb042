package controlplane

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 365 * 24 * time.Hour
	// leafRenewBefore is how long before expiry a leaf certificate is
	// re-issued at start.
	leafRenewBefore = 30 * 24 * time.Hour

	// AdminUser is the user name in the admin client certificate.
	AdminUser = "drover-admin"
	// AdminGroup is the group of the admin client certificate; RBAC binds it
	// to cluster-admin.
	AdminGroup = "system:masters"
)

// pkiFiles names the files of the control plane's PKI inside one directory.
type pkiFiles struct{ dir string }

func (p pkiFiles) path(name string) string { return filepath.Join(p.dir, name) }
func (p pkiFiles) caCert() string          { return p.path("ca.crt") }
func (p pkiFiles) caKey() string           { return p.path("ca.key") }
func (p pkiFiles) servingCert() string     { return p.path("apiserver.crt") }
func (p pkiFiles) servingKey() string      { return p.path("apiserver.key") }
func (p pkiFiles) adminCert() string       { return p.path("admin.crt") }
func (p pkiFiles) adminKey() string        { return p.path("admin.key") }
func (p pkiFiles) saKey() string           { return p.path("sa.key") }
func (p pkiFiles) saPub() string           { return p.path("sa.pub") }

// pki is the loaded material the control plane needs in memory.
type pki struct {
	files pkiFiles
	// caPEM, adminCertPEM and adminKeyPEM go into the kubeconfig and the
	// rest.Config.
	caPEM, adminCertPEM, adminKeyPEM []byte
}

// leafSpec describes one certificate signed by the cluster CA.
type leafSpec struct {
	certFile, keyFile string
	subject           pkix.Name
	dnsNames          []string
	ips               []net.IP
	usage             x509.ExtKeyUsage
}

// ensurePKI loads the PKI in dir, creating what is missing. The CA is created
// once and kept; a leaf certificate is re-issued when it is missing, is not
// signed by the CA, or expires within leafRenewBefore of now. The
// service-account key pair is created once and kept, so tokens stay valid
// across restarts.
func ensurePKI(dir string, now time.Time) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create pki dir %s: %w", dir, err)
	}
	files := pkiFiles{dir: dir}

	caCert, caKey, err := loadPair(files.caCert(), files.caKey())
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("load cluster CA from %s: %w", dir, err)
		}
		caCert, caKey, err = newCA(now)
		if err != nil {
			return nil, err
		}
		if err := writePair(files.caCert(), files.caKey(), caCert, caKey); err != nil {
			return nil, err
		}
	}

	leaves := []leafSpec{
		{
			certFile: files.servingCert(), keyFile: files.servingKey(),
			subject: pkix.Name{CommonName: "kube-apiserver"},
			dnsNames: []string{
				"localhost", "kubernetes", "kubernetes.default",
				"kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
			},
			// 10.96.0.1 is the first address of the service range: the
			// in-cluster "kubernetes" Service. No traffic goes there on a
			// loopback-only control plane; it is listed for completeness.
			ips:   []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, net.IPv4(10, 96, 0, 1)},
			usage: x509.ExtKeyUsageServerAuth,
		},
		{
			certFile: files.adminCert(), keyFile: files.adminKey(),
			subject: pkix.Name{CommonName: AdminUser, Organization: []string{AdminGroup}},
			usage:   x509.ExtKeyUsageClientAuth,
		},
	}
	for _, l := range leaves {
		if err := ensureLeaf(l, caCert, caKey, now); err != nil {
			return nil, err
		}
	}
	if err := ensureSAKey(files); err != nil {
		return nil, err
	}

	p := &pki{files: files}
	for _, f := range []struct {
		dst  *[]byte
		path string
	}{
		{&p.caPEM, files.caCert()},
		{&p.adminCertPEM, files.adminCert()},
		{&p.adminKeyPEM, files.adminKey()},
	} {
		b, err := os.ReadFile(f.path)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", f.path, err)
		}
		*f.dst = b
	}
	return p, nil
}

func ensureLeaf(l leafSpec, caCert *x509.Certificate, caKey crypto.Signer, now time.Time) error {
	cert, _, err := loadPair(l.certFile, l.keyFile)
	switch {
	case err == nil && leafStillGood(cert, caCert, now):
		return nil
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("load certificate %s: %w", l.certFile, err)
	}
	key, err := newKey()
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: newSerial(),
		Subject:      l.subject,
		DNSNames:     l.dnsNames,
		IPAddresses:  l.ips,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(leafValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{l.usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, key.Public(), caKey)
	if err != nil {
		return fmt.Errorf("sign certificate %s: %w", l.subject.CommonName, err)
	}
	cert, err = x509.ParseCertificate(der)
	if err != nil {
		return fmt.Errorf("parse certificate %s: %w", l.subject.CommonName, err)
	}
	return writePair(l.certFile, l.keyFile, cert, key)
}

func leafStillGood(cert, ca *x509.Certificate, now time.Time) bool {
	if cert.CheckSignatureFrom(ca) != nil {
		return false
	}
	return now.Add(leafRenewBefore).Before(cert.NotAfter)
}

func ensureSAKey(files pkiFiles) error {
	_, errKey := os.Stat(files.saKey())
	_, errPub := os.Stat(files.saPub())
	if errKey == nil && errPub == nil {
		return nil
	}
	key, err := newKey()
	if err != nil {
		return err
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return fmt.Errorf("marshal service-account public key: %w", err)
	}
	if err := writeFileAtomic(files.saKey(), keyPEM, 0o600); err != nil {
		return err
	}
	return writeFileAtomic(files.saPub(), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644)
}

func newCA(now time.Time) (*x509.Certificate, crypto.Signer, error) {
	key, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          newSerial(),
		Subject:               pkix.Name{CommonName: "drover-cluster-ca", Organization: []string{"drover"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("self-sign cluster CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("parse cluster CA: %w", err)
	}
	return cert, key, nil
}

// newKey makes an ECDSA P-256 key: fast to generate, accepted by
// kube-apiserver for serving, client and service-account signing (ES256).
func newKey() (*ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate key: %w", err)
	}
	return key, nil
}

func newSerial() *big.Int {
	limit := new(big.Int).Lsh(big.NewInt(1), 127)
	n, err := rand.Int(rand.Reader, limit)
	if err != nil {
		// crypto/rand does not fail on supported platforms.
		panic(fmt.Sprintf("read random serial: %v", err))
	}
	return n.Add(n, big.NewInt(1))
}

func encodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func writePair(certFile, keyFile string, cert *x509.Certificate, key crypto.Signer) error {
	keyPEM, err := encodeKey(key)
	if err != nil {
		return err
	}
	// Key first: a crash between the two leaves a cert that does not match
	// its key, which loadPair detects and the next start repairs.
	if err := writeFileAtomic(keyFile, keyPEM, 0o600); err != nil {
		return err
	}
	return writeFileAtomic(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}), 0o644)
}

// loadPair reads a PEM certificate and its PKCS#8 private key and checks that
// they match. A missing file yields an error wrapping fs.ErrNotExist; so does
// a key that does not match its certificate (the pair is then re-created).
func loadPair(certFile, keyFile string) (*x509.Certificate, crypto.Signer, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, nil, err
	}
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, nil, fmt.Errorf("%s: no PEM certificate", certFile)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", certFile, err)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, nil, fmt.Errorf("%s: no PEM key", keyFile)
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", keyFile, err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, nil, fmt.Errorf("%s: key of type %T cannot sign", keyFile, k)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(signer.Public())
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", keyFile, err)
	}
	if !bytes.Equal(pubDER, cert.RawSubjectPublicKeyInfo) {
		return nil, nil, fmt.Errorf("%s does not match %s: %w", keyFile, certFile, fs.ErrNotExist)
	}
	return cert, signer, nil
}

// writeFileAtomic writes data to a temporary file next to path and renames it
// into place, so a reader never sees a half-written file.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
