package hub

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/fleetnode"
)

// RevokedKeysName is the ConfigMap, in Drover's namespace, that lists the
// revoked node keys: data maps a key's hex SHA-256 (pki.KeyFingerprint) to
// a RevokedKey in JSON. A revocation outlives its FleetNode there: hubs and
// the embedded MQTT broker refuse a listed key whatever FleetNode names it,
// and Register refuses to bind a name to it again.
//
// A ConfigMap rather than a Secret: key hashes are not secret, and hubs
// then need no Secret access for it. It is bounded: an entry goes once
// every certificate it could name has expired (RevokedKey.Expires), and
// RevokeKey refuses to grow it past MaxRevokedKeys or maxRevokedBytes.
const RevokedKeysName = "drover-revoked-keys"

// MaxRevokedKeys bounds the list, and maxRevokedBytes its size inside a
// ConfigMap's 1 MiB: an entry is about 150 bytes, and 120 more for each
// certificate it lists (at most maxRevokedCertificates). More revocations
// within a certificate lifetime call for a new CA rather than a longer
// list.
const MaxRevokedKeys = 5000

const maxRevokedBytes = 900 << 10

// maxRevokedCertificates bounds the certificates one entry lists: a node
// records at most fleetnode.MaxCertificates, and a key listed again (a
// hub saw a certificate signed as it was revoked) may add some.
const maxRevokedCertificates = 2 * fleetnode.MaxCertificates

// DefaultCertificateValidity is how long the certificates hubs sign are
// valid unless configured otherwise (Options.CertificateValidity). Agents
// renew theirs well before (Renew). A revocation lasts at least this long
// (RevocationFor); a hub configured for longer lists its revocations for
// its own validity (recordRevoked).
const DefaultCertificateValidity = 7 * 24 * time.Hour

// RevokedKey is one entry of the revocation list.
type RevokedKey struct {
	// Node is the node the key was registered as, for operators.
	Node string `json:"node"`
	// Revoked is when it was listed.
	Revoked time.Time `json:"revoked"`
	// Expires is when the last certificate signed for the key expires; the
	// entry is dropped after it.
	Expires time.Time `json:"expires"`
	// Certificates are the node's certificates that were unexpired when
	// it was listed (status.certificates): a CRL names certificates by
	// serial, not by key (`drover mqtt crl`).
	Certificates []fleetv1.NodeCertificate `json:"certificates,omitempty"`
}

// covers reports whether e lists every certificate of o.
func (e RevokedKey) covers(o RevokedKey) bool {
	for _, c := range o.Certificates {
		if !slices.ContainsFunc(e.Certificates, func(h fleetv1.NodeCertificate) bool { return sameCert(h, c) }) {
			return false
		}
	}
	return true
}

func sameCert(a, b fleetv1.NodeCertificate) bool { return a.Serial == b.Serial && a.Issuer == b.Issuer }

// merge adds o's certificates to e's, bounded to maxRevokedCertificates
// (those expiring last stay), and keeps the later expiry.
func (e RevokedKey) merge(o RevokedKey) RevokedKey {
	certs := slices.Clone(e.Certificates)
	for _, c := range o.Certificates {
		if !slices.ContainsFunc(certs, func(h fleetv1.NodeCertificate) bool { return sameCert(h, c) }) {
			certs = append(certs, c)
		}
	}
	if len(certs) > maxRevokedCertificates {
		slices.SortStableFunc(certs, func(a, b fleetv1.NodeCertificate) int { return b.NotAfter.Compare(a.NotAfter.Time) })
		certs = certs[:maxRevokedCertificates]
	}
	e.Certificates = certs
	if o.Expires.After(e.Expires) {
		e.Expires = o.Expires
	}
	return e
}

// RevocationFor is the entry that revokes n's registered key at now, and
// the key; ok is false when n has no recorded key (registered before keys
// were, or never registered through a hub). The entry lasts until every
// certificate signed for the key has expired: the latest of the node's
// recorded certificate expiries and now plus the default validity (a hub
// may have signed one a moment ago and not recorded it yet). It lists the
// node's recorded certificates that are unexpired at now.
func RevocationFor(n *fleetv1.FleetNode, now time.Time) (key string, e RevokedKey, ok bool) {
	key = n.Annotations[fleetv1.AnnotationRegistrationKey]
	if key == "" {
		return "", RevokedKey{}, false
	}
	e = RevokedKey{Node: n.Name, Revoked: now.UTC().Truncate(time.Second), Expires: now.Add(DefaultCertificateValidity).UTC().Truncate(time.Second)}
	if x := n.Status.CertificateExpiry; x != nil && x.After(e.Expires) {
		e.Expires = x.UTC()
	}
	for _, c := range n.Status.Certificates {
		if c.NotAfter.After(now) {
			e.Certificates = append(e.Certificates, c)
			if c.NotAfter.After(e.Expires) {
				e.Expires = c.NotAfter.UTC()
			}
		}
	}
	return key, e, true
}

// RevokeKey lists key in namespace's revocation list (creating it), drops
// the entries that expired by now, and of a key listed twice keeps the
// later expiry and every certificate (bounded). The CLI calls it for
// `drover revoke` before setting spec.revoked, and hubs for nodes revoked
// otherwise (kubectl).
func RevokeKey(ctx context.Context, c client.Client, namespace, key string, e RevokedKey, now time.Time) error {
	// Another writer may create the list first: then add to theirs.
	retriable := func(err error) bool { return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) }
	err := retry.OnError(retry.DefaultRetry, retriable, func() error {
		var cm corev1.ConfigMap
		err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: RevokedKeysName}, &cm)
		create := apierrors.IsNotFound(err)
		if err != nil && !create {
			return err
		}
		// A cached read may share its maps with the cache; the write
		// below decodes the answer into cm.
		cm = *cm.DeepCopy()
		if create {
			cm = corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: RevokedKeysName,
				Labels: map[string]string{"fleet.drover.io/component": "revocation"}}}
		}
		list := parseRevokedKeys(&cm, now)
		changed := prune(list, now)
		if have, ok := list[key]; !ok {
			e.Certificates = RevokedKey{}.merge(e).Certificates // bounded
			list[key], changed = e, true
		} else if merged := have.merge(e); !reflect.DeepEqual(merged, have) {
			list[key], changed = merged, true
		}
		if !changed {
			return nil
		}
		full := fmt.Errorf("the revocation list %s/%s is full: rotate Drover's CA instead of revoking more nodes one by one", namespace, RevokedKeysName)
		if len(list) > MaxRevokedKeys {
			return fmt.Errorf("%w (%d keys)", full, MaxRevokedKeys)
		}
		cm.Data = map[string]string{}
		size := 0
		for k, v := range list {
			b, _ := json.Marshal(v)
			cm.Data[k] = string(b)
			size += len(k) + len(b)
		}
		if size > maxRevokedBytes {
			return fmt.Errorf("%w (%d bytes)", full, maxRevokedBytes)
		}
		if create {
			return c.Create(ctx, &cm)
		}
		return c.Update(ctx, &cm)
	})
	if err != nil {
		return fmt.Errorf("record revoked key of node %s in configmap %s/%s: %w", e.Node, namespace, RevokedKeysName, err)
	}
	return nil
}

// parseRevokedKeys reads the list; an entry that does not parse is kept as
// revoked for a default validity from now, since dropping it would readmit
// the key.
func parseRevokedKeys(cm *corev1.ConfigMap, now time.Time) map[string]RevokedKey {
	out := make(map[string]RevokedKey, len(cm.Data))
	for k, v := range cm.Data {
		var e RevokedKey
		if err := json.Unmarshal([]byte(v), &e); err != nil || e.Expires.IsZero() {
			e = RevokedKey{Node: "?", Revoked: now, Expires: now.Add(DefaultCertificateValidity)}
		}
		out[k] = e
	}
	return out
}

// prune drops the entries expired at now and reports whether any was.
func prune(list map[string]RevokedKey, now time.Time) bool {
	n := len(list)
	for k, e := range list {
		if !now.Before(e.Expires) {
			delete(list, k)
		}
	}
	return len(list) != n
}

// revokedKey returns key's entry in the revocation list if it is listed
// and unexpired. The list is read through the hub's Client: in a hub run by
// `drover hub` or `drover server`, the manager's cache, restricted to this
// one ConfigMap, so a check costs no API call.
func (h *Hub) revokedKey(ctx context.Context, key string) (RevokedKey, bool, error) {
	return ReadRevokedKey(ctx, h.opts.Client, h.opts.Namespace, key, h.opts.Clock.Now())
}

// ReadRevokedKey reads the revocation list in ns through r and returns
// key's entry if it is listed and unexpired at now. No list is no entry.
func ReadRevokedKey(ctx context.Context, r client.Reader, ns, key string, now time.Time) (RevokedKey, bool, error) {
	var cm corev1.ConfigMap
	if err := r.Get(ctx, client.ObjectKey{Namespace: ns, Name: RevokedKeysName}, &cm); err != nil {
		if apierrors.IsNotFound(err) {
			return RevokedKey{}, false, nil
		}
		return RevokedKey{}, false, fmt.Errorf("read the revocation list %s/%s: %w", ns, RevokedKeysName, err)
	}
	e, ok := RevokedKeyIn(&cm, key, now)
	return e, ok, nil
}

// RevokedKeyIn returns key's entry in the revocation list cm if it is
// listed and unexpired at now.
func RevokedKeyIn(cm *corev1.ConfigMap, key string, now time.Time) (RevokedKey, bool) {
	v, ok := cm.Data[key]
	if !ok {
		return RevokedKey{}, false
	}
	e := parseRevokedKeys(&corev1.ConfigMap{Data: map[string]string{key: v}}, now)[key]
	if !now.Before(e.Expires) {
		return RevokedKey{}, false
	}
	return e, true
}

// recordRevoked lists the keys of the revoked nodes among nodes that the
// list lacks: a node revoked with kubectl rather than `drover revoke`
// (which lists the key itself) stays refused once its FleetNode is
// deleted. Hubs all do it; the writes are idempotent.
func (h *Hub) recordRevoked(ctx context.Context, nodes []fleetv1.FleetNode) {
	now := h.opts.Clock.Now()
	for i := range nodes {
		n := &nodes[i]
		if !n.Spec.Revoked {
			continue
		}
		key, e, ok := RevocationFor(n, now)
		if !ok {
			continue
		}
		// This hub may have signed for longer than the default a moment ago.
		if x := now.Add(h.opts.CertificateValidity).UTC().Truncate(time.Second); x.After(e.Expires) {
			e.Expires = x
		}
		// Listed already, unless a hub signed a certificate as the node
		// was revoked: its serial goes on the list too.
		if have, listed, err := h.revokedKey(ctx, key); err != nil || (listed && have.covers(e)) {
			continue
		}
		if err := RevokeKey(ctx, h.opts.Client, h.opts.Namespace, key, e, now); err != nil {
			h.log.Error("list a revoked node's key; retrying", "node", n.Name, "err", err)
			continue
		}
		h.log.Info("listed a revoked node's key: it stays refused after the FleetNode is deleted", "node", n.Name, "keySHA256", key)
	}
}

// RevokeNode revokes node as `drover revoke` does: its registered key goes
// on namespace's revocation list first, then spec.revoked is set (hubs
// close its streams and refuse it). In that order, the key stays refused
// even if the FleetNode is deleted the moment it is revoked. A node with no
// recorded key is only flagged, and listed reports false.
func RevokeNode(ctx context.Context, c client.Client, namespace, node string, now time.Time) (listed bool, err error) {
	var n fleetv1.FleetNode
	if err := c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		if apierrors.IsNotFound(err) {
			return false, fmt.Errorf("node %s not found: it registers when its agent first contacts a hub", node)
		}
		return false, fmt.Errorf("get node %s: %w", node, err)
	}
	if key, e, ok := RevocationFor(&n, now); ok {
		if err := RevokeKey(ctx, c, namespace, key, e, now); err != nil {
			return false, err
		}
		listed = true
	}
	if n.Spec.Revoked {
		return listed, nil
	}
	before := n.DeepCopy()
	n.Spec.Revoked = true
	if err := c.Patch(ctx, &n, client.MergeFrom(before)); err != nil {
		return listed, fmt.Errorf("revoke node %s: %w", node, err)
	}
	return listed, nil
}
