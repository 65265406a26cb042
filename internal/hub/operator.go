package hub

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	authzv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/protocol/operatorv1"
)

// The operator-facing service (drover.operator.v1.Operator) shares the
// agents' listener. Its callers are people and their tools, authenticated
// by client certificate only: one signed by the kube-apiserver's client CA
// (as an aggregated API server reads one), or an operator certificate
// (pki.SignOperatorCSR) the manager's signer gave for a bearer token it
// reviewed; then authorized with a SubjectAccessReview. A bearer token never
// reaches a hub, so a compromised hub has none to replay.

// Trailers a TaskLogs call that another hub must answer carries.
const (
	TrailerHub        = "drover-hub"
	TrailerHubAddress = "drover-hub-address"
)

// AnnotationHubAddress on a hub's Lease is the address the hub listens on,
// for tools (drover logs) that must reach the hub serving a node.
const AnnotationHubAddress = "fleet.drover.io/hub-address"

// kubeClientCA is where the kube-apiserver publishes its client CA for
// aggregated API servers.
const (
	kubeAuthNamespace = "kube-system"
	kubeAuthConfigMap = "extension-apiserver-authentication"
	kubeClientCAKey   = "client-ca-file"
)

// Log requests are bounded: each one holds a goroutine and a file open on
// its agent for as long as it is followed (at most 12 hours, the agent's
// own bound), so a loop of `drover logs -f` must not pile them up.
const (
	// maxLogRequestsPerNode bounds the log requests one node serves at once
	// through this hub.
	maxLogRequestsPerNode = 16
	// maxLogRequests bounds them over all nodes of this hub.
	maxLogRequests = 1024
)

// addLogRequest registers lr under id, within the bounds above.
func (h *Hub) addLogRequest(id string, lr *logRequest) error {
	h.logMu.Lock()
	defer h.logMu.Unlock()
	if len(h.logReqs) >= maxLogRequests {
		return status.Errorf(codes.ResourceExhausted, "hub %s already serves %d log requests; try again when some have ended", h.opts.Name, len(h.logReqs))
	}
	n := 0
	for _, r := range h.logReqs {
		if r.node == lr.node {
			n++
		}
	}
	if n >= maxLogRequestsPerNode {
		return status.Errorf(codes.ResourceExhausted, "node %s already serves %d log requests through hub %s; try again when some have ended", lr.node, n, h.opts.Name)
	}
	h.logReqs[id] = lr
	return nil
}

// logAnswerTimeout bounds the wait for an agent's first chunk: an agent
// that does not know LogRequests ignores them.
const logAnswerTimeout = 30 * time.Second

// kubeCARefresh is how often the kube-apiserver's client CA is re-read.
const kubeCARefresh = 5 * time.Minute

// logStall bounds how long an agent's chunk waits for a slow reader: less
// than the agent's call timeout, so that the hub, not the agent's timeout,
// decides, and the reader learns why its stream ended.
const logStall = 10 * time.Second

// logRequest is one TaskLogs call waiting for its agent's chunks.
type logRequest struct {
	node string
	ch   chan *agentv1.LogChunk
	done chan struct{}
	// stalled is closed when a chunk waited logStall for the reader.
	stalled   chan struct{}
	stallOnce sync.Once
}

// loadKubeClientCA reads the kube-apiserver's client CA. A hub that cannot
// read it accepts only operator certificates from operators.
func (h *Hub) loadKubeClientCA(ctx context.Context) {
	var cm corev1.ConfigMap
	err := h.opts.APIReader.Get(ctx, client.ObjectKey{Namespace: kubeAuthNamespace, Name: kubeAuthConfigMap}, &cm)
	if err != nil {
		h.log.Warn("cannot read the kube-apiserver's client CA; operators need operator certificates (drover logs with a token kubeconfig)", "configmap", kubeAuthNamespace+"/"+kubeAuthConfigMap, "err", err)
		return
	}
	var certs []*x509.Certificate
	rest := []byte(cm.Data[kubeClientCAKey])
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if c, err := x509.ParseCertificate(b.Bytes); err == nil {
			certs = append(certs, c)
		}
	}
	if len(certs) == 0 {
		h.log.Warn("the kube-apiserver publishes no client CA; operators need operator certificates (drover logs with a token kubeconfig)")
	}
	h.kubeCAs.Store(&certs)
	h.updateClientCAs()
}

// refreshKubeClientCA re-reads the client CA now and then, so a rotated one
// is accepted without restarting the hub.
func (h *Hub) refreshKubeClientCA(ctx context.Context) error {
	t := h.opts.Clock.NewTicker(kubeCARefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.Chan():
			h.loadKubeClientCA(ctx)
		}
	}
}

// fromKubeCA reports whether root is one of the kube-apiserver's client CAs.
func (h *Hub) fromKubeCA(root *x509.Certificate) bool {
	p := h.kubeCAs.Load()
	if p == nil {
		return false
	}
	for _, c := range *p {
		if bytes.Equal(c.Raw, root.Raw) {
			return true
		}
	}
	return false
}

// rootedAtDrover reports whether chain ends at one of Drover's CAs (the
// current one, or one a rotation replaced that is still trusted).
func (h *Hub) rootedAtDrover(chain []*x509.Certificate) bool {
	t := h.trust.Load()
	return len(chain) > 0 && t != nil && t.trusts(chain[len(chain)-1])
}

// user is an authenticated operator.
type user struct {
	name, uid string
	groups    []string
	extra     map[string]authzv1.ExtraValue
}

// authenticate finds who calls, by client certificate only: an operator
// certificate of Drover's CA (its identity as the manager's signer
// reviewed it from the operator's token), or a certificate of the
// kube-apiserver's client CA (as the kube-apiserver reads one). Bearer
// tokens are refused: a hub that saw one could replay it anywhere the
// operator may go.
func (h *Hub) authenticate(ctx context.Context) (*user, error) {
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			for _, chain := range ti.State.VerifiedChains {
				if !h.rootedAtDrover(chain) {
					continue
				}
				if !pki.IsOperatorCert(chain[0]) {
					return nil, status.Error(codes.PermissionDenied, "a node or hub certificate cannot call the operator API; use your kubeconfig's credentials")
				}
				id, err := pki.OperatorIdentityOf(chain[0])
				if err != nil {
					return nil, status.Errorf(codes.Unauthenticated, "operator certificate: %v", err)
				}
				u := &user{name: id.User, uid: id.UID, groups: id.Groups}
				if m := id.ExtraMap(); m != nil {
					u.extra = make(map[string]authzv1.ExtraValue, len(m))
					for k, v := range m {
						u.extra[k] = v
					}
				}
				return u, nil
			}
			for _, chain := range ti.State.VerifiedChains {
				if len(chain) > 0 && h.fromKubeCA(chain[len(chain)-1]) {
					c := chain[0]
					return &user{name: c.Subject.CommonName, groups: append(c.Subject.Organization, "system:authenticated")}, nil
				}
			}
		}
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if len(md.Get("authorization")) > 0 {
		h.metrics.tokensRefused.Inc()
		return nil, status.Error(codes.Unauthenticated, "hubs no longer accept bearer tokens (a hub could replay them): update drover; "+
			"`drover logs` trades your token for a short-lived certificate at Drover's signer and sends the hub that")
	}
	return nil, status.Error(codes.Unauthenticated, "present a client certificate: your kubeconfig's (signed by the kube-apiserver's client CA), "+
		"or an operator certificate from Drover's signer (`drover logs` gets one for a kubeconfig with a token)")
}

// authorize asks the kube-apiserver whether u may get the log of the task.
func (h *Hub) authorize(ctx context.Context, u *user, ns, name string) error {
	sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: u.name, UID: u.uid, Groups: u.groups, Extra: u.extra,
		ResourceAttributes: &authzv1.ResourceAttributes{
			Namespace: ns, Verb: "get", Group: "batch.drover.io", Resource: "tasks", Subresource: "log", Name: name,
		},
	}}
	if err := h.opts.Client.Create(ctx, sar); err != nil {
		return status.Errorf(codes.Unavailable, "check access with a SubjectAccessReview: %v", err)
	}
	if !sar.Status.Allowed {
		msg := fmt.Sprintf("user %q cannot get tasks/log %s in namespace %q", u.name, name, ns)
		if sar.Status.Reason != "" {
			msg += ": " + sar.Status.Reason
		}
		return status.Error(codes.PermissionDenied, msg)
	}
	return nil
}

// TaskLogs implements operatorv1.OperatorServer.
func (h *Hub) TaskLogs(req *operatorv1.TaskLogsRequest, stream grpc.ServerStreamingServer[agentv1.LogChunk]) error {
	ctx := stream.Context()
	u, err := h.authenticate(ctx)
	if err != nil {
		return err
	}
	if req.GetNamespace() == "" || req.GetName() == "" {
		return status.Error(codes.InvalidArgument, "namespace and name of the task are required")
	}
	if err := h.authorize(ctx, u, req.GetNamespace(), req.GetName()); err != nil {
		return err
	}
	if h.logs == nil {
		return status.Errorf(codes.Unimplemented, "hub %s serves no task logs", h.opts.Name)
	}
	stream_ := req.GetStream()
	if stream_ == "" {
		stream_ = protocol.LogStdout
	}
	if stream_ != protocol.LogStdout && stream_ != protocol.LogStderr {
		return status.Errorf(codes.InvalidArgument, "stream %q: want stdout or stderr", stream_)
	}
	if req.GetAttempt() < 0 {
		return status.Errorf(codes.InvalidArgument, "attempt %d: want 1 or more, or 0 for the current one", req.GetAttempt())
	}
	node, uid, err := h.logs.LogTarget(ctx, req.GetNamespace(), req.GetName(), req.GetAttempt())
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return err
		}
		if apierrors.IsNotFound(err) {
			return status.Errorf(codes.NotFound, "task %s/%s not found", req.GetNamespace(), req.GetName())
		}
		return status.Errorf(codes.Unavailable, "task %s/%s: %v", req.GetNamespace(), req.GetName(), err)
	}
	h.mu.Lock()
	s := h.sessions[node]
	h.mu.Unlock()
	if s == nil {
		return h.elsewhere(ctx, stream, node)
	}

	id := protocol.NewID()
	lr := &logRequest{node: node, ch: make(chan *agentv1.LogChunk, 4), done: make(chan struct{}), stalled: make(chan struct{})}
	if err := h.addLogRequest(id, lr); err != nil {
		return err
	}
	defer func() {
		h.logMu.Lock()
		delete(h.logReqs, id)
		h.logMu.Unlock()
		close(lr.done)
	}()
	env := protocol.NewLogRequest(node, &agentv1.LogRequest{RequestId: id, Uid: uid, Stream: stream_, Follow: req.GetFollow(), TailBytes: req.GetTailBytes()})
	if err := s.send(env); err != nil {
		return status.Errorf(codes.Unavailable, "ask node %s for logs: %v", node, err)
	}
	h.log.Info("task logs requested", "user", u.name, "task", req.GetNamespace()+"/"+req.GetName(), "node", node, "uid", uid, "follow", req.GetFollow())
	first := h.opts.Clock.NewTimer(logAnswerTimeout)
	defer first.Stop()
	for {
		select {
		case c := <-lr.ch:
			first.Stop()
			if c.GetError() != "" {
				return status.Errorf(codes.FailedPrecondition, "node %s: %s", node, c.GetError())
			}
			if len(c.GetData()) == 0 && !c.GetEof() {
				continue // the agent's "started"
			}
			if err := stream.Send(&agentv1.LogChunk{Data: c.GetData(), Eof: c.GetEof()}); err != nil {
				return err
			}
			if c.GetEof() {
				return nil
			}
		case <-lr.stalled:
			return status.Errorf(codes.ResourceExhausted, "the reader took more than %s to take a chunk; the agent of node %s stopped sending", logStall, node)
		case <-first.Chan():
			return status.Errorf(codes.DeadlineExceeded, "the agent of node %s did not answer the log request within %s (is it older than this hub?)", node, logAnswerTimeout)
		case <-s.done:
			return status.Errorf(codes.Unavailable, "node %s disconnected from hub %s; try again", node, h.opts.Name)
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// elsewhere answers a log request for a node this hub does not serve: with
// the hub that does, if any, so the caller can ask it.
func (h *Hub) elsewhere(ctx context.Context, stream grpc.ServerStream, node string) error {
	var fn fleetv1.FleetNode
	if err := h.opts.APIReader.Get(ctx, client.ObjectKey{Name: node}, &fn); err != nil {
		return status.Errorf(codes.Unavailable, "node %s is not connected to hub %s, and its FleetNode cannot be read: %v", node, h.opts.Name, err)
	}
	other := fn.Status.Hub
	if fn.Status.Phase != fleetv1.FleetNodeOnline || other == "" || other == h.opts.Name {
		return status.Errorf(codes.Unavailable, "node %s is not connected to any hub (phase %s); its logs stay on the node until it reconnects", node, orUnknown(string(fn.Status.Phase)))
	}
	addr := h.hubAddress(ctx, other)
	stream.SetTrailer(metadata.Pairs(TrailerHub, other, TrailerHubAddress, addr))
	return status.Errorf(codes.FailedPrecondition, "node %s is connected to hub %s (%s), not to hub %s: ask that hub", node, other, orUnknown(addr), h.opts.Name)
}

// hubAddress is the address hub published on its Lease, or "".
func (h *Hub) hubAddress(ctx context.Context, hub string) string {
	var l coordinationv1.Lease
	if err := h.opts.APIReader.Get(ctx, client.ObjectKey{Namespace: h.opts.Namespace, Name: LeaseName(hub)}, &l); err != nil {
		return ""
	}
	return l.Annotations[AnnotationHubAddress]
}

// advertisedAddress is this hub's address for its Lease: its first serving
// host and the port it listens on.
func (h *Hub) advertisedAddress() string {
	if h.addr == nil || len(h.opts.ServingHosts) == 0 {
		return ""
	}
	_, port, err := net.SplitHostPort(h.addr.String())
	if err != nil {
		return ""
	}
	if _, err := strconv.Atoi(port); err != nil {
		return ""
	}
	return net.JoinHostPort(h.opts.ServingHosts[0], port)
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// deliverLog hands an agent's chunk to the TaskLogs call waiting for it,
// waiting while the caller reads slowly: that is the stream's flow control.
// A chunk nobody waits for is refused, which stops the agent.
func (h *Hub) deliverLog(ctx context.Context, node string, c *agentv1.LogChunk) (*agentv1.SendResponse, error) {
	h.logMu.Lock()
	lr := h.logReqs[c.GetRequestId()]
	h.logMu.Unlock()
	if lr == nil || lr.node != node {
		return nil, status.Errorf(codes.NotFound, "log request %s is over", c.GetRequestId())
	}
	stall := h.opts.Clock.NewTimer(logStall)
	defer stall.Stop()
	select {
	case lr.ch <- c:
		return &agentv1.SendResponse{}, nil
	case <-stall.Chan():
		lr.stallOnce.Do(func() { close(lr.stalled) })
		return nil, status.Errorf(codes.ResourceExhausted, "log request %s: the reader is too slow", c.GetRequestId())
	case <-lr.done:
		return nil, status.Errorf(codes.NotFound, "log request %s is over", c.GetRequestId())
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}
