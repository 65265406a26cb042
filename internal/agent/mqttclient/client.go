// Package mqttclient carries the agent's side of the agent protocol over
// MQTT. Client implements agentv1.AgentHubClient, so the agent's session
// logic (outbox, acks, revisions) is the same on both transports:
//
//   - GetMessage publishes the session hello on the node's register topic
//     (again every few seconds until the hub answers) and returns a stream
//     fed by the node's dispatch topic.
//   - SendMessage publishes the envelope and waits for the hub's answer,
//     correlated by envelope id, on the node's response topic. It publishes
//     it again when no answer comes (QoS 1 alone loses messages when a
//     broker's queue for a client is full); the hub answers a repeat as a
//     duplicate.
//
// Registration (bootstrap token -> certificate) is not carried by a
// Client (its Register refuses) but by Join, on a connection without a
// certificate that the hub's embedded broker confines to one join id's
// topics (join.go). Renew is carried, on the node's renew topic.
//
// The package imports nothing from k8s.io, for drover-agent.
package mqttclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/mqtt/topics"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// Options configure a Client.
type Options struct {
	// Broker is the broker's URL: ssl://host:port (tls:// and mqtts:// are
	// accepted too). Required.
	Broker string
	// Prefix is the topic prefix. Default: topics.DefaultPrefix.
	Prefix string
	// Node is this node's name; it must be its certificate's common name. Required.
	Node string
	// TLS holds the node's client certificate and the CAs to trust the
	// broker with. ServerName is taken from Broker when empty. Required.
	TLS *tls.Config
	// ResendAfter is how long SendMessage waits for an answer before
	// publishing again (then twice as long, up to 30s). Default: 2s.
	ResendAfter time.Duration
	// DropDeliveries, for tests, drops this many hub envelopes that carry a
	// revision (snapshots, dispatches, cancels) as if the broker had lost
	// them.
	DropDeliveries int
	// Clock times the resends and the repeated hello. Default clock.Real().
	Clock clock.Clock
	// Logger. Default: discard.
	Logger *slog.Logger
}

// Client is one MQTT connection of an agent.
type Client struct {
	opts    Options
	layout  topics.Layout
	mc      paho.Client
	session string
	log     *slog.Logger

	// mu guards everything below.
	mu      sync.Mutex
	waiters map[string]chan topics.Response
	stream  *stream
	drop    int
	lost    error // why the connection ended
	closed  chan struct{}
}

var _ agentv1.AgentHubClient = (*Client)(nil)

// Dial connects to the broker with a Last Will that tells the hub this
// connection is gone, and subscribes to the node's dispatch and response
// topics.
func Dial(ctx context.Context, opts Options) (*Client, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	opts.Clock = clock.Or(opts.Clock)
	if opts.ResendAfter <= 0 {
		opts.ResendAfter = 2 * time.Second
	}
	if err := protocol.ValidNodeName(opts.Node); err != nil {
		return nil, fmt.Errorf("mqtt client: node %q: %w", opts.Node, err)
	}
	layout, err := topics.New(opts.Prefix)
	if err != nil {
		return nil, err
	}
	broker, host, err := topics.BrokerURL(opts.Broker)
	if err != nil {
		return nil, err
	}
	if opts.TLS == nil {
		return nil, errors.New("mqtt client: a TLS configuration with the node's certificate is required")
	}
	cfg := opts.TLS.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName = host
	}
	c := &Client{
		opts:    opts,
		layout:  layout,
		session: protocol.NewID(),
		log:     opts.Logger.With("broker", broker),
		waiters: map[string]chan topics.Response{},
		drop:    opts.DropDeliveries,
		closed:  make(chan struct{}),
	}
	mo := paho.NewClientOptions().
		AddBroker(broker).
		// The only id the embedded broker admits for this node's
		// certificate; Mosquitto replaces it with the node name
		// (topics.ClientIDAllowed).
		SetClientID(topics.AgentClientID(opts.Node)).
		SetTLSConfig(cfg).
		SetCleanSession(true).
		// The agent's connect loop reconnects (and says hello again).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetKeepAlive(60*time.Second).
		SetConnectTimeout(20*time.Second).
		SetBinaryWill(layout.Register(opts.Node), topics.Encode(topics.Register{Session: c.session, Gone: true}), 1, false).
		SetConnectionLostHandler(func(_ paho.Client, err error) { c.fail(fmt.Errorf("mqtt connection to %s lost: %w", broker, err)) })
	c.mc = paho.NewClient(mo)
	if err := wait(ctx, c.mc.Connect()); err != nil {
		if errors.Is(err, packets.ErrorRefusedNotAuthorised) || errors.Is(err, packets.ErrorRefusedBadUsernameOrPassword) {
			// The broker checks the node's certificate, that the client id
			// is the node's, and that its Last Will is on the node's own
			// register topic, under the prefix.
			return nil, fmt.Errorf("mqtt connect to %s as node %s: %w (the broker refused this node's certificate, its client id or its topics: "+
				"check that --mqtt-prefix %q is the hub's, and that the node's certificate is from the hub's CA and names node %s)", broker, opts.Node, err, opts.Prefix, opts.Node)
		}
		return nil, fmt.Errorf("mqtt connect to %s as node %s: %w", broker, opts.Node, err)
	}
	subs := map[string]paho.MessageHandler{
		layout.Dispatch(opts.Node): c.onDispatch,
		layout.Response(opts.Node): c.onResponse,
	}
	for topic, h := range subs {
		tok := c.mc.Subscribe(topic, 1, h)
		if err := wait(ctx, tok); err != nil {
			c.mc.Disconnect(0)
			return nil, fmt.Errorf("mqtt subscribe %s: %w", topic, err)
		}
		if code := tok.(*paho.SubscribeToken).Result()[topic]; code >= 0x80 {
			c.mc.Disconnect(0)
			return nil, &accessError{fmt.Errorf("broker %s refused node %s the subscription to %s (code %#x): is the broker's ACL for prefix %q?", broker, opts.Node, topic, code, layout.Prefix)}
		}
	}
	c.log.Info("mqtt connected", "session", c.session)
	return c, nil
}

type accessError struct{ error }

func (e *accessError) GRPCStatus() *status.Status {
	return status.New(codes.PermissionDenied, e.Error())
}

// Close says goodbye (what the Last Will would say: a graceful disconnect
// drops the will) so the hub ends the session now, as a gRPC hub does when
// the stream closes, and disconnects.
func (c *Client) Close() error {
	c.fail(errors.New("mqtt client closed"))
	tok := c.mc.Publish(c.layout.Register(c.opts.Node), 1, false, topics.Encode(topics.Register{Session: c.session, Gone: true}))
	tok.WaitTimeout(2 * time.Second)
	c.mc.Disconnect(250)
	return nil
}

// fail ends the stream and every waiting call with err.
func (c *Client) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lost != nil {
		return
	}
	c.lost = err
	close(c.closed)
}

func (c *Client) failure() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return status.Error(codes.Unavailable, c.lost.Error())
}

// Register is not carried on a node's connection: a machine registers
// before it has the certificate that connection needs (Join).
func (c *Client) Register(context.Context, *agentv1.RegisterRequest, ...grpc.CallOption) (*agentv1.RegisterResponse, error) {
	return nil, status.Error(codes.Unimplemented, "registration over MQTT uses a joiner's connection (mqttclient.Join), not a node's")
}

// topicFor is where env goes: heartbeats on the heartbeat topic, the rest on
// the status topic of the work item it is about ("-" when none).
func (c *Client) topicFor(env *agentv1.Envelope) string {
	if env.GetKind() == agentv1.Kind_KIND_HEARTBEAT {
		return c.layout.Heartbeat(c.opts.Node)
	}
	return c.layout.Status(c.opts.Node, env.GetStatus().GetWork().GetUid())
}

// SendMessage publishes env and waits for the hub's answer, publishing it
// again each time ResendAfter (doubling) passes without one, until ctx ends.
func (c *Client) SendMessage(ctx context.Context, env *agentv1.Envelope, _ ...grpc.CallOption) (*agentv1.SendResponse, error) {
	b, err := protocol.Encode(env)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	ch := make(chan topics.Response, 1)
	c.mu.Lock()
	c.waiters[env.GetId()] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.waiters, env.GetId())
		c.mu.Unlock()
	}()
	topic := c.topicFor(env)
	every := c.opts.ResendAfter
	for {
		// The hub's answer comes after the broker took the publish: waiting
		// for the PUBACK first would only add a round trip per report. A
		// publish that fails ends the call, as a failed RPC would.
		tok := c.mc.Publish(topic, 1, false, b)
		published := tok.Done()
		t := c.opts.Clock.NewTimer(every)
	wait:
		for {
			select {
			case r := <-ch:
				t.Stop()
				if r.Code != 0 {
					return nil, status.Error(codes.Code(r.Code), r.Error)
				}
				return &agentv1.SendResponse{Duplicate: r.Duplicate, FullSyncRequired: r.FullSyncRequired}, nil
			case <-published:
				published = nil
				if err := tok.Error(); err != nil {
					t.Stop()
					select {
					case <-c.closed:
						return nil, c.failure()
					default:
					}
					return nil, status.Errorf(codes.Unavailable, "mqtt publish %s: %v", topic, err)
				}
			case <-t.Chan():
				c.log.Debug("no answer from the hub; publishing again", "id", env.GetId(), "kind", env.GetKind().String(), "after", every)
				every = min(2*every, 30*time.Second)
				break wait
			case <-c.closed:
				t.Stop()
				return nil, c.failure()
			case <-ctx.Done():
				t.Stop()
				return nil, status.FromContextError(ctx.Err()).Err()
			}
		}
	}
}

func (c *Client) publish(ctx context.Context, topic string, b []byte) error {
	if err := wait(ctx, c.mc.Publish(topic, 1, false, b)); err != nil {
		select {
		case <-c.closed:
			return c.failure()
		default:
		}
		return status.Errorf(codes.Unavailable, "mqtt publish %s: %v", topic, err)
	}
	return nil
}

// helloEvery is how often GetMessage repeats the hello until the hub
// answers (a variable for tests).
var helloEvery = 5 * time.Second

// GetMessage says hello to the hub and returns the stream of its envelopes.
// One Client carries one session: a second call replaces the first stream.
func (c *Client) GetMessage(ctx context.Context, req *agentv1.GetMessageRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[agentv1.Envelope], error) {
	b, err := proto.Marshal(req)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	hello := topics.Encode(topics.Register{Session: c.session, Request: b})
	s := &stream{ctx: ctx, c: c, in: make(chan *agentv1.Envelope, inbox), got: make(chan struct{}), ended: make(chan struct{})}
	c.mu.Lock()
	c.stream = s
	c.mu.Unlock()
	topic := c.layout.Register(c.opts.Node)
	if err := c.publish(ctx, topic, hello); err != nil {
		return nil, err
	}
	go func() {
		t := c.opts.Clock.NewTicker(helloEvery)
		defer t.Stop()
		for {
			select {
			case <-s.got:
				return
			case <-ctx.Done():
				return
			case <-c.closed:
				return
			case <-t.Chan():
				c.log.Debug("no answer to the hello yet; saying it again")
				_ = c.publish(ctx, topic, hello)
			}
		}
	}()
	return s, nil
}

// inbox bounds the hub envelopes waiting for the agent. One beyond it is
// dropped, as a full broker queue would; the hub sends it again.
const inbox = 1024

func (c *Client) onDispatch(_ paho.Client, m paho.Message) {
	env, err := protocol.Decode(m.Payload())
	if err != nil {
		c.log.Error("ignoring malformed message from the hub", "topic", m.Topic(), "err", err)
		return
	}
	c.mu.Lock()
	s := c.stream
	if env.GetRevision() > 0 && c.drop > 0 {
		c.drop--
		c.mu.Unlock()
		c.log.Info("dropping a hub message on purpose (test hook)", "id", env.GetId(), "kind", env.GetKind().String(), "revision", env.GetRevision())
		return
	}
	c.mu.Unlock()
	if s == nil {
		return
	}
	select {
	case s.in <- env:
	default:
		c.log.Warn("agent inbox full; dropping a hub message (the hub sends it again)", "id", env.GetId())
	}
}

func (c *Client) onResponse(_ paho.Client, m paho.Message) {
	r, err := topics.DecodeResponse(m.Payload())
	if err != nil {
		c.log.Error("ignoring malformed answer from the hub", "err", err)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.ID == "" {
		if r.Session == c.session && c.stream != nil {
			c.stream.end(status.Error(codes.Code(r.Code), r.Error))
		}
		return
	}
	if ch, ok := c.waiters[r.ID]; ok {
		select {
		case ch <- r:
		default: // an answer to a repeat; the first one is being handled
		}
	}
}

// stream is the hub->agent half of a session.
type stream struct {
	ctx   context.Context
	c     *Client
	in    chan *agentv1.Envelope
	once  sync.Once
	got   chan struct{} // closed by the first envelope
	ended chan struct{}
	err   error
}

func (s *stream) end(err error) {
	select {
	case <-s.ended:
	default:
		s.err = err
		close(s.ended)
	}
}

// Recv returns the hub's next envelope.
func (s *stream) Recv() (*agentv1.Envelope, error) {
	select {
	case env := <-s.in:
		s.once.Do(func() { close(s.got) })
		return env, nil
	case <-s.ended:
		s.c.mu.Lock()
		defer s.c.mu.Unlock()
		return nil, s.err
	case <-s.c.closed:
		return nil, s.c.failure()
	case <-s.ctx.Done():
		return nil, status.FromContextError(s.ctx.Err()).Err()
	}
}

func (s *stream) Header() (metadata.MD, error) { return nil, nil }
func (s *stream) Trailer() metadata.MD         { return nil }
func (s *stream) CloseSend() error             { return nil }
func (s *stream) Context() context.Context     { return s.ctx }
func (s *stream) SendMsg(any) error            { return errors.New("mqtt stream: SendMsg is not supported") }
func (s *stream) RecvMsg(m any) error {
	env, err := s.Recv()
	if err != nil {
		return err
	}
	p, ok := m.(*agentv1.Envelope)
	if !ok {
		return fmt.Errorf("mqtt stream: RecvMsg into %T", m)
	}
	proto.Merge(p, env)
	return nil
}

// wait waits for tok until ctx ends.
func wait(ctx context.Context, tok paho.Token) error {
	select {
	case <-tok.Done():
		return tok.Error()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Connector returns an agent.Connector (the agent package's type) that
// connects to opts.Broker whichever hub the agent picked, or, when
// opts.Broker is empty, to the hub the agent picked as a broker URL (an
// agent that reaches only brokers lists them as its hubs): the agent's
// certificate and trusted CAs come from cfg, the TLS server name from the
// broker's URL, and the node name (when opts has none) from the
// certificate.
func Connector(opts Options) func(ctx context.Context, hub string, cfg *tls.Config) (agentv1.AgentHubClient, io.Closer, error) {
	return func(ctx context.Context, hub string, cfg *tls.Config) (agentv1.AgentHubClient, io.Closer, error) {
		o := opts
		if o.Broker == "" {
			// Broker-only agents: the agent's hubs are brokers' URLs.
			o.Broker = hub
		}
		o.TLS = cfg.Clone()
		o.TLS.ServerName = ""
		// Brokers (Mosquitto) may not speak TLS 1.3 only; 1.2 is the floor.
		o.TLS.MinVersion = tls.VersionTLS12
		if o.Node == "" && len(cfg.Certificates) > 0 && cfg.Certificates[0].Leaf != nil {
			o.Node = cfg.Certificates[0].Leaf.Subject.CommonName
		}
		c, err := Dial(ctx, o)
		if err != nil {
			return nil, nil, err
		}
		return c, c, nil
	}
}
