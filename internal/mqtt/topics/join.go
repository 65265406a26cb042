package topics

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
)

// Registration over MQTT. A machine that has no certificate yet connects to
// the hub's embedded broker without one, as a joiner: its client id is
// JoinClientID(id) for a random join id, and the broker lets it publish only
// to JoinRequest(id) and subscribe only to JoinResponse(id). The hub's
// bridge passes the request to the hub's Register (the same checks and rate
// limits as over gRPC) and answers on the response topic; the agent then
// connects again with its certificate, as a node.
//
//	p/join/{id}/request   joiner -> hub  a Join (the protobuf RegisterRequest)
//	p/join/{id}/response  hub -> joiner  a JoinAnswer
//
// An external broker (Mosquitto) cannot tell a joiner's id from its
// connection without a plugin, so it admits no joiners: nodes behind it
// register over gRPC.

// JoinClientIDPrefix begins a joiner's MQTT client id.
const JoinClientIDPrefix = "drover-join-"

// joinIDLen is the length of a join id: 16 random bytes, hex.
const joinIDLen = 32

// NewJoinID is a random join id.
func NewJoinID() string {
	b := make([]byte, joinIDLen/2)
	_, _ = rand.Read(b) // crypto/rand.Read does not fail
	return hex.EncodeToString(b)
}

// ValidJoinID reports whether id is a join id: 32 lower-case hex digits.
// Nothing else can be a topic level of a joiner.
func ValidJoinID(id string) bool {
	if len(id) != joinIDLen {
		return false
	}
	for _, c := range id {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// JoinClientID is the client id of the joiner with join id id.
func JoinClientID(id string) string { return JoinClientIDPrefix + id }

// JoinIDOf is the join id of a joiner's client id, if it is one.
func JoinIDOf(clientID string) (string, bool) {
	id, ok := strings.CutPrefix(clientID, JoinClientIDPrefix)
	return id, ok && ValidJoinID(id)
}

// JoinRequest is the topic a joiner publishes its registration on.
func (l Layout) JoinRequest(id string) string { return l.Prefix + "/join/" + id + "/request" }

// JoinResponse is the topic the hub answers a joiner on.
func (l Layout) JoinResponse(id string) string { return l.Prefix + "/join/" + id + "/response" }

// JoinFilter is the hub's subscription to every joiner's requests.
func (l Layout) JoinFilter() string { return l.Prefix + "/join/+/request" }

// ParseJoin returns the join id of a join request topic.
func (l Layout) ParseJoin(topic string) (string, bool) {
	rest, ok := strings.CutPrefix(topic, l.Prefix+"/join/")
	if !ok {
		return "", false
	}
	id, ok := strings.CutSuffix(rest, "/request")
	return id, ok && ValidJoinID(id)
}

// JoinerAllowed is the ACL of the joiner with join id id: publish to its
// own request topic, subscribe to its own response topic, nothing else.
func (l Layout) JoinerAllowed(id string, a Access, topic string) bool {
	if !ValidJoinID(id) {
		return false
	}
	switch a {
	case Publish:
		return topic == l.JoinRequest(id)
	case Subscribe:
		return topic == l.JoinResponse(id)
	}
	return false
}

// Join is a joiner's request.
type Join struct {
	// Request is the protobuf encoding of the agent's RegisterRequest.
	Request []byte `json:"request"`
}

// JoinAnswer is the hub's answer to a Join.
type JoinAnswer struct {
	// Response is the protobuf encoding of the RegisterResponse when
	// Code is 0.
	Response []byte `json:"response,omitempty"`
	// Code is a gRPC status code and Error its message, as in Response.
	Code  uint32 `json:"code,omitempty"`
	Error string `json:"error,omitempty"`
	// Status is the protobuf google.rpc.Status of a refusal, with its
	// details (a RetryInfo when the hub rate-limits registrations).
	Status []byte `json:"status,omitempty"`
}

// DecodeJoin parses a join request payload.
func DecodeJoin(b []byte) (Join, error) {
	var j Join
	if err := decode(b, &j); err != nil {
		return j, err
	}
	if len(j.Request) == 0 {
		return j, errors.New("join message without a request")
	}
	return j, nil
}

// DecodeJoinAnswer parses a join response payload.
func DecodeJoinAnswer(b []byte) (JoinAnswer, error) {
	var a JoinAnswer
	return a, decode(b, &a)
}

// Renewal is a node's certificate renewal request, on its Renew topic: the
// hub answers on the node's response topic with a Response whose ID is the
// Renewal's and whose Renewed is the protobuf RenewResponse.
type Renewal struct {
	ID string `json:"id"`
	// Request is the protobuf encoding of the RenewRequest.
	Request []byte `json:"request"`
}

// DecodeRenewal parses a renew topic payload.
func DecodeRenewal(b []byte) (Renewal, error) {
	var r Renewal
	if err := decode(b, &r); err != nil {
		return r, err
	}
	if r.ID == "" || len(r.Request) == 0 {
		return r, errors.New("renewal without an id or a request")
	}
	return r, nil
}
