package signer

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol/signerv1"
)

// ServerName is the DNS name of the signer's serving certificate, which no
// hub's can carry: operators' tools send their bearer token only to a
// server that proves it (see hub.SignerServerName).
const ServerName = hub.SignerServerName

// maxTokenBytes bounds a bearer token before it is hashed or reviewed
// (the kube-apiserver's own tokens are a few KiB at most).
const maxTokenBytes = 16 << 10

// SignOperator implements signerv1.SignerServer. Unlike the other methods
// its caller is an operator, not a hub: the bearer token is the
// operator's, and only a TokenReview decides. It needs no RBAC of its
// own: the certificate says no more than the token did, for less time, and
// hubs authorize what it may read with a SubjectAccessReview.
func (s *Service) SignOperator(ctx context.Context, req *signerv1.SignOperatorRequest) (*signerv1.SignOperatorResponse, error) {
	resp, err := s.signOperator(ctx, req)
	s.metrics.requests.WithLabelValues("SignOperator", status.Code(err).String()).Inc()
	return resp, err
}

func (s *Service) signOperator(ctx context.Context, req *signerv1.SignOperatorRequest) (*signerv1.SignOperatorResponse, error) {
	id, err := s.reviewOperator(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.wait(ctx); err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	t := s.trust.Load()
	der, err := t.Current.SignOperatorCSR(req.GetCsr(), id, s.opts.Clock.Now(), pki.OperatorValidity)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "operator certificate for %q: %v", id.User, err)
	}
	s.log.Debug("signed an operator certificate", "user", id.User, "groups", id.Groups)
	return &signerv1.SignOperatorResponse{Chain: append([][]byte{der}, t.Cross...), User: id.User}, nil
}

// The bound of the TokenReviews of new operator tokens: far above what
// people running `drover logs` make (a cached token costs none), far below
// what would load an apiserver.
const (
	operatorReviewRate  = 20
	operatorReviewBurst = 50
)

// reviewOperator finds who the operator is from its bearer token, with a
// TokenReview whose answer is cached by the token's hash.
func (s *Service) reviewOperator(ctx context.Context) (pki.OperatorIdentity, error) {
	tok := bearerToken(ctx)
	switch {
	case tok == "":
		return pki.OperatorIdentity{}, status.Error(codes.Unauthenticated, "present your bearer token (your kubeconfig's)")
	case len(tok) > maxTokenBytes:
		return pki.OperatorIdentity{}, status.Errorf(codes.Unauthenticated, "the bearer token is longer than %d bytes", maxTokenBytes)
	}
	now := s.opts.Clock.Now()
	if e, ok := s.operators.Get(tok, now); ok {
		if !e.OK {
			return pki.OperatorIdentity{}, e.Err
		}
		return e.Value, nil
	}
	if !s.reviews.Allow() {
		s.metrics.reviewsLimited.Inc()
		return pki.OperatorIdentity{}, status.Error(codes.ResourceExhausted, "too many new tokens to review right now: retry in a second")
	}
	u, err := s.reviewToken(ctx, tok)
	if err != nil {
		if status.Code(err) == codes.Unauthenticated {
			s.operators.Refuse(tok, err, now)
		}
		return pki.OperatorIdentity{}, err
	}
	id := pki.OperatorIdentity{User: u.Username, UID: u.UID, Groups: u.Groups, Extra: pki.OperatorExtras(extraMap(u.Extra))}
	s.operators.Accept(tok, id, now)
	return id, nil
}

// OperatorCertificate trades an operator's bearer token for an operator
// certificate at the signer at addr (host:port). The key is made here and
// stays in memory. The token is sent only once the signer proved, over
// TLS 1.3, a certificate that chains to roots (Drover's CAs) and is named
// ServerName: no hub can. It returns the certificate with its key, and
// the user it speaks for.
func OperatorCertificate(ctx context.Context, addr string, roots *x509.CertPool, token string) (*tls.Certificate, string, error) {
	if token == "" {
		return nil, "", errors.New("no bearer token to trade for an operator certificate")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, "", fmt.Errorf("generate an operator key: %w", err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: pki.OperatorCommonName}}, key)
	if err != nil {
		return nil, "", fmt.Errorf("operator certificate request: %w", err)
	}
	// ServerName is verified, whatever host addr names: the signer's
	// certificate has it, no hub's does.
	tc := &tls.Config{RootCAs: roots, ServerName: ServerName, MinVersion: tls.VersionTLS13}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)),
		grpc.WithPerRPCCredentials(bearer{func() (string, error) { return token, nil }}))
	if err != nil {
		return nil, "", fmt.Errorf("signer %s: %w", addr, err)
	}
	defer conn.Close()
	resp, err := signerv1.NewSignerClient(conn).SignOperator(ctx, &signerv1.SignOperatorRequest{Csr: csr})
	if err != nil {
		st := status.Convert(err)
		return nil, "", status.Errorf(st.Code(), "Drover's signer at %s (which trades your token for a short-lived certificate): %s", addr, st.Message())
	}
	chain := resp.GetChain()
	if len(chain) == 0 {
		return nil, "", fmt.Errorf("Drover's signer at %s answered no certificate", addr)
	}
	leaf, err := x509.ParseCertificate(chain[0])
	if err != nil {
		return nil, "", fmt.Errorf("the operator certificate from %s: %w", addr, err)
	}
	if pub, ok := leaf.PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(&key.PublicKey) || !pki.IsOperatorCert(leaf) {
		return nil, "", fmt.Errorf("Drover's signer at %s answered a certificate that is not an operator certificate for this key", addr)
	}
	return &tls.Certificate{Certificate: chain, PrivateKey: key, Leaf: leaf}, resp.GetUser(), nil
}
