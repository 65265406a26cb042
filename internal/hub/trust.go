package hub

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/drover-fleet/drover/internal/pki"
)

// Keys of the CA Secret (CASecretName) beside tls.crt and tls.key, which
// hold the current CA: the one that signs. A CA rotation (RotateCA) moves
// the current CA's certificate to CAPreviousKey and writes a new one.
const (
	// CAPreviousKey holds the certificates (PEM) of CAs replaced by a
	// rotation and still trusted: certificates they signed are accepted
	// until FinishCARotation drops them.
	CAPreviousKey = "previous.crt"
	// CACrossKey holds the current CA cross-signed by each previous CA
	// (PEM). Hubs serve them with their certificate, so an agent that
	// trusts only a previous CA yet still trusts the hub.
	CACrossKey = "cross.crt"
	// CARotatedKey is when the current CA became current (RFC 3339):
	// FinishCARotation waits a certificate lifetime from it.
	CARotatedKey = "rotated-at"
)

// Trust is Drover's CA as its Secret holds it.
type Trust struct {
	// Current signs node and hub certificates.
	Current *pki.CA
	// Previous are CAs replaced by a rotation that are still trusted.
	Previous []*x509.Certificate
	// Cross are Current's certificate signed by the Previous (DER).
	Cross [][]byte
	// Rotated is when Current became current; zero before any rotation.
	Rotated time.Time
}

// ParseTrust reads a CA Secret.
func ParseTrust(s *corev1.Secret) (*Trust, error) {
	ca, err := pki.ParseCA(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return nil, fmt.Errorf("CA secret %s/%s: %w", s.Namespace, s.Name, err)
	}
	t := &Trust{Current: ca}
	if t.Previous, err = pki.ParseCerts(s.Data[CAPreviousKey]); err != nil {
		return nil, fmt.Errorf("CA secret %s/%s, %s: %w", s.Namespace, s.Name, CAPreviousKey, err)
	}
	cross, err := pki.ParseCerts(s.Data[CACrossKey])
	if err != nil {
		return nil, fmt.Errorf("CA secret %s/%s, %s: %w", s.Namespace, s.Name, CACrossKey, err)
	}
	for _, c := range cross {
		t.Cross = append(t.Cross, c.Raw)
	}
	if v := s.Data[CARotatedKey]; len(v) > 0 {
		if t.Rotated, err = time.Parse(time.RFC3339, string(v)); err != nil {
			return nil, fmt.Errorf("CA secret %s/%s, %s: %w", s.Namespace, s.Name, CARotatedKey, err)
		}
	}
	return t, nil
}

// data is t as its Secret holds it.
func (t *Trust) data() map[string][]byte {
	d := map[string][]byte{corev1.TLSCertKey: t.Current.CertPEM, corev1.TLSPrivateKeyKey: t.Current.KeyPEM}
	if len(t.Previous) > 0 {
		var prev, cross []byte
		for _, c := range t.Previous {
			prev = append(prev, pki.EncodeCert(c.Raw)...)
		}
		for _, der := range t.Cross {
			cross = append(cross, pki.EncodeCert(der)...)
		}
		d[CAPreviousKey], d[CACrossKey] = prev, cross
	}
	if !t.Rotated.IsZero() {
		d[CARotatedKey] = []byte(t.Rotated.UTC().Format(time.RFC3339))
	}
	return d
}

// Roots are the CAs whose certificates are trusted: Current first.
func (t *Trust) Roots() []*x509.Certificate {
	return append([]*x509.Certificate{t.Current.Cert}, t.Previous...)
}

// Pool holds Roots.
func (t *Trust) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range t.Roots() {
		p.AddCert(c)
	}
	return p
}

// BundlePEM is Roots in PEM: what agents and operators (`drover ca`)
// trust hubs with.
func (t *Trust) BundlePEM() []byte {
	var b []byte
	for _, c := range t.Roots() {
		b = append(b, pki.EncodeCert(c.Raw)...)
	}
	return b
}

// previousDER are Previous in DER, as Register and Renew answer them.
func (t *Trust) previousDER() [][]byte {
	out := make([][]byte, len(t.Previous))
	for i, c := range t.Previous {
		out[i] = c.Raw
	}
	return out
}

// trusts reports whether root is one of Roots.
func (t *Trust) trusts(root *x509.Certificate) bool {
	return slices.ContainsFunc(t.Roots(), func(c *x509.Certificate) bool { return bytes.Equal(c.Raw, root.Raw) })
}

// same reports whether t and o hold the same CAs.
func (t *Trust) same(o *Trust) bool {
	return o != nil && bytes.Equal(t.Current.CertPEM, o.Current.CertPEM) &&
		slices.EqualFunc(t.Previous, o.Previous, func(a, b *x509.Certificate) bool { return bytes.Equal(a.Raw, b.Raw) })
}

// servingCert issues a hub serving certificate from Current, chained to
// the Previous through the cross certificates.
func (t *Trust) servingCert(name string, hosts []string, now time.Time) (*tls.Certificate, error) {
	certPEM, keyPEM, err := t.Current.IssueServing(name, hosts, now, 365*24*time.Hour)
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("load hub serving certificate: %w", err)
	}
	cert.Certificate = append(cert.Certificate, t.Cross...)
	return &cert, nil
}

// TrustedCAs are the CAs whose node certificates the hub accepts now: its
// current CA and those a rotation left trusted (the embedded MQTT broker
// verifies clients against them). Call it once the hub started (CA).
func (h *Hub) TrustedCAs() *x509.CertPool {
	return h.trust.Load().Pool()
}

// caRefresh is how often a hub re-reads the CA Secret, so that a rotation
// reaches every hub within it, without a restart. It reads through Client:
// in `drover hub`, the manager's cache of Drover's Secrets, no API call.
const caRefresh = 30 * time.Second

// loadTrust reads the CA Secret; when it changed, the hub trusts its CAs
// from now on, signs with its current one and serves a certificate of it.
func (h *Hub) loadTrust(ctx context.Context) error {
	var s corev1.Secret
	if err := h.opts.Client.Get(ctx, client.ObjectKey{Namespace: h.opts.Namespace, Name: CASecretName}, &s); err != nil {
		return fmt.Errorf("read CA secret %s/%s: %w", h.opts.Namespace, CASecretName, err)
	}
	t, err := ParseTrust(&s)
	if err != nil {
		return err
	}
	return h.setTrust(t)
}

// setTrust makes t the hub's trust unless it holds it already.
func (h *Hub) setTrust(t *Trust) error {
	old := h.trust.Load()
	if t.same(old) {
		return nil
	}
	cert, err := t.servingCert("drover-hub-"+h.opts.Name, h.opts.ServingHosts, h.opts.Clock.Now())
	if err != nil {
		return err
	}
	h.serving.Store(cert)
	h.trust.Store(t)
	h.updateClientCAs()
	if old != nil {
		h.log.Info("Drover's CA changed: signing with the current CA, trusting it and the previous ones",
			"current", t.Current.Cert.Subject.CommonName, "previous", len(t.Previous))
	}
	return nil
}

// refreshTrust re-reads the CA Secret every caRefresh until ctx ends.
func (h *Hub) refreshTrust(ctx context.Context) error {
	t := h.opts.Clock.NewTicker(caRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.Chan():
			if err := h.loadTrust(ctx); err != nil && ctx.Err() == nil {
				h.log.Error("re-read Drover's CA; keeping the one loaded", "err", err)
			}
		}
	}
}

// updateClientCAs makes the pool client certificates are verified against:
// Drover's CAs and the kube-apiserver's client CAs.
func (h *Hub) updateClientCAs() {
	// Two updates at once (a CA and a kube CA refresh) must not store an
	// older pool last.
	h.clientCAsMu.Lock()
	defer h.clientCAsMu.Unlock()
	pool := h.trust.Load().Pool()
	if p := h.kubeCAs.Load(); p != nil {
		for _, c := range *p {
			pool.AddCert(c)
		}
	}
	h.clientCAs.Store(pool)
}
