package hub

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
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

// Bundle is Trust without the key: what hubs, agents and operators trust,
// and the chain a hub serves. The manager (internal/signer) keeps it in the
// ConfigMap BundleName, which hubs read instead of the CA Secret.
func (t *Trust) Bundle() *Bundle {
	return &Bundle{Current: t.Current.Cert, Previous: t.Previous, Cross: t.Cross, Rotated: t.Rotated}
}

// Roots are the CAs whose certificates are trusted: Current first.
func (t *Trust) Roots() []*x509.Certificate { return t.Bundle().Roots() }

// Pool holds Roots.
func (t *Trust) Pool() *x509.CertPool { return t.Bundle().Pool() }

// BundlePEM is Roots in PEM: what agents and operators (`drover ca`)
// trust hubs with.
func (t *Trust) BundlePEM() []byte { return t.Bundle().PEM() }

// BundleName is the ConfigMap, in Drover's namespace, that holds Drover's
// CA certificates without the key (the keys BundleCurrentKey,
// CAPreviousKey, CACrossKey and CARotatedKey): hubs trust and serve from
// it, and need no access to the CA Secret. The manager writes it whenever
// the CA Secret changes (WriteBundle).
const BundleName = "drover-ca-bundle"

// BundleCurrentKey holds the current CA's certificate (PEM) in BundleName.
const BundleCurrentKey = "ca.crt"

// Bundle is Drover's trust without its key.
type Bundle struct {
	// Current is the CA that signs now.
	Current *x509.Certificate
	// Previous are CAs replaced by a rotation that are still trusted.
	Previous []*x509.Certificate
	// Cross are Current signed by the Previous (DER).
	Cross [][]byte
	// Rotated is when Current became current; zero before any rotation.
	Rotated time.Time
}

// Roots are the CAs whose certificates are trusted: Current first.
func (b *Bundle) Roots() []*x509.Certificate {
	return append([]*x509.Certificate{b.Current}, b.Previous...)
}

// Pool holds Roots.
func (b *Bundle) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range b.Roots() {
		p.AddCert(c)
	}
	return p
}

// PEM is Roots in PEM.
func (b *Bundle) PEM() []byte {
	var out []byte
	for _, c := range b.Roots() {
		out = append(out, pki.EncodeCert(c.Raw)...)
	}
	return out
}

// PreviousDER are Previous in DER, as Register and Renew answer them.
func (b *Bundle) PreviousDER() [][]byte {
	out := make([][]byte, len(b.Previous))
	for i, c := range b.Previous {
		out[i] = c.Raw
	}
	return out
}

// trusts reports whether root is one of Roots.
func (b *Bundle) trusts(root *x509.Certificate) bool {
	return slices.ContainsFunc(b.Roots(), func(c *x509.Certificate) bool { return bytes.Equal(c.Raw, root.Raw) })
}

// Same reports whether b and o hold the same CAs.
func (b *Bundle) Same(o *Bundle) bool {
	return o != nil && bytes.Equal(b.Current.Raw, o.Current.Raw) &&
		slices.EqualFunc(b.Previous, o.Previous, func(a, c *x509.Certificate) bool { return bytes.Equal(a.Raw, c.Raw) })
}

// bundleData is b as its ConfigMap holds it.
func (b *Bundle) bundleData() map[string]string {
	d := map[string]string{BundleCurrentKey: string(pki.EncodeCert(b.Current.Raw))}
	if len(b.Previous) > 0 {
		var prev, cross []byte
		for _, c := range b.Previous {
			prev = append(prev, pki.EncodeCert(c.Raw)...)
		}
		for _, der := range b.Cross {
			cross = append(cross, pki.EncodeCert(der)...)
		}
		d[CAPreviousKey], d[CACrossKey] = string(prev), string(cross)
	}
	if !b.Rotated.IsZero() {
		d[CARotatedKey] = b.Rotated.UTC().Format(time.RFC3339)
	}
	return d
}

// ParseBundle reads the ConfigMap BundleName.
func ParseBundle(cm *corev1.ConfigMap) (*Bundle, error) {
	where := func(k string) string { return fmt.Sprintf("CA bundle %s/%s, %s", cm.Namespace, cm.Name, k) }
	cur, err := pki.ParseCert([]byte(cm.Data[BundleCurrentKey]))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where(BundleCurrentKey), err)
	}
	b := &Bundle{Current: cur}
	if b.Previous, err = pki.ParseCerts([]byte(cm.Data[CAPreviousKey])); err != nil {
		return nil, fmt.Errorf("%s: %w", where(CAPreviousKey), err)
	}
	cross, err := pki.ParseCerts([]byte(cm.Data[CACrossKey]))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where(CACrossKey), err)
	}
	for _, c := range cross {
		b.Cross = append(b.Cross, c.Raw)
	}
	if v := cm.Data[CARotatedKey]; v != "" {
		if b.Rotated, err = time.Parse(time.RFC3339, v); err != nil {
			return nil, fmt.Errorf("%s: %w", where(CARotatedKey), err)
		}
	}
	return b, nil
}

// ReadBundle reads ns's CA bundle ConfigMap.
func ReadBundle(ctx context.Context, r client.Reader, ns string) (*Bundle, error) {
	var cm corev1.ConfigMap
	if err := r.Get(ctx, client.ObjectKey{Namespace: ns, Name: BundleName}, &cm); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("Drover's CA bundle (configmap %s/%s) does not exist yet: the manager's signer writes it when it starts: %w",
				ns, BundleName, err)
		}
		return nil, fmt.Errorf("read Drover's CA bundle (configmap %s/%s): %w", ns, BundleName, err)
	}
	return ParseBundle(&cm)
}

// WriteBundle makes ns's CA bundle ConfigMap hold b, creating it if
// missing and writing only when it differs. r may be a cache.
func WriteBundle(ctx context.Context, r client.Reader, w client.Writer, ns string, b *Bundle) error {
	want := b.bundleData()
	err := retry.OnError(retry.DefaultRetry, func(err error) bool {
		return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)
	}, func() error {
		var cm corev1.ConfigMap
		err := r.Get(ctx, client.ObjectKey{Namespace: ns, Name: BundleName}, &cm)
		if apierrors.IsNotFound(err) {
			cm = corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: BundleName,
				Labels: map[string]string{"fleet.drover.io/component": "ca-bundle"}}, Data: want}
			return w.Create(ctx, &cm)
		}
		if err != nil {
			return err
		}
		if maps.Equal(cm.Data, want) {
			return nil
		}
		cm = *cm.DeepCopy()
		cm.Data = want
		return w.Update(ctx, &cm)
	})
	if err != nil {
		return fmt.Errorf("write Drover's CA bundle (configmap %s/%s): %w", ns, BundleName, err)
	}
	return nil
}

// AnnotationSignerAddress on the CA bundle ConfigMap is where the
// manager's signer serves (host:port), for operators' tools that trade
// a bearer token for an operator certificate there (`drover logs`). The
// replica that started last wrote it; any replica signs.
const AnnotationSignerAddress = "fleet.drover.io/signer-address"

// WriteSignerAddress records addr on ns's CA bundle ConfigMap, which
// exists (WriteBundle).
func WriteSignerAddress(ctx context.Context, r client.Reader, w client.Writer, ns, addr string) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cm corev1.ConfigMap
		if err := r.Get(ctx, client.ObjectKey{Namespace: ns, Name: BundleName}, &cm); err != nil {
			return err
		}
		if cm.Annotations[AnnotationSignerAddress] == addr {
			return nil
		}
		cm = *cm.DeepCopy()
		if cm.Annotations == nil {
			cm.Annotations = map[string]string{}
		}
		cm.Annotations[AnnotationSignerAddress] = addr
		return w.Update(ctx, &cm)
	})
	if err != nil {
		return fmt.Errorf("record the signer's address on Drover's CA bundle (configmap %s/%s): %w", ns, BundleName, err)
	}
	return nil
}

// ReadSignerAddress is the signer's address recorded on ns's CA bundle
// ConfigMap.
func ReadSignerAddress(ctx context.Context, r client.Reader, ns string) (string, error) {
	var cm corev1.ConfigMap
	if err := r.Get(ctx, client.ObjectKey{Namespace: ns, Name: BundleName}, &cm); err != nil {
		return "", fmt.Errorf("read the signer's address from Drover's CA bundle (configmap %s/%s): %w", ns, BundleName, err)
	}
	a := cm.Annotations[AnnotationSignerAddress]
	if a == "" {
		return "", fmt.Errorf("Drover's CA bundle (configmap %s/%s) names no signer address (annotation %s): the manager serves no signer (--signer-bind-address)",
			ns, BundleName, AnnotationSignerAddress)
	}
	return a, nil
}

// TrustedCAs are the CAs whose node certificates the hub accepts now: its
// current CA and those a rotation left trusted (the embedded MQTT broker
// verifies clients against them). Call it once the hub started (Started).
func (h *Hub) TrustedCAs() *x509.CertPool {
	return h.trust.Load().Pool()
}

// caRefresh is how often a hub asks its signer for Drover's CA bundle
// again, so that a rotation reaches every hub within it, without a
// restart. The manager's signer reads the bundle's ConfigMap: one GET a
// hub per caRefresh.
const caRefresh = 30 * time.Second

// firstTrust loads the CA bundle as the hub starts. The manager may start
// at the same time and write the bundle in a moment: the hub waits for it,
// saying so, until ctx ends.
func (h *Hub) firstTrust(ctx context.Context) error {
	wait := time.Second
	for {
		err := h.loadTrust(ctx)
		if err == nil {
			return nil
		}
		h.log.Info("waiting for Drover's CA from the signer", "err", err, "retryIn", wait)
		select {
		case <-ctx.Done():
			return fmt.Errorf("load Drover's CA: %w", err)
		case <-h.opts.Clock.After(wait):
		}
		wait = min(2*wait, 30*time.Second)
	}
}

// loadTrust asks the signer for the CA bundle; when it changed, the hub
// trusts its CAs from now on and serves a certificate of the current one.
func (h *Hub) loadTrust(ctx context.Context) error {
	b, err := h.signer.Trust(ctx)
	if err != nil {
		return err
	}
	return h.setTrust(ctx, b)
}

// setTrust makes b the hub's trust unless it holds it already.
func (h *Hub) setTrust(ctx context.Context, b *Bundle) error {
	old := h.trust.Load()
	if b.Same(old) {
		return nil
	}
	// The signer signs with the CA it holds, which the bundle names.
	cert, err := h.HubCertificate(ctx, HubServing, h.opts.ServingHosts, "")
	if err != nil {
		return err
	}
	h.serving.Store(cert)
	h.trust.Store(b)
	h.updateClientCAs()
	if old != nil {
		h.log.Info("Drover's CA changed: serving a certificate of the current CA, trusting it and the previous ones",
			"current", b.Current.Subject.CommonName, "previous", len(b.Previous))
	}
	return nil
}

// refreshTrust re-reads the CA bundle every caRefresh until ctx ends.
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
