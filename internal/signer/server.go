package signer

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/bootstrap"
	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/protocol/signerv1"
)

// The access a caller needs: create on the virtual subresource
// fleetnodes/certificate. It names no node: what a hub may have signed
// for a node is the signer's check of the node, not RBAC's.
const (
	accessVerb        = "create"
	accessResource    = "fleetnodes"
	accessSubresource = "certificate"
)

// bearerToken is the call's bearer token, "" without one.
func bearerToken(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		if t, ok := strings.CutPrefix(v, "Bearer "); ok && t != "" {
			return t
		}
	}
	return ""
}

// reviewToken asks the API server who tok is (a TokenReview, counted). A
// token it does not authenticate is Unauthenticated, for the caller to
// cache; an API server that cannot answer is Unavailable, not cached.
func (s *Service) reviewToken(ctx context.Context, tok string) (authnv1.UserInfo, error) {
	tr := &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: tok}}
	if err := s.opts.Client.Create(ctx, tr); err != nil {
		return authnv1.UserInfo{}, status.Errorf(codes.Unavailable, "check the bearer token with a TokenReview: %v", err)
	}
	s.metrics.reviews.Inc()
	if !tr.Status.Authenticated {
		msg := "the bearer token is not valid"
		if tr.Status.Error != "" {
			msg += ": " + tr.Status.Error
		}
		return authnv1.UserInfo{}, status.Error(codes.Unauthenticated, msg)
	}
	return tr.Status.User, nil
}

// extraMap is a user's extra fields as plain string lists.
func extraMap(e map[string]authnv1.ExtraValue) map[string][]string {
	m := make(map[string][]string, len(e))
	for k, v := range e {
		m[k] = v
	}
	return m
}

// authorize finds who calls, from its bearer token, and checks it may use
// the signer; both answers are cached by token.
func (s *Service) authorize(ctx context.Context) (string, error) {
	tok := bearerToken(ctx)
	if tok == "" {
		return "", status.Error(codes.Unauthenticated, "present the hub's bearer token (its ServiceAccount's)")
	}
	now := s.opts.Clock.Now()
	if e, ok := s.callers.Get(tok, now); ok {
		if !e.OK {
			return "", e.Err // as first answered: Unauthenticated or PermissionDenied
		}
		return e.Value, nil
	}
	u, err := s.reviewToken(ctx, tok)
	if err != nil {
		if status.Code(err) == codes.Unauthenticated {
			s.callers.Refuse(tok, err, now)
		}
		return "", err
	}
	sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: u.Username, UID: u.UID, Groups: u.Groups, Extra: map[string]authzv1.ExtraValue{},
		ResourceAttributes: &authzv1.ResourceAttributes{Verb: accessVerb, Group: fleetv1.GroupVersion.Group,
			Resource: accessResource, Subresource: accessSubresource},
	}}
	for k, v := range u.Extra {
		sar.Spec.Extra[k] = authzv1.ExtraValue(v)
	}
	if err := s.opts.Client.Create(ctx, sar); err != nil {
		return "", status.Errorf(codes.Unavailable, "check access with a SubjectAccessReview: %v", err)
	}
	s.metrics.reviews.Inc()
	if !sar.Status.Allowed {
		msg := fmt.Sprintf("%q may not use Drover's signer: it needs %s on %s/%s of %s (config/rbac/20_hub.yaml)",
			u.Username, accessVerb, accessResource, accessSubresource, fleetv1.GroupVersion.Group)
		err := status.Error(codes.PermissionDenied, msg)
		s.callers.Refuse(tok, err, now)
		s.log.Info("refused a caller", "user", u.Username)
		return "", err
	}
	s.callers.Accept(tok, u.Username, now)
	return u.Username, nil
}

// SignNode implements signerv1.SignerServer.
func (s *Service) SignNode(ctx context.Context, req *signerv1.SignNodeRequest) (*signerv1.SignNodeResponse, error) {
	der, err := s.serve(ctx, "SignNode", func(user string) (any, error) {
		return s.signNode(ctx, req.GetCsr(), req.GetNode(), caller(req.GetHub(), user))
	})
	if err != nil {
		return nil, err
	}
	return &signerv1.SignNodeResponse{Certificate: der.([]byte)}, nil
}

// SignHub implements signerv1.SignerServer.
func (s *Service) SignHub(ctx context.Context, req *signerv1.SignHubRequest) (*signerv1.SignHubResponse, error) {
	chain, err := s.serve(ctx, "SignHub", func(string) (any, error) {
		return s.signHub(hub.HubCertRequest{Hub: req.GetHub(), Kind: hub.HubCertKind(req.GetKind()), CSR: req.GetCsr(),
			Hosts: req.GetHosts(), CommonName: req.GetCommonName()})
	})
	if err != nil {
		return nil, err
	}
	return &signerv1.SignHubResponse{Chain: chain.([][]byte)}, nil
}

// VerifyToken implements signerv1.SignerServer. A bad token is an answer,
// not an error: the hub tells its agent one message for every bad token.
func (s *Service) VerifyToken(ctx context.Context, req *signerv1.VerifyTokenRequest) (*signerv1.VerifyTokenResponse, error) {
	resp, err := s.serve(ctx, "VerifyToken", func(string) (any, error) {
		tok, err := s.verifyToken(ctx, req.GetToken())
		switch {
		case errors.Is(err, bootstrap.ErrMalformed):
			return nil, status.Error(codes.InvalidArgument, bootstrap.ErrMalformed.Error())
		case errors.Is(err, bootstrap.ErrNotValid):
			return &signerv1.VerifyTokenResponse{Reason: err.Error()}, nil
		case err != nil:
			return nil, err
		}
		return &signerv1.VerifyTokenResponse{Valid: true, Id: tok.ID, AutoApprove: tok.AutoApprove, Description: tok.Description}, nil
	})
	if err != nil {
		return nil, err
	}
	return resp.(*signerv1.VerifyTokenResponse), nil
}

// serve authorizes the caller, then runs do once the CA is loaded, and
// counts the result.
func (s *Service) serve(ctx context.Context, method string, do func(user string) (any, error)) (any, error) {
	user, err := s.authorize(ctx)
	var out any
	if err == nil {
		if err = s.wait(ctx); err != nil {
			err = status.Error(codes.Unavailable, err.Error())
		}
	}
	if err == nil {
		out, err = do(user)
	}
	s.metrics.requests.WithLabelValues(method, status.Code(err).String()).Inc()
	return out, err
}

// caller names a remote hub in the log: its name and account.
func caller(hubName, user string) string {
	if len(hubName) > 64 {
		hubName = hubName[:64] + "..."
	}
	return hubName + " (" + user + ")"
}
