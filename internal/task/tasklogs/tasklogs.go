// Package tasklogs is the client side of a hub's TaskLogs: it reaches the
// hub serving a task's node with the caller's kubeconfig credentials (a
// client certificate or a bearer token; the hub checks them as the
// kube-apiserver would) and copies the log to a writer. `drover logs` uses
// it.
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
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/operatorv1"
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
	// CAPEM is Drover's CA, which signs hubs' serving certificates.
	CAPEM []byte

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
	err := copyFrom(ctx, o, addr, w)
	var moved *movedError
	if errors.As(err, &moved) && moved.addr != "" && moved.addr != addr {
		// The node moved to another hub since we looked: ask that one, once.
		return copyFrom(ctx, o, moved.addr, w)
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

// Credentials is the TLS configuration and bearer token the kubeconfig's
// credentials give for a hub at addr, trusting Drover's CA in caPEM.
func Credentials(cfg *rest.Config, caPEM []byte, addr string) (*tls.Config, string, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, "", errors.New("no certificate in Drover's CA (see `drover ca`)")
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, "", fmt.Errorf("hub address %q: %w", addr, err)
	}
	kube, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig TLS settings: %w", err)
	}
	tc := &tls.Config{RootCAs: pool, ServerName: host, MinVersion: tls.VersionTLS13}
	if kube != nil {
		tc.Certificates = kube.Certificates
		tc.GetClientCertificate = kube.GetClientCertificate
	}
	token := cfg.BearerToken
	if token == "" && cfg.BearerTokenFile != "" {
		b, err := os.ReadFile(cfg.BearerTokenFile)
		if err != nil {
			return nil, "", fmt.Errorf("read the kubeconfig's token file: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	return tc, token, nil
}

func copyFrom(ctx context.Context, o Options, addr string, w io.Writer) error {
	tc, token, err := Credentials(o.Config, o.CAPEM, addr)
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(2*protocol.MaxLogChunkBytes)))
	if err != nil {
		return fmt.Errorf("hub %s: %w", addr, err)
	}
	defer conn.Close()
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
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
