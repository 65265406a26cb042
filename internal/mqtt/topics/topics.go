// Package topics is the MQTT topic layout of the agent protocol and the rule
// that says which client may use which topic. The embedded broker, the hub's
// bridge, the agent's client and the Mosquitto configuration all take the
// layout from here, so the rule is written once.
//
// With prefix p (default "drover"):
//
//	p/register/{node}                 agent -> hub  session hello (Hello), and the Last Will (Gone)
//	p/heartbeat/{node}                agent -> hub  heartbeat envelopes
//	p/nodes/{node}/tasks/{uid}/status agent -> hub  every other agent envelope (uid "-" when none)
//	p/nodes/{node}/tasks/dispatch     hub -> agent  every hub envelope (snapshot, dispatch, cancel, config)
//	p/nodes/{node}/response           hub -> agent  the Response to each agent envelope, and session ends
//	p/renew/{node}                    agent -> hub  certificate renewal (Renewal), answered on the response topic
//	p/join/{id}/request, .../response joiner <-> hub registration without a certificate (join.go)
//
// The K8s4r design has one shared register and heartbeat topic; here they
// have a {node} level so that a broker ACL can tie them to the publisher's
// identity, as it does for the rest.
//
// Envelopes travel as their protobuf encoding (protocol.Encode); the
// control messages (Hello, Gone, Response) are JSON.
package topics

import (
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/drover-fleet/drover/internal/protocol"
)

// DefaultPrefix is the first topic level when none is configured.
const DefaultPrefix = "drover"

// HubUser begins the MQTT user name (certificate common name) of hubs: a hub
// on prefix p is HubUser+":"+p (Layout.HubCN). It is not a valid node name (a
// node name is a DNS-1123 subdomain, without ':'), so no node can register
// under it and get a hub's access.
const HubUser = "drover:hub"

// AgentClientIDPrefix and HubClientIDPrefix begin the MQTT client ids of
// agents (AgentClientID) and hubs (HubClientID).
const (
	AgentClientIDPrefix = "drover-agent-"
	HubClientIDPrefix   = "drover-hub-"
)

// AgentClientID is the MQTT client id the agent of node connects with.
func AgentClientID(node string) string { return AgentClientIDPrefix + node }

// HubClientID is the MQTT client id the hub named hub connects with.
func HubClientID(hub string) string { return HubClientIDPrefix + hub }

// ClientIDAllowed is the client id rule: whether the client with certificate
// identity user (common name) may connect with MQTT client id id. A broker
// disconnects the connection that had a client id when another one connects
// with it, so a client that could pick any id could keep a hub or another
// node offline. A node may use exactly its own AgentClientID; a hub
// certificate, only hub client ids (HubClientIDPrefix and a name: an
// embedded broker serves one hub, whose certificates are all its own).
//
// The embedded broker applies this rule. Mosquitto cannot compare a client
// id with the user, so its listener (MosquittoListenerAuth) replaces every
// client's id with its user instead: as strict (one connection per
// certificate common name), with other ids.
func ClientIDAllowed(user string, hub bool, id string) bool {
	if hub {
		return len(id) > len(HubClientIDPrefix) && strings.HasPrefix(id, HubClientIDPrefix)
	}
	return protocol.ValidNodeName(user) == nil && id == AgentClientID(user)
}

// MosquittoListenerAuth are the Mosquitto listener options of the identity
// and client id rules: a client certificate from Drover's CA is required,
// its common name is the user (what MosquittoACL names), and the user is the
// client id, whatever id the client sent (see ClientIDAllowed).
const MosquittoListenerAuth = `require_certificate true
use_identity_as_username true
# The client id is the user: no certificate can take another client's id
# (the broker would disconnect that client).
use_username_as_clientid true
`

// HubOrganization and NodeOrganization are the certificate organizations
// Drover's CA gives hubs' and nodes' client certificates.
const (
	HubOrganization  = "drover:hubs"
	NodeOrganization = "drover:nodes"
)

// Layout builds and parses the topics under one prefix.
type Layout struct{ Prefix string }

// New returns the layout under prefix (DefaultPrefix when empty). A prefix is
// one or more topic levels without wildcards.
func New(prefix string) (Layout, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if strings.ContainsAny(prefix, "+#\x00") || strings.HasPrefix(prefix, "/") || strings.HasSuffix(prefix, "/") || strings.Contains(prefix, "//") {
		return Layout{}, fmt.Errorf("mqtt topic prefix %q: want topic levels separated by '/', without '+', '#' or empty levels", prefix)
	}
	return Layout{Prefix: prefix}, nil
}

// HubCN is the certificate common name, and MQTT user, of a hub on this
// prefix: HubUser, ':' and the prefix. Mosquitto makes it the hub's client
// id, so hubs sharing a broker need one prefix each.
func (l Layout) HubCN() string { return HubUser + ":" + l.Prefix }

// Register is node's hello and Last Will topic.
func (l Layout) Register(node string) string { return l.Prefix + "/register/" + node }

// Heartbeat is node's heartbeat topic.
func (l Layout) Heartbeat(node string) string { return l.Prefix + "/heartbeat/" + node }

// Status is the topic of node's reports about work uid; uid "" (a message
// about no single item) and uids that cannot be a topic level become "-".
// The level is for operators and ACLs: the hub reads the uid from the
// envelope.
func (l Layout) Status(node, uid string) string {
	if uid == "" || strings.ContainsAny(uid, "/+#") {
		uid = "-"
	}
	return l.Prefix + "/nodes/" + node + "/tasks/" + uid + "/status"
}

// Dispatch is the topic of every hub envelope for node.
func (l Layout) Dispatch(node string) string { return l.Prefix + "/nodes/" + node + "/tasks/dispatch" }

// Response is the topic of the hub's answers to node.
func (l Layout) Response(node string) string { return l.Prefix + "/nodes/" + node + "/response" }

// Renew is node's certificate renewal topic.
func (l Layout) Renew(node string) string { return l.Prefix + "/renew/" + node }

// HubFilters are the subscriptions of a hub's bridge.
func (l Layout) HubFilters() []string {
	return []string{l.Prefix + "/register/+", l.Prefix + "/heartbeat/+", l.Prefix + "/nodes/+/tasks/+/status", l.Prefix + "/renew/+", l.JoinFilter()}
}

// Kind is what an agent->hub topic carries.
type Kind int

// Agent->hub topic kinds.
const (
	KindNone Kind = iota
	KindRegister
	KindHeartbeat
	KindStatus
	KindRenew
)

// Parse returns the kind and node of an agent->hub topic, or KindNone for any
// other topic (including hub->agent ones).
func (l Layout) Parse(topic string) (Kind, string) {
	rest, ok := strings.CutPrefix(topic, l.Prefix+"/")
	if !ok {
		return KindNone, ""
	}
	lv := strings.Split(rest, "/")
	switch {
	case len(lv) == 2 && lv[0] == "register" && protocol.ValidNodeName(lv[1]) == nil:
		return KindRegister, lv[1]
	case len(lv) == 2 && lv[0] == "heartbeat" && protocol.ValidNodeName(lv[1]) == nil:
		return KindHeartbeat, lv[1]
	case len(lv) == 2 && lv[0] == "renew" && protocol.ValidNodeName(lv[1]) == nil:
		return KindRenew, lv[1]
	case len(lv) == 5 && lv[0] == "nodes" && lv[2] == "tasks" && lv[3] != "" && lv[4] == "status" && protocol.ValidNodeName(lv[1]) == nil:
		return KindStatus, lv[1]
	}
	return KindNone, ""
}

// Access is what a client wants to do with a topic.
type Access int

// Accesses checked by Allowed.
const (
	Publish Access = iota
	Subscribe
)

// Allowed is the ACL: whether the client with certificate identity user
// (common name) and organization may publish to, or subscribe to, topic (a
// filter, for Subscribe). A hub may use every topic under the prefix; a node
// may publish only its own register, heartbeat and status topics and
// subscribe only to its own dispatch and response topics, without
// wildcards. Anything else is refused.
func (l Layout) Allowed(user string, hub bool, a Access, topic string) bool {
	if hub {
		return topic == l.Prefix+"/#" || strings.HasPrefix(topic, l.Prefix+"/")
	}
	if protocol.ValidNodeName(user) != nil {
		return false
	}
	switch a {
	case Publish:
		if strings.ContainsAny(topic, "+#") {
			return false
		}
		k, node := l.Parse(topic)
		return k != KindNone && node == user
	case Subscribe:
		return topic == l.Dispatch(user) || topic == l.Response(user)
	}
	return false
}

// MosquittoACL is a Mosquitto acl_file with the same rule as Allowed, for
// brokers run with use_identity_as_username (the user is the certificate's
// common name).
func (l Layout) MosquittoACL() string {
	p := l.Prefix
	return fmt.Sprintf(`# Drover agent protocol ACL (generated; see "MQTT" in Drover's README).
# The hub of this prefix connects with the user %[2]s and may use every
# topic under the prefix.
user %[2]s
topic readwrite %[1]s/#

# Every other user is a node, named by its certificate: only its own topics.
# Operator certificates (CN drover:operator#, for reading logs at hubs) get
# none: a user with an MQTT wildcard matches no pattern.
pattern write %[1]s/register/%%u
pattern write %[1]s/heartbeat/%%u
pattern write %[1]s/nodes/%%u/tasks/+/status
pattern write %[1]s/renew/%%u
pattern read %[1]s/nodes/%%u/tasks/dispatch
pattern read %[1]s/nodes/%%u/response
`, p, l.HubCN())
}

// BrokerURL checks a broker URL and returns it as paho wants it, with the
// host for TLS verification.
func BrokerURL(s string) (broker, host string, err error) {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return "", "", fmt.Errorf("mqtt broker %q: want ssl://host:port", s)
	}
	switch u.Scheme {
	case "ssl", "tls", "mqtts":
	default:
		return "", "", fmt.Errorf("mqtt broker %q: scheme %q: agents talk to brokers over TLS only (ssl://host:port)", s, u.Scheme)
	}
	h, _, err := net.SplitHostPort(u.Host)
	if err != nil {
		return "", "", fmt.Errorf("mqtt broker %q: want ssl://host:port: %w", s, err)
	}
	return "ssl://" + u.Host, h, nil
}
