package signer

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/bootstrap"
	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol"
)

// cacheLag is how long a refused node request waits for the signer's
// cache to show a FleetNode change before the API confirms the refusal:
// a hub asks for an auto-approved node's certificate right after it
// created the node.
const cacheLag = 2 * time.Second

// signNode is SignNode for the hub named caller: it signs csr for node
// only if the node may hold a certificate for csr's key now.
func (s *Service) signNode(ctx context.Context, csr []byte, node, caller string) ([]byte, error) {
	if err := protocol.ValidNodeName(node); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	key, err := pki.CSRKeyFingerprint(csr)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "node %s: %v", node, err)
	}
	if err := s.checkNotRevoked(ctx, node, key); err != nil {
		return nil, s.refused(caller, node, key, err)
	}
	if err := s.checkNode(ctx, node, key); err != nil {
		return nil, s.refused(caller, node, key, err)
	}
	t := s.trust.Load()
	der, err := t.Current.SignClientCSR(csr, node, s.opts.Clock.Now(), s.opts.CertificateValidity)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "node %s: %v", node, err)
	}
	s.log.Debug("signed a node certificate", "hub", caller, "node", node, "keySHA256", key)
	return der, nil
}

// refused logs a refusal of a node request: a hub asking for what the
// node may not have is worth an operator's look.
func (s *Service) refused(caller, node, key string, err error) error {
	s.log.Info("refused a node certificate", "hub", caller, "node", node, "keySHA256", key, "reason", status.Convert(err).Message())
	return err
}

// checkNotRevoked refuses a key on the revocation list, read from the
// cache. A list that cannot be read refuses too.
func (s *Service) checkNotRevoked(ctx context.Context, node, key string) error {
	e, ok, err := hub.ReadRevokedKey(ctx, s.opts.Client, s.opts.Namespace, key, s.opts.Clock.Now())
	if err != nil {
		return status.Errorf(codes.Unavailable, "node %s: %v", node, err)
	}
	if ok {
		return status.Errorf(codes.PermissionDenied, "node %s: its key was revoked on %s (node %s); it stays refused until %s",
			node, e.Revoked.Format(time.RFC3339), e.Node, e.Expires.Format(time.RFC3339))
	}
	return nil
}

// checkNode says whether node's FleetNode allows a certificate for key:
// from the cache, waiting up to cacheLag for it to change, then from the
// API.
func (s *Service) checkNode(ctx context.Context, node, key string) error {
	// Taken before the cache is read: a change after the read wakes us.
	wake := s.nodeChanged()
	err := s.checkCached(ctx, node, key)
	if err == nil {
		return nil
	}
	if s.opts.Informers != nil {
		timer := s.opts.Clock.NewTimer(cacheLag)
		defer timer.Stop()
	wait:
		for err != nil {
			select {
			case <-wake:
				wake = s.nodeChanged()
				err = s.checkCached(ctx, node, key)
			case <-timer.Chan():
				break wait
			case <-ctx.Done():
				return status.Errorf(codes.Unavailable, "node %s: %v", node, ctx.Err())
			}
		}
		if err == nil {
			return nil
		}
	}
	if status.Code(err) == codes.Unavailable {
		return err
	}
	// The cache may be behind; the API has the last word on a refusal.
	s.metrics.liveReads.Inc()
	var n fleetv1.FleetNode
	if err := s.opts.APIReader.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		if apierrors.IsNotFound(err) {
			return status.Errorf(codes.PermissionDenied, "node %s is not registered", node)
		}
		return status.Errorf(codes.Unavailable, "look up node %s: %v", node, err)
	}
	return nodeAllows(&n, key)
}

func (s *Service) checkCached(ctx context.Context, node, key string) error {
	var n fleetv1.FleetNode
	if err := s.opts.Client.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		if apierrors.IsNotFound(err) {
			return status.Errorf(codes.PermissionDenied, "node %s is not registered", node)
		}
		return status.Errorf(codes.Unavailable, "look up node %s: %v", node, err)
	}
	return nodeAllows(&n, key)
}

// nodeAllows is the signer's rule: n is approved, not revoked, and was
// registered with key. A node registered before keys were recorded has
// none to compare: it registers afresh.
func nodeAllows(n *fleetv1.FleetNode, key string) error {
	switch have := n.Annotations[fleetv1.AnnotationRegistrationKey]; {
	case n.Spec.Revoked:
		return status.Errorf(codes.PermissionDenied, "node %s is revoked", n.Name)
	case !n.Spec.Approved:
		return status.Errorf(codes.PermissionDenied, "node %s is not approved: run `drover approve %s`", n.Name, n.Name)
	case have == "":
		return status.Errorf(codes.PermissionDenied, "node %s has no registration key recorded; delete the FleetNode and register it afresh", n.Name)
	case have != key:
		return status.Errorf(codes.PermissionDenied, "node %s was registered with another key (sha256 %s), not this request's (sha256 %s)", n.Name, have, key)
	}
	return nil
}

// nodeChanged is closed at the next FleetNode event.
func (s *Service) nodeChanged() <-chan struct{} {
	s.changedMu.Lock()
	defer s.changedMu.Unlock()
	return s.changed
}

func (s *Service) notifyNodes() {
	s.changedMu.Lock()
	defer s.changedMu.Unlock()
	close(s.changed)
	s.changed = make(chan struct{})
}

// watchNodes wakes waiting requests at every FleetNode event.
func (s *Service) watchNodes(ctx context.Context) error {
	inf, err := s.opts.Informers.GetInformer(ctx, &fleetv1.FleetNode{})
	if err != nil {
		return err
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.notifyNodes() },
		UpdateFunc: func(any, any) { s.notifyNodes() },
	})
	return err
}

// signHub is SignHub.
func (s *Service) signHub(req hub.HubCertRequest) ([][]byte, error) {
	chain, err := hub.IssueHubCert(s.trust.Load(), req, s.opts.Clock.Now())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "hub %s: %v", req.Hub, err)
	}
	s.log.Info("signed a hub certificate", "hub", req.Hub, "kind", req.Kind.String(), "hosts", req.Hosts)
	return chain, nil
}

// verifyToken is VerifyToken.
func (s *Service) verifyToken(ctx context.Context, token string) (bootstrap.Token, error) {
	tok, err := s.tokens.Verify(ctx, token, s.opts.Clock.Now())
	if err != nil && !errors.Is(err, bootstrap.ErrMalformed) && !errors.Is(err, bootstrap.ErrNotValid) {
		return bootstrap.Token{}, status.Errorf(codes.Unavailable, "%v", err)
	}
	return tok, err
}

// Local is the Service as a hub in this process calls it (`drover
// server`): the same checks as a remote hub's calls, without the network
// and the access review (the process is the manager).
func (s *Service) Local() hub.Signer { return local{s} }

type local struct{ s *Service }

var _ hub.Signer = local{}

func (l local) Trust(ctx context.Context) (*hub.Bundle, error) {
	if err := l.s.wait(ctx); err != nil {
		return nil, err
	}
	return l.s.bundle.Load(), nil
}

func (l local) SignNode(ctx context.Context, csr []byte, node string) ([]byte, error) {
	if err := l.s.wait(ctx); err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	der, err := l.s.signNode(ctx, csr, node, "in-process")
	l.s.metrics.requests.WithLabelValues("SignNode", status.Code(err).String()).Inc()
	return der, err
}

func (l local) SignHub(ctx context.Context, req hub.HubCertRequest) ([][]byte, error) {
	if err := l.s.wait(ctx); err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	chain, err := l.s.signHub(req)
	l.s.metrics.requests.WithLabelValues("SignHub", status.Code(err).String()).Inc()
	return chain, err
}

func (l local) VerifyToken(ctx context.Context, token string) (bootstrap.Token, error) {
	tok, err := l.s.verifyToken(ctx, token)
	l.s.metrics.requests.WithLabelValues("VerifyToken", status.Code(err).String()).Inc()
	return tok, err
}
