// Package tasklogs is the client side of a hub's TaskLogs: it reaches the
// hub serving a task's node with a client certificate and copies the log
// to a writer. `drover logs` uses it.
//
// The certificate is the kubeconfig's own, or, for a kubeconfig with a
// bearer token, an operator certificate: a key made in memory, signed for
// ten minutes by the manager's signer once it reviewed the token. The
// token goes only to the signer, verified as Drover's CA's "drover-signer",
// never to a hub, which could replay it. Kubeconfigs whose credentials come
// from an exec or auth-provider plugin are not supported.
package tasklogs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpccreds "google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/operatorv1"
	"github.com/drover-fleet/drover/internal/signer"
)

// Options of one log request.
type Options struct {
	// Config carries the caller's credentials (the kubeconfig's).
	Config *rest.Config
	// Client reads the Task, its FleetNode and the hub's Lease, to find the
	// hub when Hub is empty.
	Client client.Reader
	// Hub is the hub's host:port. Empty: the hub the task's node is
	// connected to, from its FleetNode and the hub's Lease.
	Hub string
	// DroverNamespace holds the hubs' Leases. Default drover-system.
	DroverNamespace string
	// CAPEM is Drover's CA, which signs hubs' and the signer's serving
	// certificates.
	CAPEM []byte
	// Signer is the manager's signer (host:port), which trades a
	// kubeconfig's bearer token for an operator certificate. Empty: the
	// address recorded on Drover's CA bundle (hub.ReadSignerAddress).
	Signer string

	Namespace, Name string
	// Stream is "stdout" (default) or "stderr".
	Stream string
	Follow bool
	// TailBytes starts that many bytes before the end; 0: from the start.
	TailBytes uint64
	// Attempt is the attempt whose log to read; 0: the current one.
	Attempt int32
}

// Copy writes the task's log to w until its end (with Follow: until the
// attempt has ended and its log is drained, or ctx ends).
func Copy(ctx context.Context, o Options, w io.Writer) error {
	if o.DroverNamespace == "" {
		o.DroverNamespace = "drover-system"
	}
	addr := o.Hub
	if addr == "" {
		var err error
		if addr, err = findHub(ctx, o); err != nil {
			return err
		}
	}
	creds, err := clientCredentials(ctx, o)
	if err != nil {
		return err
	}
	err = copyFrom(ctx, o, creds, addr, w)
	var moved *movedError
	if errors.As(err, &moved) && moved.addr != "" && moved.addr != addr {
		// The node moved to another hub since we looked: ask that one, once.
		return copyFrom(ctx, o, creds, moved.addr, w)
	}
	return err
}

// movedError says another hub serves the node.
type movedError struct {
	err  error
	addr string
}

func (e *movedError) Error() string { return e.err.Error() }
func (e *movedError) Unwrap() error { return e.err }

// findHub is the address of the hub that serves the task's node.
func findHub(ctx context.Context, o Options) (string, error) {
	if o.Client == nil {
		return "", errors.New("no hub address: pass --hub host:port")
	}
	var t batchv1.Task
	if err := o.Client.Get(ctx, client.ObjectKey{Namespace: o.Namespace, Name: o.Name}, &t); err != nil {
		return "", fmt.Errorf("get task %s/%s: %w", o.Namespace, o.Name, err)
	}
	node, err := batchv1.AttemptNode(&t, o.Attempt)
	if err != nil {
		return "", fmt.Errorf("%w: no logs to read", err)
	}
	var n fleetv1.FleetNode
	if err := o.Client.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		return "", fmt.Errorf("get node %s of task %s/%s: %w", node, o.Namespace, o.Name, err)
	}
	if n.Status.Hub == "" {
		return "", fmt.Errorf("node %s has never connected to a hub", node)
	}
	var l coordinationv1.Lease
	if err := o.Client.Get(ctx, client.ObjectKey{Namespace: o.DroverNamespace, Name: hub.LeaseName(n.Status.Hub)}, &l); err != nil {
		return "", fmt.Errorf("find the address of hub %s (node %s's) from its Lease (or pass --hub host:port): %w", n.Status.Hub, node, err)
	}
	addr := l.Annotations[hub.AnnotationHubAddress]
	if addr == "" {
		return "", fmt.Errorf("hub %s publishes no address on its Lease %s/%s; pass --hub host:port", n.Status.Hub, o.DroverNamespace, l.Name)
	}
	return addr, nil
}

// credentials are what the caller presents to hubs: a client
// certificate, as the kubeconfig has one or as the signer traded one for
// its token; and Drover's CAs, which hubs' certificates chain to.
type credentials struct {
	roots *x509.CertPool
	// cert and getCert: one is set, as in tls.Config.
	cert    *tls.Certificate
	getCert func(*tls.CertificateRequestInfo) (*tls.Certificate, error)
}

// clientCredentials finds the client certificate for hubs: the
// kubeconfig's, or an operator certificate for its bearer token.
func clientCredentials(ctx context.Context, o Options) (*credentials, error) {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(o.CAPEM) {
		return nil, errors.New("no certificate in Drover's CA (see `drover ca`)")
	}
	cfg := o.Config
	c := &credentials{roots: roots}
	switch {
	case cfg.ExecProvider != nil || cfg.AuthProvider != nil:
		return nil, errors.New("the kubeconfig's credentials come from an exec or auth-provider plugin, which drover logs does not support: " +
			"use a kubeconfig with a client certificate or a bearer token (e.g. `kubectl create token`)")
	case len(cfg.CertData) > 0 || cfg.CertFile != "":
		kube, err := rest.TLSConfigFor(cfg)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig TLS settings: %w", err)
		}
		switch {
		case kube != nil && kube.GetClientCertificate != nil:
			c.getCert = kube.GetClientCertificate
		case kube != nil && len(kube.Certificates) > 0:
			c.cert = &kube.Certificates[0]
		default:
			return nil, errors.New("the kubeconfig names a client certificate, yet none loads")
		}
		return c, nil
	}
	token := cfg.BearerToken
	if token == "" && cfg.BearerTokenFile != "" {
		b, err := os.ReadFile(cfg.BearerTokenFile)
		if err != nil {
			return nil, fmt.Errorf("read the kubeconfig's token file: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	if token == "" {
		return nil, errors.New("the kubeconfig has neither a client certificate nor a bearer token, which hubs need (through Drover's signer for a token)")
	}
	addr := o.Signer
	if addr == "" {
		if o.Client == nil {
			return nil, errors.New("no signer address: pass --signer host:port")
		}
		var err error
		if addr, err = hub.ReadSignerAddress(ctx, o.Client, o.DroverNamespace); err != nil {
			return nil, fmt.Errorf("%w (or pass --signer host:port)", err)
		}
	}
	cert, _, err := signer.OperatorCertificate(ctx, addr, roots, token)
	if err != nil {
		return nil, err
	}
	c.cert = cert
	return c, nil
}

// tlsFor is the TLS configuration for the hub at addr.
func (c *credentials) tlsFor(addr string) (*tls.Config, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("hub address %q: %w", addr, err)
	}
	tc := &tls.Config{RootCAs: c.roots, ServerName: host, MinVersion: tls.VersionTLS13, GetClientCertificate: c.getCert}
	if c.cert != nil {
		tc.Certificates = []tls.Certificate{*c.cert}
	}
	return tc, nil
}

func copyFrom(ctx context.Context, o Options, creds *credentials, addr string, w io.Writer) error {
	tc, err := creds.tlsFor(addr)
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(grpccreds.NewTLS(tc)),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(2*protocol.MaxLogChunkBytes)))
	if err != nil {
		return fmt.Errorf("hub %s: %w", addr, err)
	}
	defer conn.Close()
	stream, err := operatorv1.NewOperatorClient(conn).TaskLogs(ctx, &operatorv1.TaskLogsRequest{
		Namespace: o.Namespace, Name: o.Name, Stream: o.Stream, Follow: o.Follow, TailBytes: o.TailBytes, Attempt: o.Attempt,
	})
	if err != nil {
		return fmt.Errorf("hub %s: %w", addr, err)
	}
	for {
		c, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if status.Code(err) == codes.FailedPrecondition {
				if a := stream.Trailer().Get(hub.TrailerHubAddress); len(a) > 0 {
					return &movedError{err: fmt.Errorf("hub %s: %s", addr, status.Convert(err).Message()), addr: a[0]}
				}
			}
			if s, ok := status.FromError(err); ok {
				return fmt.Errorf("hub %s: %s (%s)", addr, s.Message(), s.Code())
			}
			return fmt.Errorf("hub %s: %w", addr, err)
		}
		if _, err := w.Write(c.GetData()); err != nil {
			return err
		}
		if c.GetEof() {
			return nil
		}
	}
}
