package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

// CA is a certificate authority held in memory.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	// CertPEM and KeyPEM are the encoded forms, for storing in a Secret.
	CertPEM, KeyPEM []byte
}

// NewCA creates a self-signed CA valid for validity from now.
func NewCA(commonName string, now time.Time, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"drover"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("self-sign CA: %w", err)
	}
	keyPEM, err := EncodeKey(key)
	if err != nil {
		return nil, err
	}
	return ParseCA(EncodeCert(der), keyPEM)
}

// ParseCA loads a CA from PEM.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	cert, err := ParseCert(certPEM)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	if !cert.IsCA {
		return nil, errors.New("parse CA certificate: not a CA")
	}
	key, err := ParseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("parse CA key: %w", err)
	}
	return &CA{Cert: cert, Key: key, CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

// Pool returns a cert pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// SignClientCSR signs a DER PKCS#10 request for a client certificate whose
// common name must be wantCN. Only the public key and CN are taken from the
// request; everything else (usages, lifetime) is decided here.
func (ca *CA) SignClientCSR(csrDER []byte, wantCN string, now time.Time, validity time.Duration) ([]byte, error) {
	csr, err := parseCSR(csrDER)
	if err != nil {
		return nil, err
	}
	if csr.Subject.CommonName != wantCN {
		return nil, fmt.Errorf("certificate request is for %q, not node %q", csr.Subject.CommonName, wantCN)
	}
	return ca.sign(clientTemplate(wantCN, "drover:nodes"), csr.PublicKey, now, validity)
}

// SignServingCSR signs a DER PKCS#10 request for a serving certificate
// named commonName for hosts (DNS names or IPs). Only the request's public
// key is taken from it: names, usages and lifetime are decided here.
func (ca *CA) SignServingCSR(csrDER []byte, commonName string, hosts []string, now time.Time, validity time.Duration) ([]byte, error) {
	csr, err := parseCSR(csrDER)
	if err != nil {
		return nil, err
	}
	return ca.sign(servingTemplate(commonName, hosts), csr.PublicKey, now, validity)
}

// SignClientCSRAs signs a DER PKCS#10 request for a client certificate of
// commonName in organization, whatever subject the request names.
func (ca *CA) SignClientCSRAs(csrDER []byte, commonName, organization string, now time.Time, validity time.Duration) ([]byte, error) {
	csr, err := parseCSR(csrDER)
	if err != nil {
		return nil, err
	}
	return ca.sign(clientTemplate(commonName, organization), csr.PublicKey, now, validity)
}

// IssueServing makes a serving key pair for hosts (DNS names or IPs).
func (ca *CA) IssueServing(commonName string, hosts []string, now time.Time, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate serving key: %w", err)
	}
	der, err := ca.sign(servingTemplate(commonName, hosts), key.Public(), now, validity)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err = EncodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return EncodeCert(der), keyPEM, nil
}

// parseCSR parses a request and checks its signature (the requester holds
// the key).
func parseCSR(der []byte) (*x509.CertificateRequest, error) {
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, fmt.Errorf("parse certificate request: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("certificate request signature: %w", err)
	}
	return csr, nil
}

func clientTemplate(commonName, organization string) *x509.Certificate {
	return &x509.Certificate{
		Subject:     pkix.Name{CommonName: commonName, Organization: []string{organization}},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
}

func servingTemplate(commonName string, hosts []string) *x509.Certificate {
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: commonName},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return tmpl
}

// sign signs pub with tmpl, valid from a little before now (clock skew)
// for validity.
func (ca *CA) sign(tmpl *x509.Certificate, pub any, now time.Time, validity time.Duration) ([]byte, error) {
	tmpl.SerialNumber = serial()
	tmpl.NotBefore, tmpl.NotAfter = now.Add(-5*time.Minute), now.Add(validity)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("sign certificate for %s: %w", tmpl.Subject.CommonName, err)
	}
	return der, nil
}

// NewKeyAndCSR makes a private key and a certificate request for commonName.
func NewKeyAndCSR(commonName string) (keyPEM, csrDER []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate key: %w", err)
	}
	keyPEM, err = EncodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	csrDER, err = CSRForKey(keyPEM, commonName)
	if err != nil {
		return nil, nil, err
	}
	return keyPEM, csrDER, nil
}

// CSRForKey makes a certificate request for commonName with the PEM key.
func CSRForKey(keyPEM []byte, commonName string) ([]byte, error) {
	key, err := ParseKey(keyPEM)
	if err != nil {
		return nil, err
	}
	csrDER, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: commonName},
	}, key)
	if err != nil {
		return nil, fmt.Errorf("create certificate request: %w", err)
	}
	return csrDER, nil
}

// CSRKeyFingerprint is the hex SHA-256 of a certificate request's public
// key: what ties a node's registration to the machine that holds the key.
func CSRKeyFingerprint(csrDER []byte) (string, error) {
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return "", fmt.Errorf("parse certificate request: %w", err)
	}
	// Only a registrant that holds the key can bind a name to it.
	if err := csr.CheckSignature(); err != nil {
		return "", fmt.Errorf("certificate request signature: %w", err)
	}
	return keyFingerprint(csr.RawSubjectPublicKeyInfo), nil
}

// KeyFingerprint is the hex SHA-256 of a certificate's public key, the same
// as CSRKeyFingerprint of the request it was signed for: what hubs compare
// with the key a node registered with, and what a revocation lists. It
// names the key, not the certificate, so every certificate signed for a
// key shares it.
func KeyFingerprint(cert *x509.Certificate) string {
	return keyFingerprint(cert.RawSubjectPublicKeyInfo)
}

// CertPEMKeyFingerprint is KeyFingerprint of a PEM certificate, or "" when
// it does not parse (for log lines).
func CertPEMKeyFingerprint(certPEM []byte) string {
	c, err := ParseCert(certPEM)
	if err != nil {
		return ""
	}
	return KeyFingerprint(c)
}

func keyFingerprint(spki []byte) string {
	sum := sha256.Sum256(spki)
	return hex.EncodeToString(sum[:])
}

// EncodeCert PEM-encodes a DER certificate.
func EncodeCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// EncodeKey PEM-encodes a private key as PKCS#8.
func EncodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParseCert parses the first PEM certificate.
func ParseCert(certPEM []byte) (*x509.Certificate, error) {
	b, _ := pem.Decode(certPEM)
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate found")
	}
	return x509.ParseCertificate(b.Bytes)
}

// ParseKey parses a PEM PKCS#8 (or EC) private key.
func ParseKey(keyPEM []byte) (crypto.Signer, error) {
	b, _ := pem.Decode(keyPEM)
	if b == nil {
		return nil, errors.New("no PEM key found")
	}
	if k, err := x509.ParsePKCS8PrivateKey(b.Bytes); err == nil {
		s, ok := k.(crypto.Signer)
		if !ok {
			return nil, errors.New("key is not a signer")
		}
		return s, nil
	}
	k, err := x509.ParseECPrivateKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse key: %w", err)
	}
	return k, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		// crypto/rand does not fail on Linux; a fixed serial would still be a valid certificate.
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}

// CrossSign signs other's subject and key with ca: the cross certificate
// that chains certificates of other (a new CA) to ca (the one it
// replaces), for peers that trust only ca yet. It is valid as long as both.
func (ca *CA) CrossSign(other *x509.Certificate, now time.Time) ([]byte, error) {
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               other.Subject,
		SubjectKeyId:          other.SubjectKeyId,
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              other.NotAfter,
		KeyUsage:              other.KeyUsage,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	if ca.Cert.NotAfter.Before(tmpl.NotAfter) {
		tmpl.NotAfter = ca.Cert.NotAfter
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, other.PublicKey, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("cross-sign CA %q with %q: %w", other.Subject.CommonName, ca.Cert.Subject.CommonName, err)
	}
	return der, nil
}

// ParseCerts parses every PEM certificate in b; other blocks are skipped.
func ParseCerts(b []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return out, nil
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse certificate: %w", err)
		}
		out = append(out, c)
	}
}

// SignCRL signs a CRL revoking entries, valid from a few minutes before
// now (for a peer whose clock is behind) for validity, and returns it in
// PEM. Its number is now in nanoseconds: each newer CRL has a larger one,
// as RFC 5280 asks.
func (ca *CA) SignCRL(entries []x509.RevocationListEntry, now time.Time, validity time.Duration) ([]byte, error) {
	tmpl := &x509.RevocationList{
		RevokedCertificateEntries: entries,
		Number:                    big.NewInt(now.UnixNano()),
		ThisUpdate:                now.Add(-5 * time.Minute),
		NextUpdate:                now.Add(validity),
	}
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, ca.Cert, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("sign the CRL of CA %q: %w", ca.Cert.Subject.CommonName, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: der}), nil
}
