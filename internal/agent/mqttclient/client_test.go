package mqttclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/drover-fleet/drover/internal/mqtt/broker"
	"github.com/drover-fleet/drover/internal/mqtt/topics"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

const waitTimeout = 10 * time.Second

// fixture is an embedded broker, a node's client and a raw client with a
// hub's identity that plays the hub.
type fixture struct {
	t      *testing.T
	layout topics.Layout
	url    string
	ca     *pki.CA
	hub    paho.Client
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ca, err := pki.NewCA("test-ca", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	l, _ := topics.New("")
	b, err := broker.Start(broker.Options{Address: "127.0.0.1:0", CA: ca, ServingHosts: []string{"127.0.0.1"}, Layout: l})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	f := &fixture{t: t, layout: l, url: b.URL(), ca: ca}
	f.hub = paho.NewClient(paho.NewClientOptions().AddBroker(f.url).SetClientID(topics.HubClientID("test")).SetTLSConfig(f.tls(l.HubCN(), topics.HubOrganization)))
	if tok := f.hub.Connect(); !tok.WaitTimeout(waitTimeout) || tok.Error() != nil {
		t.Fatalf("hub connect: %v", tok.Error())
	}
	t.Cleanup(func() { f.hub.Disconnect(0) })
	return f
}

func (f *fixture) tls(cn, org string) *tls.Config {
	f.t.Helper()
	certPEM, keyPEM, err := broker.ClientCert(f.ca, cn, org, time.Now(), time.Hour)
	if err != nil {
		f.t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		f.t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(f.ca.Cert)
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}
}

func (f *fixture) dial(node string, drop int) *Client {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	c, err := Dial(ctx, Options{Broker: f.url, Node: node, TLS: f.tls(node, topics.NodeOrganization), ResendAfter: 100 * time.Millisecond, DropDeliveries: drop})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { c.Close() })
	return c
}

// subscribe makes the fake hub receive topic into ch.
func (f *fixture) subscribe(topic string) chan paho.Message {
	f.t.Helper()
	ch := make(chan paho.Message, 64)
	if tok := f.hub.Subscribe(topic, 1, func(_ paho.Client, m paho.Message) { ch <- m }); !tok.WaitTimeout(waitTimeout) || tok.Error() != nil {
		f.t.Fatalf("subscribe %s: %v", topic, tok.Error())
	}
	return ch
}

func (f *fixture) publish(topic string, b []byte) {
	f.t.Helper()
	if tok := f.hub.Publish(topic, 1, false, b); !tok.WaitTimeout(waitTimeout) || tok.Error() != nil {
		f.t.Fatalf("publish %s: %v", topic, tok.Error())
	}
}

func next(t *testing.T, ch chan paho.Message) paho.Message {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(waitTimeout):
		t.Fatalf("nothing arrived within %v", waitTimeout)
		return nil
	}
}

// TestSendMessagePublishesAgainUntilAnswered: a report whose answer does not
// come is published again with the same id; the answer ends the call.
func TestSendMessagePublishesAgainUntilAnswered(t *testing.T) {
	f := newFixture(t)
	c := f.dial("n1", 0)
	got := f.subscribe(f.layout.Status("n1", "w1"))
	env := protocol.NewStatus("n1", 1, &agentv1.WorkStatus{Uid: "w1", Phase: "Succeeded"})
	type result struct {
		resp *agentv1.SendResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		r, err := c.SendMessage(ctx, env)
		done <- result{r, err}
	}()
	// The fake hub ignores the first copy and answers the second.
	for i := range 2 {
		m := next(t, got)
		e, err := protocol.Decode(m.Payload())
		if err != nil || e.GetId() != env.GetId() {
			t.Fatalf("copy %d: %v, id %q, want %q", i, err, e.GetId(), env.GetId())
		}
	}
	f.publish(f.layout.Response("n1"), topics.Encode(topics.Response{ID: env.GetId(), FullSyncRequired: true}))
	select {
	case r := <-done:
		if r.err != nil || !r.resp.GetFullSyncRequired() {
			t.Fatalf("SendMessage = %v, %v; want the hub's answer", r.resp, r.err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("SendMessage did not return after the answer")
	}

	// A refusal comes back as the same gRPC status as over gRPC.
	hb := protocol.NewHeartbeat("n1")
	beats := f.subscribe(f.layout.Heartbeat("n1"))
	go func() {
		next(t, beats)
		f.publish(f.layout.Response("n1"), topics.Encode(topics.Response{ID: hb.GetId(), Code: uint32(codes.FailedPrecondition), Error: "no session"}))
	}()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := c.SendMessage(ctx, hb); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("SendMessage = %v, want FailedPrecondition", err)
	}
}

// TestStream: the hello carries the request and is repeated until the hub
// answers; envelopes arrive in order, the drop hook loses revisioned ones,
// and the hub's end of the session ends the stream with its status.
func TestStream(t *testing.T) {
	helloEvery = 200 * time.Millisecond
	defer func() { helloEvery = 5 * time.Second }()
	f := newFixture(t)
	hellos := f.subscribe(f.layout.Register("n2"))
	c := f.dial("n2", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 3*waitTimeout)
	defer cancel()
	s, err := c.GetMessage(ctx, &agentv1.GetMessageRequest{LastRevision: 7})
	if err != nil {
		t.Fatal(err)
	}
	r, err := topics.DecodeRegister(next(t, hellos).Payload())
	if err != nil || r.Gone {
		t.Fatalf("hello: %+v, %v", r, err)
	}
	req := new(agentv1.GetMessageRequest)
	if err := proto.Unmarshal(r.Request, req); err != nil || req.GetLastRevision() != 7 {
		t.Fatalf("hello request %v, %v", req, err)
	}
	if again, _ := topics.DecodeRegister(next(t, hellos).Payload()); again.Session != r.Session {
		t.Fatalf("repeated hello for session %q, want %q", again.Session, r.Session)
	}

	var sent []*agentv1.Envelope
	for i, env := range []*agentv1.Envelope{
		protocol.NewNodeConfiguration("n2", nil),
		protocol.NewSnapshot("n2", 8, nil), // dropped by the hook
		protocol.NewDispatch("n2", 9, &agentv1.WorkItem{Uid: "w", Type: "noop"}),
	} {
		b, err := protocol.Encode(env)
		if err != nil {
			t.Fatal(err)
		}
		f.publish(f.layout.Dispatch("n2"), b)
		if i != 1 {
			sent = append(sent, env)
		}
	}
	for _, want := range sent {
		got, err := s.Recv()
		if err != nil || got.GetId() != want.GetId() {
			t.Fatalf("Recv = %v, %v; want %s", got, err, want.GetId())
		}
	}
	f.publish(f.layout.Response("n2"), topics.Encode(topics.Response{Session: "another", Code: uint32(codes.Aborted), Error: "not yours"}))
	f.publish(f.layout.Response("n2"), topics.Encode(topics.Response{Session: r.Session, Code: uint32(codes.PermissionDenied), Error: "node n2 is revoked"}))
	if _, err := s.Recv(); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("Recv after the hub's end = %v, want PermissionDenied", err)
	}

	// Close says goodbye for the session.
	c.Close()
	var gone topics.Register
	for !gone.Gone {
		gone, _ = topics.DecodeRegister(next(t, hellos).Payload())
	}
	if gone.Session != r.Session {
		t.Errorf("goodbye for session %q, want %q", gone.Session, r.Session)
	}
}

// TestBrokerRefusesAnotherPrefix: a broker whose rule does not cover the
// client's prefix refuses it at connect (its Last Will is outside the rule),
// with an error that names broker and node, and says to check the prefix.
func TestBrokerRefusesAnotherPrefix(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	_, err := Dial(ctx, Options{Broker: f.url, Node: "n3", Prefix: "other", TLS: f.tls("n3", topics.NodeOrganization)})
	if err == nil || !strings.Contains(err.Error(), f.url) || !strings.Contains(err.Error(), "n3") || !strings.Contains(err.Error(), `--mqtt-prefix "other"`) {
		t.Fatalf("Dial under a prefix the broker refuses = %v, want an error naming broker, node and prefix", err)
	}
}

// TestDialRefusedWithAnotherNodesCertificate: the client's id is its node's
// (topics.AgentClientID), which the broker admits only for that node's
// certificate; another node's certificate cannot take it over.
func TestDialRefusedWithAnotherNodesCertificate(t *testing.T) {
	f := newFixture(t)
	victim := f.dial("n1", 0)
	defer victim.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	_, err := Dial(ctx, Options{Broker: f.url, Node: "n1", TLS: f.tls("n2", topics.NodeOrganization)})
	if err == nil || !strings.Contains(err.Error(), "client id") {
		t.Fatalf("Dial as n1 with n2's certificate: %v, want a refusal naming the client id", err)
	}
	select {
	case <-victim.closed:
		t.Errorf("n1's own connection was dropped: %v", victim.failure())
	case <-time.After(200 * time.Millisecond):
	}
}
