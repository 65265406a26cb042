package signer_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol/signerv1"
	"github.com/drover-fleet/drover/internal/signer"
)

// bundlePool is Drover's CAs as operators' tools read them: the public
// bundle ConfigMap.
func (f *fixture) bundlePool() *x509.CertPool {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	b, err := hub.ReadBundle(ctx, env.Client, f.ns)
	if err != nil {
		f.t.Fatal(err)
	}
	return b.Pool()
}

func TestSignOperator(t *testing.T) {
	f := newFixture(t, "signer-operator")
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	roots := f.bundlePool()
	// An account with no access at all: reviewing its token is all it takes.
	token := f.hubToken("reader", false)

	before := time.Now()
	cert, user, err := signer.OperatorCertificate(ctx, f.addr, roots, token)
	after := time.Now()
	if err != nil {
		t.Fatalf("a valid token: %v", err)
	}
	wantUser := "system:serviceaccount:" + f.ns + ":reader"
	if user != wantUser {
		t.Errorf("user %q, want %q", user, wantUser)
	}
	leaf := cert.Leaf
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("the operator certificate does not chain to Drover's CA: %v", err)
	}
	id, err := pki.OperatorIdentityOf(leaf)
	if err != nil {
		t.Fatal(err)
	}
	if id.User != wantUser || id.UID == "" || !slices.Contains(id.Groups, "system:serviceaccounts:"+f.ns) {
		t.Errorf("identity %+v: want %s with its uid and groups", id, wantUser)
	}
	// The token's extra fields go into the certificate (a service
	// account token's credential id), so authorizers that read them see
	// them at the hub too.
	if len(id.ExtraMap()["authentication.kubernetes.io/credential-id"]) == 0 {
		t.Errorf("identity %+v: want the token's extra authentication.kubernetes.io/credential-id", id)
	}
	// Ten minutes from signing (certificate times have whole seconds).
	if lo, hi := before.Add(pki.OperatorValidity).Truncate(time.Second), after.Add(pki.OperatorValidity); leaf.NotAfter.Before(lo) || leaf.NotAfter.After(hi) {
		t.Errorf("NotAfter %s, want between %s and %s (10 minutes after signing)", leaf.NotAfter, lo, hi)
	}
	if slices.Contains(leaf.Subject.Organization, "drover:nodes") || leaf.Subject.CommonName != pki.OperatorCommonName {
		t.Errorf("subject %v: an operator certificate must not look like a node's", leaf.Subject)
	}

	// Refused tokens, and no token, with the direct gRPC call (the
	// client function refuses an empty token itself).
	for name, tok := range map[string]string{"a bad token": "not-a-token", "no token": ""} {
		_, _, err := signer.OperatorCertificate(ctx, f.addr, roots, tok)
		if tok != "" && status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s: %v, want Unauthenticated", name, err)
		}
		conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: signer.ServerName, MinVersion: tls.VersionTLS13})))
		if err != nil {
			t.Fatal(err)
		}
		_, der, _ := csr(t, "x")
		_, err = signerv1.NewSignerClient(conn).SignOperator(ctx, &signerv1.SignOperatorRequest{Csr: der})
		if tok == "" && status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s: %v, want Unauthenticated", name, err)
		}
		conn.Close()
	}

	// A node's request, with its registered key: still an operator
	// certificate, never a node's.
	_, nodeCSR, nodeKey := csr(t, "operator-node")
	f.node("operator-node", nodeKey, true)
	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: signer.ServerName, MinVersion: tls.VersionTLS13})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rpc := signerv1.NewSignerClient(conn)
	resp, err := rpc.SignOperator(withToken(ctx, token), &signerv1.SignOperatorRequest{Csr: nodeCSR})
	if err != nil {
		t.Fatal(err)
	}
	got, err := x509.ParseCertificate(resp.GetChain()[0])
	if err != nil {
		t.Fatal(err)
	}
	if got.Subject.CommonName == "operator-node" || slices.Contains(got.Subject.Organization, "drover:nodes") || !pki.IsOperatorCert(got) {
		t.Errorf("a node's request through SignOperator got %v: want the operator subject and usage", got.Subject)
	}
	// And the operator's token cannot have a node certificate signed: it
	// is no hub's.
	if _, err := rpc.SignNode(withToken(ctx, token), &signerv1.SignNodeRequest{Csr: nodeCSR, Node: "operator-node", Hub: "x"}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("SignNode with an operator's token: %v, want PermissionDenied", err)
	}

	// Tools find the signer on the public bundle.
	if a, err := hub.ReadSignerAddress(ctx, env.Client, f.ns); err != nil || a != f.addr {
		t.Errorf("the bundle names the signer at %q (%v), want %s", a, err, f.addr)
	}
}

// The signer's name is its own: no hub gets a serving certificate with it,
// and a server of Drover's CA without it gets no token.
func TestSignerNameIsTheSignersOnly(t *testing.T) {
	f := newFixture(t, "signer-name")
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	c := f.client("hub-y", f.hubToken("hub", true))
	_, der, _ := csr(t, "whatever")
	for _, host := range []string{signer.ServerName, "DROVER-SIGNER"} {
		if _, err := c.SignHub(ctx, hub.HubCertRequest{Hub: "hub-y", Kind: hub.HubServing, CSR: der, Hosts: []string{"127.0.0.1", host}}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("a hub serving certificate for %s: %v, want InvalidArgument", host, err)
		}
	}

	// A hub's server (a certificate of Drover's CA, without the name):
	// the client refuses it before it sends the token.
	keyPEM, hubCSR, _ := csr(t, "whatever")
	chain, err := c.SignHub(ctx, hub.HubCertRequest{Hub: "hub-y", Kind: hub.HubServing, CSR: hubCSR, Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.ParseKey(keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{{Certificate: chain, PrivateKey: key}}, MinVersion: tls.VersionTLS13})),
		grpc.UnaryInterceptor(rec.intercept))
	signerv1.RegisterSignerServer(srv, signerv1.UnimplementedSignerServer{})
	addr := serve(t, srv)
	if _, _, err := signer.OperatorCertificate(ctx, addr, f.bundlePool(), "secret-token"); err == nil {
		t.Fatal("a hub posing as the signer was trusted")
	}
	if rec.calls() != 0 {
		t.Errorf("a hub posing as the signer got %d calls", rec.calls())
	}
}

func withToken(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// recorder counts the calls that reached a server.
type recorder struct{ n atomic.Int64 }

func (r *recorder) intercept(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	r.n.Add(1)
	return h(ctx, req)
}

func (r *recorder) calls() int64 { return r.n.Load() }

// serve runs srv on loopback until the test ends.
func serve(t *testing.T, srv *grpc.Server) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return lis.Addr().String()
}

// TestSignOperatorBoundsNewTokenReviews: new tokens cost a TokenReview
// each, so past the review rate the signer refuses them (ResourceExhausted)
// instead of passing a flood to the apiserver; a token it has cached
// still works.
func TestSignOperatorBoundsNewTokenReviews(t *testing.T) {
	f := newFixture(t, "signer-review-rate", func(o *signer.Options) { o.OperatorReviewRate, o.OperatorReviewBurst = 0.001, 2 })
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	roots := f.bundlePool()
	token := f.hubToken("reader", false)
	if _, _, err := signer.OperatorCertificate(ctx, f.addr, roots, token); err != nil {
		t.Fatalf("the first token: %v", err)
	}
	if _, _, err := signer.OperatorCertificate(ctx, f.addr, roots, "bad-token-1"); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("the second token (within the burst): %v, want Unauthenticated", err)
	}
	if _, _, err := signer.OperatorCertificate(ctx, f.addr, roots, "bad-token-2"); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a third new token past the burst: %v, want ResourceExhausted", err)
	}
	if _, _, err := signer.OperatorCertificate(ctx, f.addr, roots, token); err != nil {
		t.Errorf("a cached token is not limited: %v", err)
	}
}
