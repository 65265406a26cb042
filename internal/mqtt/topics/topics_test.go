package topics

import (
	"strings"
	"testing"

	"github.com/drover-fleet/drover/internal/pki"
)

func TestLayout(t *testing.T) {
	l, err := New("")
	if err != nil {
		t.Fatal(err)
	}
	for got, want := range map[string]string{
		l.Register("n1"):                  "drover/register/n1",
		l.Heartbeat("n1"):                 "drover/heartbeat/n1",
		l.Status("n1", "task-a-1"):        "drover/nodes/n1/tasks/task-a-1/status",
		l.Status("n1", ""):                "drover/nodes/n1/tasks/-/status",
		l.Status("n1", "a/b"):             "drover/nodes/n1/tasks/-/status",
		l.Status("n1", "a+#"):             "drover/nodes/n1/tasks/-/status",
		l.Dispatch("n1"):                  "drover/nodes/n1/tasks/dispatch",
		l.Response("n1"):                  "drover/nodes/n1/response",
		l.Renew("n1"):                     "drover/renew/n1",
		l.JoinRequest("j1"):               "drover/join/j1/request",
		l.JoinResponse("j1"):              "drover/join/j1/response",
		strings.Join(l.HubFilters(), " "): "drover/register/+ drover/heartbeat/+ drover/nodes/+/tasks/+/status drover/renew/+ drover/join/+/request",
	} {
		if got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
	for _, bad := range []string{"a/+", "#", "/a", "a/", "a//b"} {
		if _, err := New(bad); err == nil {
			t.Errorf("New(%q) accepted a bad prefix", bad)
		}
	}
	if l2, err := New("fleet/eu"); err != nil || l2.Dispatch("n") != "fleet/eu/nodes/n/tasks/dispatch" {
		t.Errorf("New(fleet/eu) = %v, %v", l2, err)
	}
}

func TestParse(t *testing.T) {
	l, _ := New("p")
	cases := []struct {
		topic string
		kind  Kind
		node  string
	}{
		{"p/register/n1", KindRegister, "n1"},
		{"p/heartbeat/n1", KindHeartbeat, "n1"},
		{"p/nodes/n1/tasks/w1/status", KindStatus, "n1"},
		{"p/nodes/n1/tasks/-/status", KindStatus, "n1"},
		{"p/nodes/n1/tasks/dispatch", KindNone, ""},
		{"p/nodes/n1/response", KindNone, ""},
		{"p/register/Not_A_Node", KindNone, ""},
		{"q/register/n1", KindNone, ""},
		{"p/register/n1/extra", KindNone, ""},
		{"p/nodes/n1/tasks//status", KindNone, ""},
	}
	for _, tc := range cases {
		k, n := l.Parse(tc.topic)
		if k != tc.kind || n != tc.node {
			t.Errorf("Parse(%q) = %v %q, want %v %q", tc.topic, k, n, tc.kind, tc.node)
		}
	}
}

func TestAllowed(t *testing.T) {
	l, _ := New("")
	cases := []struct {
		user  string
		hub   bool
		a     Access
		topic string
		want  bool
	}{
		{"a", false, Publish, "drover/register/a", true},
		{"a", false, Publish, "drover/heartbeat/a", true},
		{"a", false, Publish, "drover/nodes/a/tasks/w1/status", true},
		{"a", false, Publish, "drover/register/b", false},
		{"a", false, Publish, "drover/heartbeat/b", false},
		{"a", false, Publish, "drover/nodes/b/tasks/w1/status", false},
		{"a", false, Publish, "drover/nodes/a/tasks/dispatch", false},
		{"a", false, Publish, "drover/nodes/a/response", false},
		{"a", false, Publish, "drover/nodes/a/tasks/+/status", false},
		{"a", false, Subscribe, "drover/nodes/a/tasks/dispatch", true},
		{"a", false, Subscribe, "drover/nodes/a/response", true},
		{"a", false, Subscribe, "drover/nodes/b/tasks/dispatch", false},
		{"a", false, Subscribe, "drover/nodes/+/tasks/dispatch", false},
		{"a", false, Subscribe, "drover/#", false},
		{"a", false, Subscribe, "#", false},
		{"a", false, Subscribe, "$SYS/#", false},
		{HubUser, false, Publish, "drover/register/x", false}, // not a node name, not a hub certificate
		{HubUser, true, Subscribe, "drover/#", true},
		{HubUser, true, Publish, "drover/nodes/a/tasks/dispatch", true},
		{HubUser, true, Subscribe, "other/#", false},
		{HubUser, true, Subscribe, "#", false},
	}
	for _, tc := range cases {
		if got := l.Allowed(tc.user, tc.hub, tc.a, tc.topic); got != tc.want {
			t.Errorf("Allowed(%q, hub=%v, %v, %q) = %v, want %v", tc.user, tc.hub, tc.a, tc.topic, got, tc.want)
		}
	}
}

func TestClientIDAllowed(t *testing.T) {
	l, _ := New("")
	cases := []struct {
		user string
		hub  bool
		id   string
		want bool
	}{
		{"m-3", false, AgentClientID("m-3"), true},
		{"m-3", false, "drover-agent-m-3", true},
		{"m-3", false, AgentClientID("m-4"), false},            // another node's
		{"m-3", false, HubClientID("hub-b"), false},            // a hub's
		{"m-3", false, "m-3", false},                           // not the agent's id
		{"m-3", false, "", false},                              // a broker-assigned id
		{"drover-agent-m-3", false, "drover-agent-m-3", false}, // m-3's
		{l.HubCN(), false, AgentClientID(l.HubCN()), false},    // not a node name
		{l.HubCN(), true, HubClientID("hub-b"), true},
		{l.HubCN(), true, "drover-hub-hub-b", true},
		{l.HubCN(), true, HubClientIDPrefix, false},
		{l.HubCN(), true, AgentClientID("m-3"), false},
		{l.HubCN(), true, "spy", false},
	}
	for _, tc := range cases {
		if got := ClientIDAllowed(tc.user, tc.hub, tc.id); got != tc.want {
			t.Errorf("ClientIDAllowed(%q, hub=%v, %q) = %v, want %v", tc.user, tc.hub, tc.id, got, tc.want)
		}
	}
	if got := l.HubCN(); got != "drover:hub:drover" {
		t.Errorf("HubCN = %q", got)
	}
	for _, opt := range []string{"require_certificate true", "use_identity_as_username true", "use_username_as_clientid true"} {
		if !strings.Contains(MosquittoListenerAuth, opt+"\n") {
			t.Errorf("MosquittoListenerAuth lacks %q", opt)
		}
	}
}

func TestMosquittoACLNamesEveryRule(t *testing.T) {
	l, _ := New("fleet")
	acl := l.MosquittoACL()
	for _, line := range []string{
		"user drover:hub:fleet",
		"topic readwrite fleet/#",
		"pattern write fleet/register/%u",
		"pattern write fleet/heartbeat/%u",
		"pattern write fleet/nodes/%u/tasks/+/status",
		"pattern read fleet/nodes/%u/tasks/dispatch",
		"pattern read fleet/nodes/%u/response",
	} {
		if !strings.Contains(acl, line+"\n") {
			t.Errorf("acl lacks %q:\n%s", line, acl)
		}
	}
}

func TestBrokerURL(t *testing.T) {
	for in, want := range map[string]string{"ssl://h:8883": "h", "tls://10.0.0.1:1": "10.0.0.1", "mqtts://[::1]:8883": "::1"} {
		if _, h, err := BrokerURL(in); err != nil || h != want {
			t.Errorf("BrokerURL(%q) = %q, %v; want host %q", in, h, err, want)
		}
	}
	for _, bad := range []string{"tcp://h:1883", "h:8883", "ssl://h", ""} {
		if _, _, err := BrokerURL(bad); err == nil {
			t.Errorf("BrokerURL(%q) accepted", bad)
		}
	}
}

// An operator certificate's user (its common name) has no topic: the
// rule refuses it, and under Mosquitto's %u patterns every topic it would
// get holds a wildcard, which no publish may name.
func TestOperatorHasNoTopic(t *testing.T) {
	l, err := New("")
	if err != nil {
		t.Fatal(err)
	}
	u := pki.OperatorCommonName
	for _, topic := range []string{l.Register(u), l.Heartbeat(u), l.Status(u, "uid"), l.Dispatch(u), l.Response(u)} {
		for _, a := range []Access{Publish, Subscribe} {
			if l.Allowed(u, false, a, topic) {
				t.Errorf("the operator user may %v %s", a, topic)
			}
		}
		if !strings.ContainsAny(topic, "+#") {
			t.Errorf("topic %s of the operator user has no wildcard: Mosquitto's patterns would grant it", topic)
		}
	}
	if strings.Contains(l.MosquittoACL(), "user "+u) {
		t.Error("the Mosquitto ACL names the operator user")
	}
}

// TestJoinerRule: a joiner may use its own join topics only, a join id is
// 32 hex digits, and a node may not use join topics.
func TestJoinerRule(t *testing.T) {
	l, _ := New("")
	id, other := NewJoinID(), NewJoinID()
	if !ValidJoinID(id) || id == other {
		t.Fatalf("NewJoinID = %q, %q", id, other)
	}
	for _, bad := range []string{"", "abc", strings.Repeat("g", 32), strings.Repeat("A", 32), strings.Repeat("a", 33), strings.Repeat("a", 31) + "/"} {
		if ValidJoinID(bad) {
			t.Errorf("ValidJoinID(%q) = true", bad)
		}
	}
	if got, ok := JoinIDOf(JoinClientID(id)); !ok || got != id {
		t.Errorf("JoinIDOf = %q, %v", got, ok)
	}
	if got, ok := l.ParseJoin(l.JoinRequest(id)); !ok || got != id {
		t.Errorf("ParseJoin = %q, %v", got, ok)
	}
	for _, tc := range []struct {
		a     Access
		topic string
		want  bool
	}{
		{Publish, l.JoinRequest(id), true},
		{Subscribe, l.JoinResponse(id), true},
		{Publish, l.JoinResponse(id), false},
		{Subscribe, l.JoinRequest(id), false},
		{Publish, l.JoinRequest(other), false},
		{Subscribe, l.JoinResponse(other), false},
		{Subscribe, "drover/join/+/response", false},
		{Subscribe, "drover/#", false},
		{Publish, l.Register("n1"), false},
	} {
		if got := l.JoinerAllowed(id, tc.a, tc.topic); got != tc.want {
			t.Errorf("JoinerAllowed(%v, %q) = %v, want %v", tc.a, tc.topic, got, tc.want)
		}
	}
	if l.JoinerAllowed("not-an-id", Publish, "drover/join/not-an-id/request") {
		t.Error("a bad join id was allowed its topic")
	}
	if l.Allowed("n1", false, Publish, l.JoinRequest(id)) || l.Allowed("n1", false, Subscribe, l.JoinResponse(id)) {
		t.Error("a node may use join topics")
	}
	if !l.Allowed("n1", false, Publish, l.Renew("n1")) || l.Allowed("n1", false, Publish, l.Renew("n2")) {
		t.Error("a node's renew topic rule is wrong")
	}
}
