package hub

import (
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/bootstrap"
	"github.com/drover-fleet/drover/internal/fleetnode"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// pendingRetry is how long a pending agent waits before asking again.
const pendingRetry = 5 * time.Second

// Register implements AgentHub. It creates the FleetNode on first contact and
// signs the node's certificate once the node is approved.
//
// Anyone who reaches the hub may call it, so it is bounded before it does
// anything else: calls per source and overall (ResourceExhausted with a
// retry hint), then the node name's and the token's size and shape
// (InvalidArgument, echoing at most a clipped prefix); only then is
// anything logged or looked up.
func (h *Hub) Register(ctx context.Context, req *agentv1.RegisterRequest) (*agentv1.RegisterResponse, error) {
	if err := h.registerAllowed(ctx); err != nil {
		h.metrics.registrations.WithLabelValues(status.Code(err).String()).Inc()
		return nil, err
	}
	resp, reason, err := h.register(ctx, req)
	result := "approved"
	switch {
	case err != nil:
		result = status.Code(err).String()
	case resp.GetResult() == agentv1.RegisterResponse_RESULT_PENDING:
		result = "pending"
	}
	h.metrics.registrations.WithLabelValues(result).Inc()
	if err != nil {
		h.log.Info("registration refused", "node", clipped(req.GetNode()), "reason", cmp.Or(reason, status.Convert(err).Message()))
	}
	return resp, err
}

// registerAllowed takes one call from the caller's source and the overall
// limit, or says when to come back.
func (h *Hub) registerAllowed(ctx context.Context) error {
	src := peerSource(ctx)
	ok, perSource, retry := h.registers.allow(src, h.opts.Clock.Now())
	if ok {
		return nil
	}
	// Rounded up to whole seconds: agents wait at least that long, with
	// their own jitter on top.
	retry = max(time.Second, (retry + time.Second - 1).Truncate(time.Second))
	msg := fmt.Sprintf("too many registrations at this hub; retry in %v", retry)
	if perSource {
		msg = fmt.Sprintf("too many registrations from %s; retry in %v", src, retry)
	}
	st := status.New(codes.ResourceExhausted, msg)
	if d, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(retry)}); err == nil {
		st = d
	}
	// Debug only: a flood of refused calls must not flood the log either.
	h.log.Debug("registration rate-limited", "source", src.String(), "perSource", perSource, "retry", retry)
	return st.Err()
}

// clipped is a value from the wire as it may be logged: at most 64 bytes.
func clipped(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}

// register does Register's work. reason, when set, is what the operator's
// log says instead of the error's message (which an agent sees).
func (h *Hub) register(ctx context.Context, req *agentv1.RegisterRequest) (_ *agentv1.RegisterResponse, reason string, _ error) {
	resp, err := h.registerChecked(ctx, req)
	var refused *tokenRefused
	if errors.As(err, &refused) {
		return nil, refused.reason, refused.st.Err()
	}
	return resp, "", err
}

// tokenRefused is a bad token: st for the agent (one message for every
// bad token), reason for the operator's log.
type tokenRefused struct {
	st     *status.Status
	reason string
}

func (e *tokenRefused) Error() string { return e.reason }

func (h *Hub) registerChecked(ctx context.Context, req *agentv1.RegisterRequest) (*agentv1.RegisterResponse, error) {
	node := req.GetNode()
	// ValidNodeName bounds the name and clips it in its message.
	if err := protocol.ValidNodeName(node); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := validateInfo(req.GetInfo()); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "node %s: %v", node, err)
	}
	now := h.opts.Clock.Now()
	tok, err := h.signer.VerifyToken(ctx, req.GetBootstrapToken())
	switch {
	case errors.Is(err, bootstrap.ErrMalformed):
		return nil, status.Errorf(codes.InvalidArgument, "register node %s: %v", node, bootstrap.ErrMalformed)
	case errors.Is(err, bootstrap.ErrNotValid):
		// One answer for every bad token, so a caller cannot tell which
		// ids exist; the log says which it was.
		return nil, &tokenRefused{st: status.New(codes.Unauthenticated, bootstrap.ErrNotValid.Error()), reason: err.Error()}
	case err != nil:
		return nil, status.Errorf(codes.Unavailable, "register node %s: %v", node, err)
	}

	key, err := pki.CSRKeyFingerprint(req.GetCsr())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "node %s: %v", node, err)
	}
	if err := h.checkNotRevoked(ctx, node, key); err != nil {
		return nil, err
	}
	fn, created, err := h.ensureNode(ctx, node, tok, key, req.GetInfo())
	if err != nil {
		return nil, err
	}
	if fn.Spec.Revoked {
		return nil, status.Errorf(codes.PermissionDenied, "node %s is revoked; delete the FleetNode to let it register again", node)
	}
	if !created {
		if err := h.checkRegistrationKey(fn, key); err != nil {
			return nil, err
		}
	}
	var certDER []byte
	var cert *x509.Certificate
	if fn.Spec.Approved {
		if certDER, err = h.signer.SignNode(ctx, req.GetCsr(), node); err != nil {
			return nil, signError(node, err)
		}
		cert, _ = x509.ParseCertificate(certDER)
	}
	// A new node's first status and, when it is approved at once, its
	// certificate's expiry go in one write, on the object Create returned.
	if created || cert != nil {
		reason, latest := "certificate", (*fleetv1.FleetNode)(nil)
		if created {
			reason, latest = "register", fn
		}
		h.writeStatusOn(ctx, node, latest, reason, func(n *fleetv1.FleetNode) bool {
			changed := false
			if created {
				changed = fleetnode.SetRegistered(n, now, nodeInfo(req.GetInfo())).Changed
			}
			if cert != nil {
				changed = fleetnode.SetCertificate(n, cert) || changed
			}
			return changed
		})
	}
	if !fn.Spec.Approved {
		return &agentv1.RegisterResponse{
			Result:            agentv1.RegisterResponse_RESULT_PENDING,
			Message:           fmt.Sprintf("node %s is waiting for approval: run `drover approve %s` (key sha256 %s)", node, node, key),
			RetryAfterSeconds: uint32(pendingRetry / time.Second),
		}, nil
	}
	t := h.trust.Load()
	return &agentv1.RegisterResponse{
		Result:      agentv1.RegisterResponse_RESULT_APPROVED,
		Certificate: certDER,
		Ca:          t.Current.Raw,
		PreviousCas: t.PreviousDER(),
		Message:     fmt.Sprintf("node %s approved", node),
	}, nil
}

// ensureNode returns the node's FleetNode, creating it on first
// registration (created reports that; its status is still empty).
func (h *Hub) ensureNode(ctx context.Context, node string, tok bootstrap.Token, key string, info *agentv1.NodeInfo) (*fleetv1.FleetNode, bool, error) {
	var fn fleetv1.FleetNode
	err := h.opts.APIReader.Get(ctx, client.ObjectKey{Name: node}, &fn)
	if err == nil {
		return &fn, false, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, false, status.Errorf(codes.Unavailable, "look up node %s: %v", node, err)
	}
	fn = fleetv1.FleetNode{
		ObjectMeta: metav1.ObjectMeta{
			Name:        node,
			Annotations: map[string]string{fleetv1.AnnotationBootstrapToken: tok.ID, fleetv1.AnnotationRegistrationKey: key},
		},
		Spec: fleetv1.FleetNodeSpec{Approved: tok.AutoApprove},
	}
	if tok.AutoApprove {
		// The Approved condition is the manager's: it reads this to say
		// AutoApproved rather than an operator's approval.
		fn.Annotations[fleetv1.AnnotationAutoApprovedBy] = tok.ID
		// The token approves the node as it registers, labels and capacity
		// included (as `drover approve` would); later changes wait for an
		// operator. The manager carries them into metadata.labels.
		if ni := nodeInfo(info); ni != nil {
			fn.Spec.ApprovedLabels = ni.NodeLabels()
			fn.Spec.ApprovedCapacity = ni.Capacity
		}
	}
	if err := h.opts.Client.Create(ctx, &fn); err != nil {
		if apierrors.IsAlreadyExists(err) {
			if err := h.opts.APIReader.Get(ctx, client.ObjectKey{Name: node}, &fn); err != nil {
				return nil, false, status.Errorf(codes.Unavailable, "look up node %s: %v", node, err)
			}
			return &fn, false, nil
		}
		return nil, false, status.Errorf(codes.Unavailable, "create node %s: %v", node, err)
	}
	h.metrics.apiWrites.WithLabelValues("register").Inc()
	return &fn, true, nil
}

// checkRegistrationKey refuses a registration under the name of a node
// that another machine registered: a bootstrap token lets a machine join,
// not take over (or run the work of) a node that exists. The machine that
// registered first keeps its key while it waits for approval (its agent
// keeps the key in its state dir), so its retries match. A node registered
// before keys were recorded is refused once it holds a certificate.
func (h *Hub) checkRegistrationKey(fn *fleetv1.FleetNode, key string) error {
	refuse := func() error {
		return status.Errorf(codes.PermissionDenied, "node %s is already registered by another machine (another key); "+
			"if this machine replaces it, delete the FleetNode first (kubectl delete fleetnode %s), "+
			"or give this machine another --node name", fn.Name, fn.Name)
	}
	switch have := fn.Annotations[fleetv1.AnnotationRegistrationKey]; {
	case have == key:
		return nil
	case have != "":
		return refuse()
	case fn.Status.CertificateExpiry != nil:
		return refuse()
	}
	// Registered before keys were recorded and still waiting: the hub may
	// not write a FleetNode's metadata (config/rbac), so it stays unbound.
	return nil
}

// validateInfo checks what an agent reports before any of it reaches the API.
func validateInfo(info *agentv1.NodeInfo) error {
	// The protocol's bounds first (entries, sizes), then what the API accepts.
	if err := protocol.CheckNodeInfo(info); err != nil {
		return err
	}
	for k, v := range info.GetLabels() {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return fmt.Errorf("label key %q: %s", k, errs[0])
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return fmt.Errorf("label %s value %q: %s", k, v, errs[0])
		}
	}
	for k, v := range info.GetCapacity() {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return fmt.Errorf("capacity name %q: %s", k, errs[0])
		}
		if _, err := resource.ParseQuantity(v); err != nil {
			return fmt.Errorf("capacity %s %q: %v", k, v, err)
		}
	}
	return nil
}

// applyInfo copies what the agent reported into status; it reports whether
// anything changed.
func applyInfo(n *fleetv1.FleetNode, info *agentv1.NodeInfo) bool {
	return fleetnode.SetReported(n, nodeInfo(info))
}

// nodeInfo is what the agent reported, as the FleetNode keeps it (nil for
// nil). info passed validateInfo: a capacity that does not parse is not
// there.
func nodeInfo(info *agentv1.NodeInfo) *fleetnode.Info {
	if info == nil {
		return nil
	}
	out := &fleetnode.Info{AgentVersion: info.GetAgentVersion(), OS: info.GetOs(), Arch: info.GetArch(),
		Hostname: info.GetHostname(), Labels: info.GetLabels()}
	if len(info.GetCapacity()) > 0 {
		out.Capacity = corev1.ResourceList{}
		for k, v := range info.GetCapacity() {
			if q, err := resource.ParseQuantity(v); err == nil {
				out.Capacity[corev1.ResourceName(k)] = q
			}
		}
	}
	return out
}
