package protocol

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// Decode parses and validates one encoded envelope. It checks the size first
// (an oversized input wraps ErrTooLarge and is not parsed), then unmarshals
// (a parse error wraps ErrMalformed), then runs Validate.
//
// Fields this build does not know are dropped: envelopes are consumed, never
// relayed, so there is nothing to preserve them for.
func Decode(b []byte) (*agentv1.Envelope, error) {
	if len(b) > MaxEnvelopeBytes {
		return nil, fmt.Errorf("decode envelope: %d bytes, more than %d: %w", len(b), MaxEnvelopeBytes, ErrTooLarge)
	}
	e := new(agentv1.Envelope)
	if err := (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, e); err != nil {
		return nil, fmt.Errorf("decode envelope: %w: %w", err, ErrMalformed)
	}
	if err := Validate(e); err != nil {
		return nil, fmt.Errorf("decode envelope: %w", err)
	}
	return e, nil
}

// Encode validates e and marshals it deterministically (map entries sorted),
// so equal envelopes encode to equal bytes. A result larger than
// MaxEnvelopeBytes is refused with an error wrapping ErrTooLarge, because the
// receiver would refuse it too.
func Encode(e *agentv1.Envelope) ([]byte, error) {
	if err := Validate(e); err != nil {
		return nil, fmt.Errorf("encode envelope: %w", err)
	}
	b, err := (proto.MarshalOptions{Deterministic: true}).Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("encode envelope %s: %w", quoteID(e.GetId()), err)
	}
	if len(b) > MaxEnvelopeBytes {
		return nil, fmt.Errorf("encode envelope %s: %d bytes, more than %d: %w",
			quoteID(e.GetId()), len(b), MaxEnvelopeBytes, ErrTooLarge)
	}
	return b, nil
}

// NewID returns a random 128-bit id as 32 lowercase hex digits, from
// crypto/rand.
func NewID() string {
	var b [16]byte
	// crypto/rand.Read never returns an error (it crashes the program if the
	// system's randomness fails, since Go 1.24).
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
