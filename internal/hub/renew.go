package hub

import (
	"context"
	"crypto/x509"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/fleetnode"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// renewInterval is how often one node may renew: agents renew once in two
// thirds of a certificate's lifetime, and retry failures slower than this.
const renewInterval = time.Minute

// Renew implements AgentHub: it signs a new certificate for the key of the
// caller's own, still-valid certificate (the TLS handshake checked that),
// if the node may still connect: approved, not revoked, the key the one it
// registered with and not on the revocation list. The node's identity
// stays bound to its key: a renewal never changes it.
func (h *Hub) Renew(ctx context.Context, req *agentv1.RenewRequest) (*agentv1.RenewResponse, error) {
	p, err := h.nodeFromPeer(ctx)
	if err == nil {
		err = h.renewAllowed(p.Node)
	}
	var resp *agentv1.RenewResponse
	if err == nil {
		resp, err = h.renew(ctx, p, req)
	}
	h.metrics.renewals.WithLabelValues(status.Code(err).String()).Inc()
	switch {
	case err == nil:
	case p.Node == "":
		// Anyone may call without a certificate: not worth an info line each.
		h.log.Debug("certificate renewal refused", "reason", status.Convert(err).Message())
	default:
		h.log.Info("certificate renewal refused", "node", p.Node, "keySHA256", p.Key, "reason", status.Convert(err).Message())
	}
	return resp, err
}

// RenewPeer is Renew for a node another transport authenticated (the MQTT
// bridge: the embedded broker verified the node's certificate, p.Key is its
// key): the same limits, checks and answer.
func (h *Hub) RenewPeer(ctx context.Context, p Peer, req *agentv1.RenewRequest) (*agentv1.RenewResponse, error) {
	err := h.renewAllowed(p.Node)
	var resp *agentv1.RenewResponse
	if err == nil {
		resp, err = h.renew(ctx, p, req)
	}
	h.metrics.renewals.WithLabelValues(status.Code(err).String()).Inc()
	if err != nil {
		h.log.Info("certificate renewal refused", "node", p.Node, "keySHA256", p.Key, "reason", status.Convert(err).Message(), "transport", "mqtt")
	}
	return resp, err
}

func (h *Hub) renewAllowed(node string) error {
	if ok, retry := h.renewals.allow(node, h.opts.Clock.Now()); !ok {
		return status.Errorf(codes.ResourceExhausted, "node %s renewed its certificate a moment ago; retry in %v",
			node, max(time.Second, retry.Truncate(time.Second)))
	}
	return nil
}

func (h *Hub) renew(ctx context.Context, p Peer, req *agentv1.RenewRequest) (*agentv1.RenewResponse, error) {
	node := p.Node
	key, err := pki.CSRKeyFingerprint(req.GetCsr())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "node %s: %v", node, err)
	}
	if key != p.Key {
		return nil, status.Errorf(codes.InvalidArgument, "node %s: a renewal is for the key of the calling certificate "+
			"(sha256 %s), not another (sha256 %s): a node keeps its key", node, p.Key, key)
	}
	var fn fleetv1.FleetNode
	if err := h.opts.APIReader.Get(ctx, client.ObjectKey{Name: node}, &fn); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, status.Errorf(codes.Unauthenticated, "node %s is not registered (its FleetNode was deleted); register again with a bootstrap token", node)
		}
		return nil, status.Errorf(codes.Unavailable, "look up node %s: %v", node, err)
	}
	if fn.Spec.Revoked {
		return nil, status.Errorf(codes.PermissionDenied, "node %s is revoked", node)
	}
	if !fn.Spec.Approved {
		return nil, status.Errorf(codes.PermissionDenied, "node %s is not approved: run `drover approve %s`", node, node)
	}
	if err := h.checkKey(ctx, &fn, key); err != nil {
		return nil, err
	}
	der, err := h.signer.SignNode(ctx, req.GetCsr(), node)
	if err != nil {
		return nil, signError(node, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "node %s: the signed certificate does not parse: %v", node, err)
	}
	// Recorded before the agent has it: a revocation lists the key until
	// this expiry (RevocationFor).
	h.writeStatusOn(ctx, node, &fn, "certificate", func(n *fleetv1.FleetNode) bool {
		return fleetnode.SetCertificate(n, cert)
	})
	t := h.trust.Load()
	h.log.Info("certificate renewed", "node", node, "expires", cert.NotAfter, "ca", cert.Issuer.CommonName)
	return &agentv1.RenewResponse{Certificate: der, Ca: t.Current.Raw, PreviousCas: t.PreviousDER()}, nil
}

// maxRenewNodes bounds the nodes the renew limiter remembers; past it,
// those that renewed more than renewInterval ago are forgotten (they are
// allowed again anyway).
const maxRenewNodes = 1 << 17

// renewLimiter allows one renewal per node per interval.
type renewLimiter struct {
	interval time.Duration
	mu       sync.Mutex
	last     map[string]time.Time
}

func newRenewLimiter(interval time.Duration) *renewLimiter {
	return &renewLimiter{interval: interval, last: map[string]time.Time{}}
}

// allow takes node's renewal at now, or says when it may come back.
func (l *renewLimiter) allow(node string, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t, ok := l.last[node]; ok && now.Sub(t) < l.interval {
		return false, l.interval - now.Sub(t)
	}
	if len(l.last) >= maxRenewNodes {
		for n, t := range l.last {
			if now.Sub(t) >= l.interval {
				delete(l.last, n)
			}
		}
		if len(l.last) >= maxRenewNodes {
			return false, l.interval
		}
	}
	l.last[node] = now
	return true, 0
}

// signError is a Signer's refusal as the agent sees it: the signer's own
// status (it checked the node again and refused), or InvalidArgument for
// a request it could not sign.
func signError(node string, err error) error {
	if st, ok := status.FromError(err); ok && st.Code() != codes.Unknown {
		return status.Errorf(st.Code(), "node %s: %s", node, st.Message())
	}
	return status.Errorf(codes.InvalidArgument, "node %s: %v", node, err)
}
