package mqttbridge

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/drover-fleet/drover/internal/mqtt/topics"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// Registration over MQTT: a joiner (a machine without a certificate,
// admitted by the embedded broker to its own join topics only) publishes a
// RegisterRequest; the bridge passes it to the hub's Register, the very
// code a gRPC Register runs (size checks, rate limits by the joiner's
// source address and overall, one error for every bad token, key binding,
// approval, signing), and publishes the answer on the joiner's response
// topic.

// joinQueue bounds the registrations waiting for a join worker; beyond it
// they are dropped (the joiner asks again), as the hub's rate limits would
// refuse them anyway.
const joinQueue = 64

// joinWorkerCount is how many registrations the bridge passes to the hub
// at once.
const joinWorkerCount = 4

// joinTimeout bounds the hub's Register for one joiner.
const joinTimeout = 20 * time.Second

// joinRequest is a join request as it arrived.
type joinRequest struct {
	id      string
	payload []byte
}

// queueJoin hands a join request to the workers, or drops it.
func (b *Bridge) queueJoin(id string, payload []byte) {
	select {
	case b.joins <- joinRequest{id: id, payload: payload}:
	default:
		b.log.Debug("join queue full; dropping a registration (the joiner asks again)", "joinID", id)
	}
}

// joinWork passes join requests to the hub until ctx ends.
func (b *Bridge) joinWork(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-b.joins:
			b.join(ctx, j)
		}
	}
}

// join answers one join request.
func (b *Bridge) join(ctx context.Context, j joinRequest) {
	if b.broker == nil {
		// An external broker admits no joiners; whatever published here
		// is not one.
		return
	}
	addr, ok := b.broker.JoinerAddr(j.id)
	if !ok {
		return // the joiner left: nobody to answer
	}
	answer := func(resp *agentv1.RegisterResponse, err error) {
		var a topics.JoinAnswer
		if err != nil {
			st := status.Convert(err)
			a.Code, a.Error = uint32(st.Code()), st.Message()
			a.Status, _ = proto.Marshal(st.Proto())
		} else if a.Response, err = proto.Marshal(resp); err != nil {
			a.Code, a.Error = uint32(codes.Internal), "encode the registration answer: "+err.Error()
		}
		_ = b.publishAsync(ctx, b.layout.JoinResponse(j.id), topics.Encode(a))
	}
	jr, err := topics.DecodeJoin(j.payload)
	if err != nil {
		answer(nil, status.Errorf(codes.InvalidArgument, "malformed join request: %v", err))
		return
	}
	req := new(agentv1.RegisterRequest)
	if err := (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(jr.Request, req); err != nil {
		answer(nil, status.Errorf(codes.InvalidArgument, "malformed registration request: %v", err))
		return
	}
	// The joiner's address, as a gRPC peer's: the hub limits
	// registrations per source from it.
	rctx, cancel := context.WithTimeout(peer.NewContext(ctx, &peer.Peer{Addr: addr}), joinTimeout)
	defer cancel()
	resp, err := b.hub.Register(rctx, req)
	b.metrics.joins.WithLabelValues(status.Code(err).String()).Inc()
	answer(resp, err)
}

// renew answers n's certificate renewal: the hub's own renewal for the key
// of the certificate n is connected with (the broker verified it).
func (b *Bridge) renew(ctx context.Context, n *node, payload []byte) {
	r, err := topics.DecodeRenewal(payload)
	if err != nil {
		b.log.Warn("ignoring a malformed renewal", "node", n.name, "err", err)
		return
	}
	reply := topics.Response{ID: r.ID}
	resp, err := b.renewFor(ctx, n.name, r.Request)
	if err == nil {
		reply.Renewed, err = proto.Marshal(resp)
	}
	if err != nil {
		st := status.Convert(err)
		reply.Code, reply.Error = uint32(st.Code()), st.Message()
	}
	b.respond(n.name, reply)
}

func (b *Bridge) renewFor(ctx context.Context, node string, raw []byte) (*agentv1.RenewResponse, error) {
	req := new(agentv1.RenewRequest)
	if err := (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(raw, req); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "malformed renewal request: %v", err)
	}
	if b.broker == nil {
		// An external broker does not hand over the node's certificate:
		// nothing here proves which key the node holds.
		return nil, status.Error(codes.FailedPrecondition, "certificate renewal over an external MQTT broker is not possible; the agent renews over gRPC (--hub)")
	}
	p, err := b.peer(node)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, joinTimeout)
	defer cancel()
	return b.hub.RenewPeer(cctx, p, req)
}
