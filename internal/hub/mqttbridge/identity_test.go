package mqttbridge_test

import (
	"context"
	"crypto/tls"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/mqtt/topics"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/testenv"
)

// responses collects what the hub answers on a node's response topic.
type responses struct {
	mu  sync.Mutex
	got []topics.Response
}

func (r *responses) handle(_ paho.Client, m paho.Message) {
	resp, err := topics.DecodeResponse(m.Payload())
	if err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, resp)
}

// find returns the first response that match accepts.
func (r *responses) find(match func(topics.Response) bool) (topics.Response, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, x := range r.got {
		if match(x) {
			return x, true
		}
	}
	return topics.Response{}, false
}

// agentClient connects node's agent client id with cfg, subscribed to the
// node's response topic, and says hello as session.
func (s *stack) agentClient(node string, cfg *tls.Config) (paho.Client, *responses) {
	s.t.Helper()
	c := s.rawClient(topics.AgentClientID(node), cfg)
	r := &responses{}
	if tok := c.Subscribe(s.layout.Response(node), 1, r.handle); !tok.WaitTimeout(waitTimeout) || tok.Error() != nil {
		s.t.Fatalf("subscribe to %s's responses: %v", node, tok.Error())
	}
	return c, r
}

// hello publishes a hello for session on node's register topic.
func (s *stack) hello(c paho.Client, node, session string) {
	s.t.Helper()
	req, err := proto.Marshal(&agentv1.GetMessageRequest{})
	if err != nil {
		s.t.Fatal(err)
	}
	if tok := c.Publish(s.layout.Register(node), 1, false, topics.Encode(topics.Register{Session: session, Request: req})); !tok.WaitTimeout(waitTimeout) || tok.Error() != nil {
		s.t.Fatalf("hello from %s: %v", node, tok.Error())
	}
}

// TestOldCertificateRefusedOverMQTT is attack 3 of issue 15 over the
// embedded broker: node is revoked, its FleetNode deleted and a new machine
// registers as node. A connection the old certificate opened before cannot
// start a session (the bridge passes its key to the hub), the old
// certificate cannot connect again (the broker asks the hub), and the new
// machine's session stays.
func TestOldCertificateRefusedOverMQTT(t *testing.T) {
	s := startStack(t, "embedded", "mqtt-identity")
	node := "mqtt-old-" + protocol.NewID()[:8]
	oldCfg := s.rawNode(node)
	old, oldResp := s.agentClient(node, oldCfg)

	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := hub.RevokeNode(ctx, s.c, s.ns, node, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := s.c.Delete(ctx, &fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "FleetNode "+node+" deleted", func(ctx context.Context) (bool, error) {
		return apierrors.IsNotFound(s.c.Get(ctx, client.ObjectKey{Name: node}, &fleetv1.FleetNode{})), nil
	})
	newCfg := s.rawNode(node) // a new machine, a new key

	// The connection the old certificate kept open says hello.
	s.hello(old, node, "old-session")
	waitFor(t, "the old connection's hello refused", func() bool {
		r, ok := oldResp.find(func(r topics.Response) bool { return r.Session == "old-session" })
		if ok && (codes.Code(r.Code) != codes.PermissionDenied || !strings.Contains(r.Error, "revoked")) {
			t.Fatalf("hello with the old certificate answered %v %q, want PermissionDenied saying it was revoked", codes.Code(r.Code), r.Error)
		}
		return ok
	})
	if s.hub.Connected(node) {
		t.Fatal("the old certificate's hello opened a session")
	}

	// The new machine connects (the broker drops the old connection, which
	// had its client id) and its session opens.
	fresh, freshResp := s.agentClient(node, newCfg)
	s.hello(fresh, node, "new-session")
	waitFor(t, "the new machine's session", func() bool {
		if r, ok := freshResp.find(func(r topics.Response) bool { return r.Session == "new-session" }); ok {
			t.Fatalf("the new machine's hello answered %v %q", codes.Code(r.Code), r.Error)
		}
		return s.hub.Connected(node)
	})

	// The old certificate cannot connect again, nor take the id over.
	c := paho.NewClient(paho.NewClientOptions().AddBroker(s.url).SetClientID(topics.AgentClientID(node)).SetTLSConfig(oldCfg).
		SetAutoReconnect(false).SetConnectRetry(false).SetConnectTimeout(waitTimeout))
	tok := c.Connect()
	if !tok.WaitTimeout(waitTimeout) {
		t.Fatal("connect with the old certificate: no answer")
	}
	if tok.Error() == nil {
		c.Disconnect(0)
		t.Fatal("the embedded broker admitted the revoked certificate")
	}
	if !fresh.IsConnectionOpen() || !s.hub.Connected(node) {
		t.Error("the old certificate's attempt cost the new machine its connection or session")
	}
	if !slices.ContainsFunc(strings.Split(s.logs.String(), "\n"), func(l string) bool {
		return strings.Contains(l, "mqtt connection refused") && strings.Contains(l, "does not match the key node "+node+" registered with")
	}) {
		t.Error("the broker logged no refusal saying the key is not the node's")
	}
}
