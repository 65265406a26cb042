package signer

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/drover-fleet/drover/internal/bootstrap"
	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/protocol/signerv1"
)

// ClientOptions configure a Client.
type ClientOptions struct {
	// Address is the signer's host:port. Required.
	Address string
	// Hub is the calling hub's name, for the signer's log. Required.
	Hub string
	// Reader reads the CA bundle ConfigMap of Namespace (hub.BundleName):
	// the hub trusts the signer's certificate with it. Required.
	Reader    client.Reader
	Namespace string
	// Token returns the hub's bearer token at each call (a
	// ServiceAccount's token is rotated on disk). Required; see
	// TokenSource.
	Token func() (string, error)
}

// Client is a hub's Signer that calls the manager's signer.
type Client struct {
	opts  ClientOptions
	conn  *grpc.ClientConn
	rpc   signerv1.SignerClient
	roots atomic.Pointer[x509.CertPool]
}

var _ hub.Signer = (*Client)(nil)

// NewClient returns a Client; it connects at its first call.
func NewClient(opts ClientOptions) (*Client, error) {
	host, _, err := net.SplitHostPort(opts.Address)
	switch {
	case err != nil:
		return nil, fmt.Errorf("signer address %q: %w", opts.Address, err)
	case opts.Reader == nil || opts.Token == nil || opts.Hub == "":
		return nil, errors.New("signer client: Reader, Token and Hub are required")
	}
	if opts.Namespace == "" {
		opts.Namespace = "drover-system"
	}
	c := &Client{opts: opts}
	tc := &tls.Config{
		ServerName: host,
		MinVersion: tls.VersionTLS13,
		// Verified below against the bundle as last read, which follows
		// a CA rotation; Go's own check would take a fixed pool.
		InsecureSkipVerify: true, //nolint:gosec // VerifyConnection verifies.
		VerifyConnection: func(cs tls.ConnectionState) error {
			roots := c.roots.Load()
			if roots == nil {
				return errors.New("Drover's CA bundle is not loaded yet: cannot verify the signer")
			}
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the signer presented no certificate")
			}
			inter := x509.NewCertPool()
			for _, ic := range cs.PeerCertificates[1:] {
				inter.AddCert(ic)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: host})
			if err != nil {
				return fmt.Errorf("the signer's certificate: %w", err)
			}
			return nil
		},
	}
	conn, err := grpc.NewClient(opts.Address, grpc.WithTransportCredentials(credentials.NewTLS(tc)),
		grpc.WithPerRPCCredentials(bearer{opts.Token}))
	if err != nil {
		return nil, fmt.Errorf("signer client for %s: %w", opts.Address, err)
	}
	c.conn, c.rpc = conn, signerv1.NewSignerClient(conn)
	return c, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Trust reads the CA bundle from its ConfigMap, and verifies the signer
// with it from then on.
func (c *Client) Trust(ctx context.Context) (*hub.Bundle, error) {
	b, err := hub.ReadBundle(ctx, c.opts.Reader, c.opts.Namespace)
	if err != nil {
		return nil, err
	}
	c.roots.Store(b.Pool())
	return b, nil
}

// SignNode implements hub.Signer.
func (c *Client) SignNode(ctx context.Context, csr []byte, node string) ([]byte, error) {
	resp, err := c.rpc.SignNode(ctx, &signerv1.SignNodeRequest{Csr: csr, Node: node, Hub: c.opts.Hub})
	if err != nil {
		return nil, callError(err)
	}
	return resp.GetCertificate(), nil
}

// SignHub implements hub.Signer.
func (c *Client) SignHub(ctx context.Context, req hub.HubCertRequest) ([][]byte, error) {
	resp, err := c.rpc.SignHub(ctx, &signerv1.SignHubRequest{Csr: req.CSR, Hub: req.Hub, Kind: signerv1.HubCertificate(req.Kind),
		Hosts: req.Hosts, CommonName: req.CommonName})
	if err != nil {
		return nil, callError(err)
	}
	return resp.GetChain(), nil
}

// VerifyToken implements hub.Signer.
func (c *Client) VerifyToken(ctx context.Context, token string) (bootstrap.Token, error) {
	resp, err := c.rpc.VerifyToken(ctx, &signerv1.VerifyTokenRequest{Token: token, Hub: c.opts.Hub})
	switch {
	case status.Code(err) == codes.InvalidArgument:
		return bootstrap.Token{}, bootstrap.ErrMalformed
	case err != nil:
		return bootstrap.Token{}, fmt.Errorf("verify the bootstrap token with the signer: %w", callError(err))
	case !resp.GetValid():
		return bootstrap.Token{}, fmt.Errorf("%s (the signer): %w", resp.GetReason(), bootstrap.ErrNotValid)
	}
	return bootstrap.Token{ID: resp.GetId(), AutoApprove: resp.GetAutoApprove(), Description: resp.GetDescription()}, nil
}

// callError keeps the signer's refusals (its status) and makes the rest
// Unavailable: the agent retries what the signer could not answer.
func callError(err error) error {
	switch status.Code(err) {
	case codes.PermissionDenied, codes.InvalidArgument, codes.Unauthenticated, codes.ResourceExhausted:
		st := status.Convert(err)
		return status.Error(st.Code(), "the signer refused: "+st.Message())
	}
	return status.Errorf(codes.Unavailable, "the signer: %v", status.Convert(err).Message())
}

// bearer sends the hub's token with every call.
type bearer struct{ token func() (string, error) }

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	t, err := b.token()
	if err != nil {
		return nil, fmt.Errorf("the hub's bearer token for the signer: %w", err)
	}
	return map[string]string{"authorization": "Bearer " + t}, nil
}

func (bearer) RequireTransportSecurity() bool { return true }

// TokenSource is the bearer token of cfg, the hub's kubeconfig: its token
// file (re-read as the kubelet rotates a ServiceAccount's) or its token.
// A kubeconfig with only a client certificate has none to give.
func TokenSource(cfg *rest.Config) (func() (string, error), error) {
	switch {
	case cfg.BearerTokenFile != "":
		ts := transport.NewCachedFileTokenSource(cfg.BearerTokenFile)
		return func() (string, error) {
			t, err := ts.Token()
			if err != nil {
				return "", err
			}
			return t.AccessToken, nil
		}, nil
	case cfg.BearerToken != "":
		tok := cfg.BearerToken
		return func() (string, error) { return tok, nil }, nil
	}
	return nil, errors.New("the hub's kubeconfig has no bearer token: the signer authenticates hubs by token " +
		"(run the hub as its ServiceAccount, drover-hub, or give a kubeconfig with a token)")
}
