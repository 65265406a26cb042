package mqttbridge_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/agent"
	"github.com/drover-fleet/drover/internal/mqtt/topics"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/testkit"
)

// brokers are the brokers every test runs against.
var brokers = []string{"embedded", "mosquitto"}

// TestAgentsOverMQTT: real agents connect over MQTT and go Online; a
// dispatched item runs once and its status arrives, even when the agent's
// client loses hub messages (the bridge publishes them again until acked).
func TestAgentsOverMQTT(t *testing.T) {
	for _, kind := range brokers {
		t.Run(kind, func(t *testing.T) {
			s := startStack(t, kind, "mqtt-"+kind)
			lossy, plain := kind+"-lossy", kind+"-plain"
			runs := &counter{}
			// The lossy agent drops the first two hub envelopes with a
			// revision: its connect snapshot and the first dispatch.
			s.startAgent(lossy, 2, map[string]agent.Runner{"count": runs})
			s.startAgent(plain, 0, nil)
			s.waitOnline(lossy)
			s.waitOnline(plain)

			it := &agentv1.WorkItem{Uid: "w-count", Type: "count", Spec: []byte(`{}`)}
			s.dispatch(lossy, it)
			s.sink.waitPhase(t, lossy, it.GetUid(), agent.PhaseSucceeded)
			s.waitSettled(lossy)
			if n := s.bridge.Resent(); n < 2 {
				t.Errorf("bridge published %d envelopes again, want at least the 2 the agent dropped", n)
			}
			testkit.Never(t, settle, func() string {
				if n := runs.count(it.GetUid()); n != 1 {
					return fmt.Sprintf("%s ran %d times, want 1", it.GetUid(), n)
				}
				if got := s.sink.statuses(lossy, it.GetUid()); len(got) != 1 {
					return fmt.Sprintf("hub got %d statuses for %s, want 1: %v", len(got), it.GetUid(), got)
				}
				return ""
			})

			noop := &agentv1.WorkItem{Uid: "w-noop", Type: "noop", Spec: []byte(`{}`)}
			s.dispatch(plain, noop)
			s.sink.waitPhase(t, plain, noop.GetUid(), agent.PhaseSucceeded)
			s.waitSettled(plain)
		})
	}
}

// TestNodesAreConfinedToTheirTopics: a node's certificate can neither
// publish on another node's status topic (the hub never sees it) nor read
// another node's dispatches, on either broker.
func TestNodesAreConfinedToTheirTopics(t *testing.T) {
	for _, kind := range brokers {
		t.Run(kind, func(t *testing.T) {
			s := startStack(t, kind, "mqtt-acl-"+kind)
			victim, intruderName := kind+"-victim", kind+"-intruder"
			s.startAgent(victim, 0, nil)
			s.waitOnline(victim)
			intruder := s.rawNode(intruderName)

			// A spy with a hub's identity sees every topic.
			spy := &recorder{}
			sc := s.rawClient(s.spy())
			if tok := sc.Subscribe(s.layout.Prefix+"/#", 1, spy.handle); !tok.WaitTimeout(waitTimeout) || tok.Error() != nil {
				t.Fatalf("spy subscribe: %v", tok.Error())
			}

			// Reading: subscriptions to the victim's topics are refused or
			// deliver nothing.
			peek := &recorder{}
			// The intruder's connections use the one client id its
			// certificate may use: each replaces the one before.
			intruderID := topics.AgentClientID(intruderName)
			pc := s.rawClient(intruderID, intruder)
			for _, f := range []string{s.layout.Dispatch(victim), s.layout.Response(victim), s.layout.Prefix + "/#", s.layout.Prefix + "/nodes/+/tasks/dispatch"} {
				tok := pc.Subscribe(f, 1, peek.handle)
				if !tok.WaitTimeout(waitTimeout) {
					t.Fatalf("intruder subscribe %s: no answer", f)
				}
				t.Logf("%s: intruder's subscription to %s: err %v, granted %v", kind, f, tok.Error(), subResult(tok))
			}
			it := &agentv1.WorkItem{Uid: "w-secret", Type: "noop", Spec: []byte(`{"secret":true}`)}
			s.dispatch(victim, it)
			s.sink.waitPhase(t, victim, it.GetUid(), agent.PhaseSucceeded)
			s.waitSettled(victim)
			if !slices.Contains(spy.topics(), s.layout.Dispatch(victim)) {
				t.Fatalf("the spy did not see the victim's dispatch: the test proves nothing; spy saw %v", spy.topics())
			}
			if got := peek.topics(); len(got) > 0 {
				t.Errorf("the intruder received %v", got)
			}

			// Writing: a forged status for the victim never reaches the hub.
			forged := protocol.NewStatus(victim, 1000, &agentv1.WorkStatus{Uid: "w-forged", Phase: agent.PhaseSucceeded})
			b, err := protocol.Encode(forged)
			if err != nil {
				t.Fatal(err)
			}
			wc := s.rawClient(intruderID, intruder)
			// Mochi disconnects an MQTT 3.1.1 client that publishes where it
			// may not; Mosquitto acks and drops it. Either is fine.
			wc.Publish(s.layout.Status(victim, "w-forged"), 1, false, b).WaitTimeout(5 * time.Second)
			// A control message on the intruder's own topic, from a second
			// connection, shows when the broker has passed on what it would.
			cc := s.rawClient(intruderID, intruder)
			control := s.layout.Status(intruderName, "control")
			if tok := cc.Publish(control, 1, false, []byte("control")); !tok.WaitTimeout(waitTimeout) || tok.Error() != nil {
				t.Fatalf("publish control: %v", tok.Error())
			}
			waitFor(t, "the spy to see the control message", func() bool { return slices.Contains(spy.topics(), control) })
			testkit.Never(t, settle, func() string {
				if slices.Contains(spy.topics(), s.layout.Status(victim, "w-forged")) {
					return "the broker passed on the intruder's publish to the victim's status topic"
				}
				if got := s.sink.statuses(victim, "w-forged"); len(got) > 0 {
					return fmt.Sprintf("the hub applied a forged status: %v", got)
				}
				return ""
			})
		})
	}
}

// TestClientIDsCannotBeTaken: a node's certificate connecting with the
// hub's client id or another agent's does not disconnect them (a broker
// drops the older of two connections with one id): the embedded broker
// refuses it, Mosquitto gives it its own id (its common name). The hub and
// the victim's agent keep working.
func TestClientIDsCannotBeTaken(t *testing.T) {
	for _, kind := range brokers {
		t.Run(kind, func(t *testing.T) {
			s := startStack(t, kind, "mqtt-ids-"+kind)
			victim := kind + "-id-victim" // FleetNodes are cluster-wide: a name of its own
			s.startAgent(victim, 0, nil)
			s.waitOnline(victim)
			intruder := s.rawNode(kind + "-id-intruder")
			// The hub's id as the bridge sends it, the id Mosquitto gives
			// the hub, and the victim's agent's ids on either broker.
			for _, id := range []string{topics.HubClientID(s.ns), s.layout.HubCN(), topics.AgentClientID(victim), victim} {
				c := paho.NewClient(paho.NewClientOptions().AddBroker(s.url).SetClientID(id).SetTLSConfig(intruder).
					SetAutoReconnect(false).SetConnectRetry(false).SetConnectTimeout(waitTimeout))
				tok := c.Connect()
				if !tok.WaitTimeout(waitTimeout) {
					t.Fatalf("connect as %q: no answer", id)
				}
				t.Logf("%s: intruder connecting as %q: err %v", kind, id, tok.Error())
				if kind == "embedded" && tok.Error() == nil {
					t.Errorf("the embedded broker admitted the intruder's certificate with client id %q", id)
				}
				if tok.Error() == nil {
					c.Disconnect(0)
				}
			}
			it := &agentv1.WorkItem{Uid: "w-after", Type: "noop", Spec: []byte(`{}`)}
			s.dispatch(victim, it)
			s.sink.waitPhase(t, victim, it.GetUid(), agent.PhaseSucceeded)
			s.waitSettled(victim)
			logs := s.logs.String()
			for _, lost := range []string{"mqtt bridge lost the broker", "mqtt connection to", "already connected, closing old connection"} {
				if strings.Contains(logs, lost) {
					t.Errorf("a client lost its connection (%q in the logs)", lost)
				}
			}
		})
	}
}

func subResult(tok interface{}) any {
	type resulter interface{ Result() map[string]byte }
	if r, ok := tok.(resulter); ok {
		return r.Result()
	}
	return nil
}

// waitFor waits waitTimeout at most for cond, which the test describes
// as what it waits for.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testkit.Eventually(t, waitTimeout, func() string {
		if !cond() {
			return "still waiting for " + what
		}
		return ""
	})
}

// TestRevokedNodeStopsOverMQTT: the hub's refusal reaches an MQTT agent as
// it reaches a gRPC one: a revoked node's session is closed, its next hello
// is refused with PermissionDenied, and the agent stops with a fatal error.
func TestRevokedNodeStopsOverMQTT(t *testing.T) {
	s := startStack(t, "embedded", "mqtt-revoke")
	// Unique per run: a revoked FleetNode stays revoked (go test -count=2).
	node := "revoked-" + protocol.NewID()[:8]
	done := s.startAgentAsync(node)
	s.waitOnline(node)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	// The hub writes the node's status meanwhile: retry on conflicts.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var n fleetv1.FleetNode
		if err := s.c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
			return err
		}
		n.Spec.Revoked = true
		return s.c.Update(ctx, &n)
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		var fatal *agent.FatalError
		if !errors.As(err, &fatal) || !strings.Contains(err.Error(), "revoked") {
			t.Fatalf("agent returned %v, want a fatal error saying the node is revoked", err)
		}
	case <-time.After(waitTimeout):
		t.Fatalf("agent still running %v after its node was revoked", waitTimeout)
	}
	if s.hub.Connected(node) {
		t.Error("the hub still holds a session for the revoked node")
	}
}

// TestLostReportsAreSentAgain: when the hub side loses an agent's reports
// (here the bridge drops the first two copies of a work item's status), the
// agent publishes them again until answered, and the hub applies the status
// once.
func TestLostReportsAreSentAgain(t *testing.T) {
	for _, kind := range brokers {
		t.Run(kind, func(t *testing.T) {
			const uid = "w-report"
			var mu sync.Mutex
			dropped := 0
			s := startStackWith(t, kind, "mqtt-reports-"+kind, func(env *agentv1.Envelope) bool {
				mu.Lock()
				defer mu.Unlock()
				if env.GetStatus().GetWork().GetUid() == uid && dropped < 2 {
					dropped++
					return true
				}
				return false
			})
			node := kind + "-reporter"
			runs := &counter{}
			s.startAgent(node, 0, map[string]agent.Runner{"count": runs})
			s.waitOnline(node)
			s.dispatch(node, &agentv1.WorkItem{Uid: uid, Type: "count", Spec: []byte(`{}`)})
			s.sink.waitPhase(t, node, uid, agent.PhaseSucceeded)
			mu.Lock()
			n := dropped
			mu.Unlock()
			if n != 2 {
				t.Fatalf("the bridge dropped %d copies of the status, want 2: the test proves nothing", n)
			}
			testkit.Never(t, settle, func() string {
				if got := s.sink.statuses(node, uid); len(got) != 1 {
					return fmt.Sprintf("hub applied %d statuses for %s, want 1: %v", len(got), uid, got)
				}
				if c := runs.count(uid); c != 1 {
					return fmt.Sprintf("%s ran %d times, want 1", uid, c)
				}
				return ""
			})
		})
	}
}

// TestBurstsArriveOnceOverMQTT: a burst of dispatches to an agent whose
// client loses the first envelopes it is sent (here likely batched
// Dispatches: the agent names the feature) runs every item once and
// reports it once: the bridge publishes the lost envelopes again as they
// were sent, and the agent's revisions make the repeats harmless.
func TestBurstsArriveOnceOverMQTT(t *testing.T) {
	for _, kind := range brokers {
		t.Run(kind, func(t *testing.T) {
			s := startStack(t, kind, "mqtt-burst-"+kind)
			node := kind + "-burst"
			runs := &counter{}
			// The first dropped is the connect snapshot; then dispatches.
			s.startAgent(node, 3, map[string]agent.Runner{"count": runs})
			s.waitOnline(node)
			const n = 150
			uid := func(i int) string { return fmt.Sprintf("w-burst-%03d", i) }
			for i := range n {
				s.dispatch(node, &agentv1.WorkItem{Uid: uid(i), Type: "count", Spec: []byte(`{}`)})
			}
			for i := range n {
				s.sink.waitPhase(t, node, uid(i), agent.PhaseSucceeded)
			}
			s.waitSettled(node)
			if r := s.bridge.Resent(); r < 2 {
				t.Errorf("bridge published %d envelopes again, want at least the 2 dispatches the agent dropped", r)
			}
			testkit.Never(t, settle, func() string {
				for i := range n {
					if c := runs.count(uid(i)); c != 1 {
						return fmt.Sprintf("%s ran %d times, want 1", uid(i), c)
					}
					if got := s.sink.statuses(node, uid(i)); len(got) != 1 {
						return fmt.Sprintf("hub got %d statuses for %s, want 1: %v", len(got), uid(i), got)
					}
				}
				return ""
			})
		})
	}
}
