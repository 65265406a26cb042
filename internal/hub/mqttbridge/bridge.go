// Package mqttbridge carries a hub's agent protocol over MQTT: the same
// envelopes, revisions and acks as the gRPC stream, on the topics of package
// topics. It runs beside the hub's gRPC server, against the broker it embeds
// (package broker) or an external one (Mosquitto, EMQX).
//
// QoS 1 alone loses messages (a broker drops them when a client's queue is
// full), so delivery rests on the protocol's own acks: the bridge publishes
// again every hub envelope the agent has not acked (after ResendAfter, then
// doubling), and the agent's revision tracker drops repeats. In the other
// direction the agent publishes a report again until it gets its answer, and
// the hub answers a repeated id as a duplicate. Nothing is lost or applied
// twice.
package mqttbridge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/mqtt/broker"
	"github.com/drover-fleet/drover/internal/mqtt/topics"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// Options configure a Bridge.
type Options struct {
	// Hub runs the sessions. Required.
	Hub *hub.Hub
	// Listen, when set, is where the embedded broker listens (TLS).
	Listen string
	// Broker, when set, is an external broker's URL (ssl://host:port) to use
	// instead of an embedded one. Its serving certificate must be signed by
	// Drover's CA (see `drover mqtt mosquitto-config`).
	Broker string
	// ServingHosts are the names and IPs in the embedded broker's certificate.
	ServingHosts []string
	// Prefix is the topic prefix. Default: topics.DefaultPrefix.
	Prefix string
	// ResendAfter is how long an envelope waits for the agent's ack before
	// it is published again (then twice as long, up to 30s). Default: 2s.
	ResendAfter time.Duration
	// Clock times sessions: re-sends and the silence that ends one.
	// Default: the hub's.
	Clock clock.Clock
	// Logger. Default: the hub's.
	Logger *slog.Logger
	// Registerer receives the bridge's metrics. Default: none.
	Registerer prometheus.Registerer
	// DropFromAgent, for tests, loses the agent envelopes for which it
	// returns true, as a broker with a full queue would.
	DropFromAgent func(*agentv1.Envelope) bool
}

// Bridge is a Runnable carrying the agent protocol over MQTT.
type Bridge struct {
	opts   Options
	layout topics.Layout
	log    *slog.Logger
	hub    *hub.Hub

	ready chan struct{}
	// inflight holds async publishes for the confirmer; halt closes when
	// Start returns, so that nothing waits on a confirmer that is gone.
	inflight chan inflight
	halt     chan struct{}
	url      string
	broker   *broker.Broker
	mc       paho.Client

	metrics metrics
	resent  atomic.Int64

	// mu guards nodes and stopped.
	mu      sync.Mutex
	nodes   map[string]*node
	stopped bool

	// joins queues joiners' registrations for the join workers (join.go).
	joins chan joinRequest
}

// New checks opts.
func New(opts Options) (*Bridge, error) {
	if opts.Hub == nil {
		return nil, errors.New("mqtt bridge: a hub is required")
	}
	if (opts.Listen == "") == (opts.Broker == "") {
		return nil, errors.New("mqtt bridge: set either an address for the embedded broker (--mqtt-listen) or an external broker (--mqtt-broker)")
	}
	if opts.Broker != "" {
		if _, _, err := topics.BrokerURL(opts.Broker); err != nil {
			return nil, err
		}
	}
	layout, err := topics.New(opts.Prefix)
	if err != nil {
		return nil, err
	}
	if opts.ResendAfter <= 0 {
		opts.ResendAfter = 2 * time.Second
	}
	if opts.Clock == nil {
		opts.Clock = opts.Hub.Clock()
	}
	if opts.Logger == nil {
		opts.Logger = opts.Hub.Logger()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Bridge{
		opts:     opts,
		layout:   layout,
		log:      opts.Logger.With("transport", "mqtt"),
		hub:      opts.Hub,
		ready:    make(chan struct{}),
		inflight: make(chan inflight, maxInflight),
		halt:     make(chan struct{}),
		nodes:    map[string]*node{},
		joins:    make(chan joinRequest, joinQueue),
		metrics:  newMetrics(opts.Registerer),
	}, nil
}

// NeedLeaderElection is false: every hub bridges.
func (b *Bridge) NeedLeaderElection() bool { return false }

// BrokerURL waits until the bridge is connected and returns the broker's URL
// (the embedded broker's when it runs one).
func (b *Bridge) BrokerURL(ctx context.Context) (string, error) {
	select {
	case <-b.ready:
		return b.url, nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// Start runs the embedded broker (if any) and the bridge until ctx ends.
func (b *Bridge) Start(ctx context.Context) error {
	if err := b.hub.Started(ctx); err != nil {
		return nil // stopped before the hub started
	}
	// The hub's signer signs the broker's and the bridge's certificates:
	// the hub holds no CA key.
	b.url = b.opts.Broker
	if b.opts.Listen != "" {
		serving, err := b.hub.HubCertificate(ctx, hub.MQTTServing, servingHosts(b.opts.ServingHosts), "")
		if err != nil {
			return fmt.Errorf("mqtt broker: %w", err)
		}
		// Joiners: machines without a certificate may register over MQTT
		// (join.go); the broker confines them to their join topics.
		br, err := broker.Start(broker.Options{Address: b.opts.Listen, Certificate: serving, ClientCAs: b.hub.TrustedCAs,
			Layout: b.layout, Logger: b.log, Admit: b.hub.AdmitKey, Joiners: true})
		if err != nil {
			return err
		}
		defer br.Close()
		b.broker, b.url = br, br.URL()
	}
	brokerURL, host, _ := topics.BrokerURL(b.url)
	cert, err := b.hub.HubCertificate(ctx, hub.MQTTClient, nil, b.layout.HubCN())
	if err != nil {
		return fmt.Errorf("mqtt bridge: %w", err)
	}
	subscribed := make(chan struct{}, 1)
	mo := paho.NewClientOptions().
		AddBroker(brokerURL).
		// Mosquitto replaces it with the certificate's common name
		// (topics.MosquittoListenerAuth); nothing here depends on it.
		SetClientID(topics.HubClientID(b.hub.Name())).
		SetTLSConfig(&tls.Config{Certificates: []tls.Certificate{*cert}, RootCAs: b.hub.TrustedCAs(), ServerName: host, MinVersion: tls.VersionTLS12}).
		SetCleanSession(true).
		SetAutoReconnect(true).
		SetConnectRetry(true).
		SetConnectRetryInterval(time.Second).
		SetMaxReconnectInterval(10 * time.Second).
		SetKeepAlive(30 * time.Second).
		// Handlers only queue (without blocking), so they may run in
		// order on paho's goroutine; each node's queue keeps that order.
		SetOrderMatters(true).
		SetOnConnectHandler(func(c paho.Client) {
			// A clean session forgets subscriptions: make them on every connect.
			filters := map[string]byte{}
			for _, f := range b.layout.HubFilters() {
				filters[f] = 1
			}
			tok := c.SubscribeMultiple(filters, b.onMessage)
			go func() {
				if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
					b.log.Error("mqtt bridge cannot subscribe: is the hub's certificate allowed every topic under the prefix?", "broker", brokerURL, "prefix", b.layout.Prefix, "err", tok.Error())
					return
				}
				b.log.Info("mqtt bridge subscribed", "broker", brokerURL, "prefix", b.layout.Prefix)
				select {
				case subscribed <- struct{}{}:
				default:
				}
			}()
		}).
		SetConnectionLostHandler(func(_ paho.Client, err error) {
			b.log.Warn("mqtt bridge lost the broker; reconnecting", "broker", brokerURL, "err", err)
		})
	b.mc = paho.NewClient(mo)
	b.mc.Connect() // retries in the background until it connects
	defer b.mc.Disconnect(250)
	cctx, stopConfirm := context.WithCancel(context.Background())
	defer stopConfirm() // after the sessions stopped (below)
	go b.confirm(cctx)
	var joinWorkers sync.WaitGroup
	defer joinWorkers.Wait()
	jctx, stopJoins := context.WithCancel(ctx)
	defer stopJoins()
	for range joinWorkerCount {
		joinWorkers.Go(func() { b.joinWork(jctx) })
	}
	defer close(b.halt)
	select {
	case <-subscribed:
	case <-ctx.Done():
		return nil
	}
	close(b.ready)
	<-ctx.Done()
	b.mu.Lock()
	b.stopped = true
	for _, n := range b.nodes {
		n.stop()
	}
	b.mu.Unlock()
	return nil
}

// message is one agent->hub publish.
type message struct {
	kind    topics.Kind
	payload []byte
}

// nodeQueue bounds the messages waiting for one node's worker; beyond it
// they are dropped like a full broker queue would (the agent sends again).
const nodeQueue = 256

// node is one node's worker and session on this bridge.
type node struct {
	name string
	in   chan message
	// logs is the lane of log chunks: delivering one waits for the reader
	// (up to the hub's stall limit), which must not hold up the node's
	// acks and heartbeats; one lane keeps the chunks in order.
	logs chan *agentv1.Envelope
	// seenLogs remembers recent chunk ids: the agent publishes a chunk
	// again when its answer is slow, and the reader must get it once.
	seenLogs map[string]struct{}
	logRing  []string

	// mu guards sess.
	mu   sync.Mutex
	sess *session
	quit chan struct{}
}

func (n *node) stop() {
	select {
	case <-n.quit:
	default:
		close(n.quit)
	}
}

func (b *Bridge) onMessage(_ paho.Client, m paho.Message) {
	if id, ok := b.layout.ParseJoin(m.Topic()); ok {
		b.queueJoin(id, m.Payload())
		return
	}
	kind, name := b.layout.Parse(m.Topic())
	if kind == topics.KindNone {
		return
	}
	// Queuing under b.mu lets an idle worker retire without losing a message.
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return
	}
	n := b.nodes[name]
	if n == nil {
		n = &node{name: name, in: make(chan message, nodeQueue), logs: make(chan *agentv1.Envelope, nodeQueue), seenLogs: map[string]struct{}{}, quit: make(chan struct{})}
		b.nodes[name] = n
		go b.work(n)
	}
	select {
	case n.in <- message{kind: kind, payload: m.Payload()}:
	default:
		b.log.Warn("node's queue is full; dropping its message (it sends again)", "node", name)
	}
}

// workerIdle is how long a node's worker waits without a session and without
// messages before it retires.
const workerIdle = time.Minute

// retire removes n if it has no session and nothing queued; the caller exits.
func (b *Bridge) retire(n *node) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	n.mu.Lock()
	busy := n.sess != nil && !n.sess.isOver()
	n.mu.Unlock()
	if busy || len(n.in) > 0 || len(n.logs) > 0 {
		return false
	}
	delete(b.nodes, n.name)
	return true
}

// work handles one node's messages in order.
func (b *Bridge) work(n *node) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-n.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	go b.logWork(ctx, n)
	idle := b.opts.Clock.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		select {
		case <-idle.Chan():
			if b.retire(n) {
				return
			}
			idle.Reset(workerIdle)
		case <-ctx.Done():
			n.mu.Lock()
			if n.sess != nil {
				n.sess.cancel()
			}
			n.mu.Unlock()
			return
		case m := <-n.in:
			switch m.kind {
			case topics.KindRegister:
				b.register(ctx, n, m.payload)
			case topics.KindRenew:
				b.renew(ctx, n, m.payload)
			default:
				b.handle(ctx, n, m.payload)
			}
		}
	}
}

// register starts, repeats or ends n's session.
func (b *Bridge) register(ctx context.Context, n *node, payload []byte) {
	r, err := topics.DecodeRegister(payload)
	if err != nil {
		b.log.Warn("ignoring malformed register message", "node", n.name, "err", err)
		return
	}
	n.mu.Lock()
	cur := n.sess
	n.mu.Unlock()
	if r.Gone {
		if cur != nil && cur.id == r.Session {
			b.log.Info("agent's mqtt connection is gone; ending its session", "node", n.name)
			cur.cancel()
		}
		return
	}
	if cur != nil && cur.id == r.Session && !cur.isOver() {
		return // a repeated hello: the session runs
	}
	req := new(agentv1.GetMessageRequest)
	if err := (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(r.Request, req); err != nil {
		b.respond(n.name, topics.Response{Session: r.Session, Code: uint32(codes.InvalidArgument), Error: "malformed hello: " + err.Error()})
		return
	}
	p, err := b.peer(n.name)
	if err != nil {
		st := status.Convert(err)
		b.respond(n.name, topics.Response{Session: r.Session, Code: uint32(st.Code()), Error: st.Message()})
		return
	}
	if cur != nil {
		cur.cancel()
	}
	s := newSession(ctx, b, p, r.Session)
	n.mu.Lock()
	n.sess = s
	n.mu.Unlock()
	go s.run(req)
}

// handle passes one agent envelope to the hub and answers it.
func (b *Bridge) handle(ctx context.Context, n *node, payload []byte) {
	if len(payload) > 2*protocol.MaxEnvelopeBytes {
		b.log.Warn("ignoring an oversized message", "node", n.name, "bytes", len(payload))
		return
	}
	env := new(agentv1.Envelope)
	if err := (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(payload, env); err != nil || env.GetId() == "" {
		b.log.Warn("ignoring an undecodable message", "node", n.name, "err", err)
		return
	}
	if b.opts.DropFromAgent != nil && b.opts.DropFromAgent(env) {
		b.log.Info("dropping an agent message on purpose (test hook)", "node", n.name, "id", env.GetId(), "kind", env.GetKind().String())
		return
	}
	if env.GetKind() == agentv1.Kind_KIND_LOG_CHUNK && env.GetNode() == n.name {
		select {
		case n.logs <- env:
		default:
			b.log.Warn("node's log lane is full; dropping a chunk (it sends it again)", "node", n.name)
		}
		return
	}
	b.answer(ctx, n, env)
}

// logSeenIDs bounds the log chunk ids remembered per node.
const logSeenIDs = 256

// logWork delivers n's log chunks in order, each once.
func (b *Bridge) logWork(ctx context.Context, n *node) {
	for {
		select {
		case <-ctx.Done():
			return
		case env := <-n.logs:
			id := env.GetId()
			if _, dup := n.seenLogs[id]; dup {
				b.respond(n.name, topics.Response{ID: id, Duplicate: true})
				continue
			}
			n.seenLogs[id] = struct{}{}
			if n.logRing = append(n.logRing, id); len(n.logRing) > logSeenIDs {
				delete(n.seenLogs, n.logRing[0])
				n.logRing = n.logRing[1:]
			}
			b.answer(ctx, n, env)
		}
	}
}

// answer passes env to the hub and publishes the hub's answer.
func (b *Bridge) answer(ctx context.Context, n *node, env *agentv1.Envelope) {
	var resp *agentv1.SendResponse
	var err error
	if env.GetNode() != n.name {
		// The broker's ACL makes the topic's node the publisher's identity.
		err = status.Errorf(codes.PermissionDenied, "node %s may not send as node %s", n.name, env.GetNode())
	} else {
		var p hub.Peer
		if p, err = b.peer(n.name); err == nil {
			resp, err = b.hub.HandleMessage(ctx, p, env)
		}
	}
	if err == nil && env.GetKind() == agentv1.Kind_KIND_ACK {
		n.mu.Lock()
		s := n.sess
		n.mu.Unlock()
		if s != nil {
			s.acked(env.GetAckOf())
			for _, id := range env.GetAck().GetMore() {
				s.acked(id)
			}
			s.touch()
		}
	} else if err == nil {
		n.mu.Lock()
		if n.sess != nil {
			n.sess.touch()
		}
		n.mu.Unlock()
	}
	r := topics.Response{ID: env.GetId(), Duplicate: resp.GetDuplicate(), FullSyncRequired: resp.GetFullSyncRequired()}
	if err != nil {
		st := status.Convert(err)
		r.Code, r.Error = uint32(st.Code()), st.Message()
	}
	b.respond(n.name, r)
}

// peer is node as the broker authenticated it: with the key of the
// certificate its agent is connected with to the embedded broker (the hub
// checks it as it checks a gRPC stream's). An external broker hands the
// bridge no certificates: the key is unknown, and revocation there is the
// broker's to enforce.
func (b *Bridge) peer(node string) (hub.Peer, error) {
	if b.broker == nil {
		return hub.Peer{Node: node}, nil
	}
	key, ok := b.broker.NodeKey(node)
	if !ok {
		return hub.Peer{}, status.Errorf(codes.Unavailable, "node %s is not connected to the broker any more; connect again", node)
	}
	return hub.Peer{Node: node, Key: key}, nil
}

// publishTimeout bounds waiting for the broker to take one publish.
const publishTimeout = 10 * time.Second

// respond publishes r to node without waiting for the broker: the agent
// asks again when no answer comes.
func (b *Bridge) respond(node string, r topics.Response) {
	_ = b.publishAsync(context.Background(), b.layout.Response(node), topics.Encode(r))
}

// inflight is a publish the broker has not confirmed yet.
type inflight struct {
	topic string
	tok   paho.Token
}

// maxInflight bounds the publishes awaiting the broker's PUBACK; beyond it
// publishAsync waits, so a slow broker slows the bridge down rather than
// filling memory.
const maxInflight = 1024

// publishAsync hands a QoS 1 publish to the client and returns; the
// confirmer logs the ones the broker did not take. It waits only when
// maxInflight publishes are unconfirmed, or until ctx ends.
func (b *Bridge) publishAsync(ctx context.Context, topic string, payload []byte) error {
	tok := b.mc.Publish(topic, 1, false, payload)
	select {
	case b.inflight <- inflight{topic: topic, tok: tok}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-b.halt:
		return errors.New("mqtt bridge stopped")
	}
}

// confirm waits for each async publish in turn and logs failures.
func (b *Bridge) confirm(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-b.inflight:
			if !p.tok.WaitTimeout(publishTimeout) {
				b.log.Warn("broker did not take a publish in time (the protocol sends it again)", "topic", p.topic, "timeout", publishTimeout)
			} else if err := p.tok.Error(); err != nil {
				b.log.Warn("publish failed (the protocol sends it again)", "topic", p.topic, "err", err)
			}
		}
	}
}

func (b *Bridge) publish(topic string, payload []byte) error {
	tok := b.mc.Publish(topic, 1, false, payload)
	if !tok.WaitTimeout(publishTimeout) {
		return fmt.Errorf("mqtt publish %s: broker did not take it in %v", topic, publishTimeout)
	}
	return tok.Error()
}

// Resent is how many envelopes the bridge published again for want of an ack.
func (b *Bridge) Resent() int64 { return b.resent.Load() }

// Unacked is how many envelopes node's MQTT session has not had acked.
func (b *Bridge) Unacked(node string) int {
	b.mu.Lock()
	n := b.nodes[node]
	b.mu.Unlock()
	if n == nil {
		return 0
	}
	n.mu.Lock()
	s := n.sess
	n.mu.Unlock()
	if s == nil {
		return 0
	}
	return s.unackedCount()
}

// servingHosts are the embedded broker's names: hosts, or by default
// 127.0.0.1, localhost and the host name.
func servingHosts(hosts []string) []string {
	if len(hosts) > 0 {
		return hosts
	}
	hosts = []string{"127.0.0.1", "localhost"}
	if h, err := os.Hostname(); err == nil {
		hosts = append(hosts, h)
	}
	return hosts
}
