package broker

import (
	"crypto/tls"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/drover-fleet/drover/internal/mqtt/topics"
)

// startJoinBroker runs a broker that admits joiners, and a hub client that
// records every message published under the prefix.
func startJoinBroker(t *testing.T, o Options) (*Broker, *seen, topics.Layout) {
	t.Helper()
	ca := newCA(t)
	l, _ := topics.New("")
	o.Address, o.CA, o.ServingHosts, o.Layout, o.Joiners = "127.0.0.1:0", ca, []string{"127.0.0.1"}, l, true
	b, err := Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	// mochi 2.7.9's Close can deadlock with a client that is being
	// removed at that moment (Clients.GetByListener read-locks twice):
	// let the joiners' disconnects finish first.
	t.Cleanup(func() {
		deadline := time.Now().Add(waitTimeout)
		for b.Joiners() > 0 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond)
	})
	rec := &seen{}
	hub := paho.NewClient(paho.NewClientOptions().AddBroker(b.URL()).SetClientID(topics.HubClientID("h")).
		SetTLSConfig(clientTLS(t, ca, ca, l.HubCN(), topics.HubOrganization)).SetAutoReconnect(false))
	if tok := hub.Connect(); !tok.WaitTimeout(waitTimeout) || tok.Error() != nil {
		t.Fatalf("hub connect: %v", tok.Error())
	}
	t.Cleanup(func() { hub.Disconnect(0) })
	if tok := hub.Subscribe(l.Prefix+"/#", 1, rec.add); !tok.WaitTimeout(waitTimeout) || tok.Error() != nil {
		t.Fatalf("hub subscribe: %v", tok.Error())
	}
	return b, rec, l
}

type seen struct {
	mu     sync.Mutex
	topics []string
}

func (s *seen) add(_ paho.Client, m paho.Message) {
	s.mu.Lock()
	s.topics = append(s.topics, m.Topic())
	s.mu.Unlock()
}

func (s *seen) has(topic string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.topics {
		if t == topic {
			return true
		}
	}
	return false
}

func dialJoiner(t *testing.T, b *Broker, cfg *tls.Config, id string) paho.Client {
	t.Helper()
	c := paho.NewClient(paho.NewClientOptions().AddBroker(b.URL()).SetClientID(topics.JoinClientID(id)).SetTLSConfig(cfg).SetAutoReconnect(false))
	if tok := c.Connect(); !tok.WaitTimeout(waitTimeout) || tok.Error() != nil {
		t.Fatalf("joiner connect: %v", tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(0) })
	return c
}

// waitClosed waits until the broker ended c's connection: it does so when
// it refuses a publish, after dropping it.
func waitClosed(t *testing.T, c paho.Client, topic string) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for c.IsConnectionOpen() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if c.IsConnectionOpen() {
		t.Errorf("the broker kept a joiner connected after its publish to %q", topic)
	}
}

func joinerTLS(b *Broker, t *testing.T) *tls.Config {
	t.Helper()
	// Trust the serving certificate as an agent with Drover's CA does.
	return &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12} //nolint:gosec // a test against the test's own broker
}

// TestJoinersAreConfinedToTheirJoinTopics: a client without a certificate
// is admitted only as a joiner (a join client id, no will), may publish
// only to its own join request topic and subscribe only to its own join
// response topic; every forged publish or subscription is refused and
// reaches nobody.
func TestJoinersAreConfinedToTheirJoinTopics(t *testing.T) {
	b, rec, l := startJoinBroker(t, Options{})
	cfg := joinerTLS(b, t)
	id, other := topics.NewJoinID(), topics.NewJoinID()

	for _, tc := range []struct {
		name, id, will string
	}{
		{"a node's client id", topics.AgentClientID("n1"), ""},
		{"a hub's client id", topics.HubClientID("h2"), ""},
		{"a join id that is not hex", topics.JoinClientIDPrefix + "ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ", ""},
		{"a short join id", topics.JoinClientIDPrefix + "abc", ""},
		{"a joiner with a will", topics.JoinClientID(topics.NewJoinID()), l.JoinRequest(id)},
	} {
		if err := connect(t, b.URL(), tc.id, cfg, tc.will); err == nil {
			t.Errorf("%s without a certificate was admitted", tc.name)
		}
	}

	c := paho.NewClient(paho.NewClientOptions().AddBroker(b.URL()).SetClientID(topics.JoinClientID(id)).SetTLSConfig(cfg).SetAutoReconnect(false))
	if tok := c.Connect(); !tok.WaitTimeout(waitTimeout) || tok.Error() != nil {
		t.Fatalf("joiner connect: %v", tok.Error())
	}
	defer c.Disconnect(0)
	if n := b.Joiners(); n != 1 {
		t.Errorf("joiners = %d, want 1", n)
	}
	if _, ok := b.JoinerAddr(id); !ok {
		t.Error("the broker does not know the joiner's address")
	}
	// A second connection with the same join id is refused: it would
	// take the first one's place.
	if err := connect(t, b.URL(), topics.JoinClientID(id), cfg, ""); err == nil {
		t.Error("a second joiner with a join id in use was admitted")
	}

	subs := map[string]bool{
		l.JoinResponse(id):            true,
		l.JoinRequest(id):             false,
		l.JoinResponse(other):         false,
		l.Prefix + "/join/+/response": false,
		l.Prefix + "/#":               false,
		"#":                           false,
		"$SYS/#":                      false,
		l.Dispatch("n1"):              false,
		l.Response("n1"):              false,
	}
	for f, want := range subs {
		tok := c.Subscribe(f, 1, nil)
		if !tok.WaitTimeout(waitTimeout) {
			t.Fatalf("subscribe %s: no answer", f)
		}
		code := tok.(*paho.SubscribeToken).Result()[f]
		if got := tok.Error() == nil && code < 0x80; got != want {
			t.Errorf("joiner subscription to %q admitted=%v (code %#x), want %v", f, got, code, want)
		}
	}

	// A refused publish ends the joiner's connection: each forged one on
	// a joiner of its own.
	forged := []string{
		l.Register("n1"), l.Heartbeat("n1"), l.Status("n1", "u1"), l.Renew("n1"),
		l.JoinRequest(other), l.Dispatch("n1"), l.Prefix + "/elsewhere",
	}
	for _, topic := range forged {
		j := dialJoiner(t, b, cfg, topics.NewJoinID())
		j.Publish(topic, 1, false, []byte("forged"))
		waitClosed(t, j, topic)
	}
	// Its own response topic is the hub's to publish on.
	c.Publish(l.JoinResponse(id), 1, false, []byte("forged"))
	waitClosed(t, c, l.JoinResponse(id))
	forged = append(forged, l.JoinResponse(id))
	last := topics.NewJoinID()
	j := dialJoiner(t, b, cfg, last)
	own := l.JoinRequest(last)
	if tok := j.Publish(own, 1, false, []byte("{}")); !tok.WaitTimeout(waitTimeout) || tok.Error() != nil {
		t.Fatalf("publish to the joiner's own request topic: %v", tok.Error())
	}
	deadline := time.Now().Add(waitTimeout)
	for !rec.has(own) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if !rec.has(own) {
		t.Fatal("the joiner's own request did not reach the hub")
	}
	for _, topic := range forged {
		if rec.has(topic) {
			t.Errorf("a joiner's publish to %q reached the hub", topic)
		}
	}
	if b.Refused() == 0 {
		t.Error("the broker counted no refusals")
	}
}

// TestJoinersAreBounded: beyond MaxJoiners, joiners are refused, and a
// joiner is disconnected after JoinerLifetime.
func TestJoinersAreBounded(t *testing.T) {
	b, _, _ := startJoinBroker(t, Options{MaxJoiners: 1, JoinerLifetime: 2 * time.Second})
	cfg := joinerTLS(b, t)
	lost := make(chan struct{})
	c := paho.NewClient(paho.NewClientOptions().AddBroker(b.URL()).SetClientID(topics.JoinClientID(topics.NewJoinID())).SetTLSConfig(cfg).
		SetAutoReconnect(false).SetConnectionLostHandler(func(paho.Client, error) { close(lost) }))
	if tok := c.Connect(); !tok.WaitTimeout(waitTimeout) || tok.Error() != nil {
		t.Fatalf("joiner connect: %v", tok.Error())
	}
	defer c.Disconnect(0)
	if err := connect(t, b.URL(), topics.JoinClientID(topics.NewJoinID()), cfg, ""); err == nil {
		t.Error("a joiner beyond MaxJoiners was admitted")
	}
	select {
	case <-lost:
	case <-time.After(waitTimeout):
		t.Fatal("the joiner was not disconnected after its lifetime")
	}
	deadline := time.Now().Add(waitTimeout)
	for b.Joiners() > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if err := connect(t, b.URL(), topics.JoinClientID(topics.NewJoinID()), cfg, ""); err != nil {
		t.Errorf("a joiner was refused after the first one left: %v", err)
	}
}
