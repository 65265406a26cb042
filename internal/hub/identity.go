package hub

import (
	"context"
	"crypto/x509"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
)

// Peer is a node as its transport authenticated it.
type Peer struct {
	// Node is the name its certificate gives.
	Node string
	// Key is the hex SHA-256 of the certificate's public key
	// (pki.KeyFingerprint). It is "" only from a transport that never sees
	// the node's certificate (an external MQTT broker): the hub cannot bind
	// such a session to the node's key, and the broker must refuse revoked
	// certificates itself.
	Key string
	// Cert is the node's certificate and Root the CA it chains to, when
	// the transport has them (gRPC): the hub closes the session when Cert
	// expires or Root is no longer trusted (a CA rotation finished).
	Cert, Root *x509.Certificate
	// Addr is the IP address the node's connection comes from, when the
	// transport knows it (gRPC): features give it to clients as the node's
	// address (a session's endpoint). "" when unknown (MQTT).
	Addr string
}

// certEnded says why a session with cert, chained to root, must end now,
// or "" while cert is valid at now and root trusted.
func (h *Hub) certEnded(cert, root *x509.Certificate, now time.Time) string {
	switch {
	case cert != nil && !now.Before(cert.NotAfter):
		return fmt.Sprintf("its certificate expired at %s; the agent renews it before then, or registers again",
			cert.NotAfter.UTC().Format(time.RFC3339))
	case root != nil && !h.trust.Load().trusts(root):
		return fmt.Sprintf("its certificate's CA %q is no longer trusted (Drover's CA was rotated)", root.Subject.CommonName)
	}
	return ""
}

// checkKey refuses key unless it is the key n registered with and not
// revoked: a certificate is the node's only while the FleetNode that names
// the node was registered with its key. An old certificate of a node that
// was deleted and registered again by another machine (or revoked) is
// refused, though it is still valid and names the node. A node registered
// before keys were recorded has no key to compare; the revocation list
// still applies to it.
func (h *Hub) checkKey(ctx context.Context, n *fleetv1.FleetNode, key string) error {
	if key == "" {
		return nil
	}
	if err := h.checkNotRevoked(ctx, n.Name, key); err != nil {
		return err
	}
	if have := n.Annotations[fleetv1.AnnotationRegistrationKey]; have != "" && have != key {
		return keyMismatch(n.Name)
	}
	return nil
}

func keyMismatch(node string) error {
	return status.Errorf(codes.PermissionDenied, "certificate key does not match the key node %s registered with; "+
		"the node was re-registered by another machine (to move this machine back, delete FleetNode %s and register it afresh)", node, node)
}

// checkNotRevoked refuses a key on the revocation list. A list that cannot
// be read refuses too (Unavailable: the agent retries): admitting a key
// that may be revoked is the worse mistake.
func (h *Hub) checkNotRevoked(ctx context.Context, node, key string) error {
	e, revoked, err := h.revokedKey(ctx, key)
	if err != nil {
		return status.Errorf(codes.Unavailable, "node %s: %v", node, err)
	}
	if revoked {
		return status.Errorf(codes.PermissionDenied, "the key of this certificate (node %s) was revoked on %s (`drover revoke %s`); "+
			"it stays refused until %s: register the machine afresh with a new key",
			node, e.Revoked.Format("2006-01-02 15:04 MST"), e.Node, e.Expires.Format("2006-01-02"))
	}
	return nil
}

// AdmitKey says whether a node's certificate with key may connect: the
// embedded MQTT broker asks it at every connect, so that a revoked key, or
// the old key of a node registered again by another machine, does not even
// reach the broker's topics. It reads the FleetNode from the hub's cache and
// asks the API only to confirm a refusal (a node registered a moment ago
// may not be cached yet). Errors are gRPC statuses, as ServeSession's.
//
// It refuses what no answer from the hub could help: a key the FleetNode
// was not registered with, a revoked key whose FleetNode is gone or was
// created again. The registered key of a node that is revoked, or whose
// FleetNode was deleted without a revocation, still connects: its hello
// is refused with the reason (PermissionDenied: the agent stops;
// Unauthenticated: it registers again), as over gRPC. That connection has
// no session and only its own node's topics.
func (h *Hub) AdmitKey(ctx context.Context, node, key string) error {
	var n fleetv1.FleetNode
	err := h.opts.Client.Get(ctx, client.ObjectKey{Name: node}, &n)
	if err == nil && h.admissible(ctx, &n, key) == nil {
		return nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return status.Errorf(codes.Unavailable, "look up node %s: %v", node, err)
	}
	switch err := h.opts.APIReader.Get(ctx, client.ObjectKey{Name: node}, &n); {
	case apierrors.IsNotFound(err):
		return h.checkNotRevoked(ctx, node, key)
	case err != nil:
		return status.Errorf(codes.Unavailable, "look up node %s: %v", node, err)
	}
	return h.admissible(ctx, &n, key)
}

// admissible is AdmitKey's rule for an existing FleetNode n.
func (h *Hub) admissible(ctx context.Context, n *fleetv1.FleetNode, key string) error {
	if have := n.Annotations[fleetv1.AnnotationRegistrationKey]; have != "" && have != key {
		return keyMismatch(n.Name)
	}
	if n.Spec.Revoked {
		return nil // told at its hello
	}
	return h.checkNotRevoked(ctx, n.Name, key)
}
