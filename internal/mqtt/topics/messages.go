package topics

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Register carries a Hello or a Gone on a node's register topic.
type Register struct {
	// Session names one MQTT connection of the agent: a Gone ends the hub's
	// session only if it is still that connection's.
	Session string `json:"session"`
	// Request is the protobuf encoding of the agent's GetMessageRequest; empty in a Gone.
	Request []byte `json:"request,omitempty"`
	// Gone is set in the Last Will: the agent's connection died.
	Gone bool `json:"gone,omitempty"`
}

// Response is the hub's answer on a node's response topic.
type Response struct {
	// ID is the envelope answered; empty when the message ends a session.
	ID string `json:"id,omitempty"`
	// Session is the session ended (with ID empty).
	Session string `json:"session,omitempty"`
	// Code is a gRPC status code (0: OK) and Error its message, so that the
	// agent treats refusals alike on both transports.
	Code  uint32 `json:"code,omitempty"`
	Error string `json:"error,omitempty"`
	// Duplicate and FullSyncRequired are the SendResponse's fields.
	Duplicate        bool `json:"duplicate,omitempty"`
	FullSyncRequired bool `json:"fullSyncRequired,omitempty"`
	// Renewed answers a Renewal: the protobuf RenewResponse.
	Renewed []byte `json:"renewed,omitempty"`
}

// MaxControlBytes bounds a Register or Response message.
const MaxControlBytes = 64 << 10

// Encode marshals a control message.
func Encode(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only plain structs are marshalled
	}
	return b
}

// DecodeRegister parses a register-topic payload.
func DecodeRegister(b []byte) (Register, error) {
	var r Register
	if err := decode(b, &r); err != nil {
		return r, err
	}
	if r.Session == "" {
		return r, errors.New("register message without a session")
	}
	return r, nil
}

// DecodeResponse parses a response-topic payload.
func DecodeResponse(b []byte) (Response, error) {
	var r Response
	return r, decode(b, &r)
}

func decode(b []byte, v any) error {
	if len(b) > MaxControlBytes {
		return fmt.Errorf("control message of %d bytes, more than %d", len(b), MaxControlBytes)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("control message: %w", err)
	}
	return nil
}
