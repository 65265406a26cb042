package broker

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"time"

	"github.com/drover-fleet/drover/internal/mqtt/topics"
	"github.com/drover-fleet/drover/internal/pki"
)

// HubClientCert mints the client certificate the hub of l's prefix connects
// to a broker with: CN l.HubCN(), O topics.HubOrganization.
func HubClientCert(ca *pki.CA, l topics.Layout, now time.Time, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	return ClientCert(ca, l.HubCN(), topics.HubOrganization, now, validity)
}

// ClientCert mints a client certificate for cn in organization org. Nodes
// get theirs at registration (pki.CA.SignClientCSR); tests use this too.
func ClientCert(ca *pki.CA, cn, org string, now time.Time, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate client key: %w", err)
	}
	sn, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: cn, Organization: []string{org}},
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("sign client certificate for %s: %w", cn, err)
	}
	keyPEM, err = pki.EncodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pki.EncodeCert(der), keyPEM, nil
}
