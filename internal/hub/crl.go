package hub

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"math/big"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/drover-fleet/drover/internal/pki"
)

// CRLValidity is how long a CRL that CRL signs is valid (its nextUpdate).
// OpenSSL refuses every certificate of a CA whose CRL has expired, and
// Mosquitto reads its CRL file only at start and on SIGHUP: a long
// validity keeps a broker whose CRL nobody rewrites running. `drover mqtt
// crl --watch` signs a new one when the list changes, and at least every
// CRLValidity/2.
const CRLValidity = 365 * 24 * time.Hour

// CRL is one X.509 CRL per CA of cas, in PEM, concatenated: each lists the
// unexpired certificates of revoked keys in revoked (the ConfigMap
// RevokedKeysName; nil for none) that the CA signed, by the issuer name
// recorded with each serial. OpenSSL (and so Mosquitto's crlfile) reads
// every CRL of such a file, and refuses every certificate of a CA that has
// none: cas must be every CA the broker trusts.
func CRL(cas []*pki.CA, revoked *corev1.ConfigMap, now time.Time) ([]byte, error) {
	byIssuer := map[string][]x509.RevocationListEntry{}
	if revoked != nil {
		for _, e := range parseRevokedKeys(revoked, now) {
			if !now.Before(e.Expires) {
				continue
			}
			for _, c := range e.Certificates {
				serial, ok := new(big.Int).SetString(c.Serial, 16)
				if !ok || !c.NotAfter.After(now) {
					continue
				}
				byIssuer[c.Issuer] = append(byIssuer[c.Issuer], x509.RevocationListEntry{SerialNumber: serial, RevocationTime: e.Revoked})
			}
		}
	}
	var out bytes.Buffer
	for _, ca := range cas {
		entries := byIssuer[ca.Cert.Subject.CommonName]
		slices.SortFunc(entries, func(a, b x509.RevocationListEntry) int { return a.SerialNumber.Cmp(b.SerialNumber) })
		entries = slices.CompactFunc(entries, func(a, b x509.RevocationListEntry) bool { return a.SerialNumber.Cmp(b.SerialNumber) == 0 })
		crl, err := ca.SignCRL(entries, now, CRLValidity)
		if err != nil {
			return nil, err
		}
		out.Write(crl)
	}
	return out.Bytes(), nil
}

// CRLSerials are the serials (lowercase hex) each CRL in crlPEM revokes,
// by issuer common name, and the earliest nextUpdate of them: what a
// writer compares to decide whether a CRL file is still current.
func CRLSerials(crlPEM []byte) (serials map[string][]string, nextUpdate time.Time, err error) {
	serials = map[string][]string{}
	for {
		var b *pem.Block
		b, crlPEM = pem.Decode(crlPEM)
		if b == nil {
			return serials, nextUpdate, nil
		}
		if b.Type != "X509 CRL" {
			continue
		}
		l, err := x509.ParseRevocationList(b.Bytes)
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("parse CRL: %w", err)
		}
		var s []string
		for _, e := range l.RevokedCertificateEntries {
			s = append(s, e.SerialNumber.Text(16))
		}
		slices.Sort(s)
		serials[l.Issuer.CommonName] = s
		if nextUpdate.IsZero() || l.NextUpdate.Before(nextUpdate) {
			nextUpdate = l.NextUpdate
		}
	}
}
