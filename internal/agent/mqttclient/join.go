package mqttclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"strings"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/drover-fleet/drover/internal/mqtt/topics"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// JoinOptions configure one registration over MQTT.
type JoinOptions struct {
	// Broker is the hub's embedded broker: ssl://host:port. Required.
	Broker string
	// Prefix is the topic prefix. Default: topics.DefaultPrefix.
	Prefix string
	// RootCAs are the CAs to trust the broker with (Drover's CA). Required.
	RootCAs *x509.CertPool
	// Wait bounds the wait for the hub's answer. Default: 20s.
	Wait time.Duration
	// Logger. Default: discard.
	Logger *slog.Logger
}

// ErrNoJoiners is in the error of a broker that admits no client without a
// certificate: an external broker (Mosquitto), or an old hub.
var ErrNoJoiners = errors.New("the broker admits no machine without a certificate")

// Join registers over MQTT: it connects to the broker without a client
// certificate, as a joiner with a random join id (the broker confines it to
// that id's join topics), publishes req, and returns the hub's answer, a
// gRPC status error when the hub refused, as Register over gRPC does.
func Join(ctx context.Context, opts JoinOptions, req *agentv1.RegisterRequest) (*agentv1.RegisterResponse, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.Wait <= 0 {
		opts.Wait = 20 * time.Second
	}
	layout, err := topics.New(opts.Prefix)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	broker, host, err := topics.BrokerURL(opts.Broker)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	body, err := proto.Marshal(req)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	id := topics.NewJoinID()
	answers := make(chan []byte, 1)
	mc := paho.NewClient(paho.NewClientOptions().
		AddBroker(broker).
		SetClientID(topics.JoinClientID(id)).
		SetTLSConfig(&tls.Config{RootCAs: opts.RootCAs, ServerName: host, MinVersion: tls.VersionTLS12}).
		SetCleanSession(true).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetConnectTimeout(opts.Wait))
	ctx, cancel := context.WithTimeout(ctx, opts.Wait)
	defer cancel()
	if err := wait(ctx, mc.Connect()); err != nil {
		return nil, joinConnectError(broker, err)
	}
	defer mc.Disconnect(250)
	topic := layout.JoinResponse(id)
	tok := mc.Subscribe(topic, 1, func(_ paho.Client, m paho.Message) {
		select {
		case answers <- m.Payload():
		default:
		}
	})
	if err := wait(ctx, tok); err != nil {
		return nil, status.Errorf(codes.Unavailable, "mqtt subscribe %s: %v", topic, err)
	}
	if code := tok.(*paho.SubscribeToken).Result()[topic]; code >= 0x80 {
		return nil, status.Errorf(codes.FailedPrecondition, "broker %s refused the join topic %s (code %#x): is --mqtt-prefix %q the hub's?", broker, topic, code, layout.Prefix)
	}
	if err := wait(ctx, mc.Publish(layout.JoinRequest(id), 1, false, topics.Encode(topics.Join{Request: body}))); err != nil {
		return nil, status.Errorf(codes.Unavailable, "mqtt publish the registration to %s: %v", broker, err)
	}
	opts.Logger.Debug("registration published over mqtt", "broker", broker, "joinID", id)
	select {
	case b := <-answers:
		return decodeJoinAnswer(b)
	case <-ctx.Done():
		return nil, status.Errorf(codes.Unavailable, "no answer to the registration from broker %s within %v (is a hub bridging it, with --mqtt-prefix %q?)",
			broker, opts.Wait, layout.Prefix)
	}
}

// joinConnectError explains a refused joiner connection. A broker that
// requires a client certificate (Mosquitto, as `drover mqtt
// mosquitto-config` writes it) ends the TLS handshake: that is final, and
// the agent must register over gRPC.
func joinConnectError(broker string, err error) error {
	msg := err.Error()
	for _, s := range []string{"certificate required", "bad certificate", "handshake failure"} {
		if strings.Contains(msg, s) {
			return status.Errorf(codes.FailedPrecondition, "register over MQTT at %s: %v: %v; only a hub's embedded broker (drover hub --mqtt-listen) "+
				"admits registration over MQTT: behind Mosquitto or another external broker, register over gRPC (--hub host:port)", broker, ErrNoJoiners, err)
		}
	}
	// Refused at CONNECT: the embedded broker has too many joiners at
	// once, or is an old hub's; asking again later may work.
	return status.Errorf(codes.Unavailable, "register over MQTT at %s: connect as a joiner: %v", broker, err)
}

func decodeJoinAnswer(b []byte) (*agentv1.RegisterResponse, error) {
	a, err := topics.DecodeJoinAnswer(b)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "malformed registration answer: %v", err)
	}
	if a.Code != 0 {
		if len(a.Status) > 0 {
			var sp spb.Status
			if proto.Unmarshal(a.Status, &sp) == nil && sp.GetCode() == int32(a.Code) {
				return nil, status.FromProto(&sp).Err()
			}
		}
		return nil, status.Error(codes.Code(a.Code), a.Error)
	}
	resp := new(agentv1.RegisterResponse)
	if err := (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(a.Response, resp); err != nil {
		return nil, status.Errorf(codes.Unavailable, "malformed registration answer: %v", err)
	}
	return resp, nil
}

// Registrar returns a registration function for the agent (its
// Options.Register): Join at hub, a broker URL, with opts' prefix and logger.
func Registrar(opts JoinOptions) func(ctx context.Context, hub string, roots *x509.CertPool, req *agentv1.RegisterRequest) (*agentv1.RegisterResponse, error) {
	return func(ctx context.Context, hub string, roots *x509.CertPool, req *agentv1.RegisterRequest) (*agentv1.RegisterResponse, error) {
		o := opts
		if o.Broker == "" {
			o.Broker = hub
		}
		o.RootCAs = roots
		return Join(ctx, o, req)
	}
}

// Renew asks the hub for a new certificate for the key of the one this
// connection uses, on the node's renew topic, and waits for the answer on
// its response topic. The broker verified the certificate at connect; the
// hub checks the key as it does a gRPC Renew's.
func (c *Client) Renew(ctx context.Context, req *agentv1.RenewRequest, _ ...grpc.CallOption) (*agentv1.RenewResponse, error) {
	body, err := proto.Marshal(req)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	id := protocol.NewID()
	ch := make(chan topics.Response, 1)
	c.mu.Lock()
	c.waiters[id] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.waiters, id)
		c.mu.Unlock()
	}()
	if err := c.publish(ctx, c.layout.Renew(c.opts.Node), topics.Encode(topics.Renewal{ID: id, Request: body})); err != nil {
		return nil, err
	}
	select {
	case r := <-ch:
		if r.Code != 0 {
			return nil, status.Error(codes.Code(r.Code), r.Error)
		}
		resp := new(agentv1.RenewResponse)
		if err := (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(r.Renewed, resp); err != nil {
			return nil, status.Errorf(codes.Unavailable, "malformed renewal answer: %v", err)
		}
		return resp, nil
	case <-c.closed:
		return nil, c.failure()
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// CanRenew marks a client that renews over its own connection (the agent
// renews with the session's client rather than with a second connection,
// which would take the node's client id from the session).
func (c *Client) CanRenew() bool { return true }

// ErrorIsFinal reports whether a Join error is one that asking again
// cannot fix because the broker admits no joiners.
func ErrorIsFinal(err error) bool {
	return status.Code(err) == codes.FailedPrecondition && strings.Contains(status.Convert(err).Message(), ErrNoJoiners.Error())
}
