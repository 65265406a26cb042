package protocol

import (
	"bytes"
	"errors"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

func TestEncodeThenDecodeGivesTheSameEnvelope(t *testing.T) {
	for name, e := range valid() {
		b, err := Encode(e)
		if err != nil {
			t.Fatalf("Encode(%s) = %v", name, err)
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("Decode(Encode(%s)) = %v", name, err)
		}
		if !proto.Equal(got, e) {
			t.Errorf("Decode(Encode(%s)) = %v, want %v", name, got, e)
		}
		again, _ := Encode(got)
		if !bytes.Equal(again, b) {
			t.Errorf("Encode(%s) is not deterministic", name)
		}
	}
}

func TestEncodeRefusesMalformed(t *testing.T) {
	e := NewHeartbeat("Bad_Node")
	if _, err := Encode(e); !errors.Is(err, ErrMalformed) || !strings.HasPrefix(err.Error(), "encode envelope: ") {
		t.Errorf("Encode(bad node) = %v, want \"encode envelope: ...\" wrapping ErrMalformed", err)
	}
}

func TestEncodeRefusesWhatTheReceiverWouldRefuse(t *testing.T) {
	items := make([]*agentv1.WorkItem, 3)
	for i := range items {
		items[i] = &agentv1.WorkItem{Uid: string(rune('a' + i)), Type: "noop", Spec: make([]byte, MaxSpecBytes)}
	}
	_, err := Encode(NewSnapshot("n", 1, items))
	if !errors.Is(err, ErrTooLarge) {
		t.Errorf("Encode(1.5 MiB snapshot) = %v, want ErrTooLarge", err)
	}
}

func TestDecodeChecksTheSizeBeforeParsing(t *testing.T) {
	b := make([]byte, MaxEnvelopeBytes+1) // all zeros: not even valid protobuf
	_, err := Decode(b)
	if !errors.Is(err, ErrTooLarge) || errors.Is(err, ErrMalformed) {
		t.Errorf("Decode(%d bytes) = %v, want ErrTooLarge only", len(b), err)
	}
}

func TestDecodeRejectsGarbageAndInvalidEnvelopes(t *testing.T) {
	hb, _ := Encode(valid()["heartbeat"])
	wrongKind := protowire.AppendTag(bytes.Clone(hb), 4, protowire.VarintType) // a later kind field wins
	wrongKind = protowire.AppendVarint(wrongKind, uint64(agentv1.Kind_KIND_STATUS))
	badUTF8 := protowire.AppendTag(nil, 1, protowire.BytesType)
	badUTF8 = protowire.AppendBytes(badUTF8, []byte{0xff, 0xfe})
	tests := []struct {
		name string
		in   []byte
		want string
	}{
		{"empty input", nil, "id is empty"},
		{"a truncated message", hb[:len(hb)-3], "decode envelope: proto"},
		{"a bad wire type", []byte{0x0f}, "decode envelope: proto"},
		{"invalid UTF-8 in a string", badUTF8, "invalid UTF-8"},
		{"a valid message with the wrong kind", wrongKind, "kind KIND_STATUS but payload is heartbeat"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode(tt.in)
			if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Decode(%s) = %v, want ErrMalformed containing %q", tt.name, err, tt.want)
			}
		})
	}
}

func TestDecodeDropsUnknownFields(t *testing.T) {
	hb, _ := Encode(valid()["heartbeat"])
	withUnknown := protowire.AppendTag(bytes.Clone(hb), 99, protowire.VarintType)
	withUnknown = protowire.AppendVarint(withUnknown, 1)
	e, err := Decode(withUnknown)
	if err != nil {
		t.Fatalf("Decode(heartbeat + field 99) = %v", err)
	}
	if len(e.ProtoReflect().GetUnknown()) != 0 {
		t.Errorf("Decode kept unknown fields %x", e.ProtoReflect().GetUnknown())
	}
}

func TestNewIDIs128BitHex(t *testing.T) {
	re := regexp.MustCompile(`^[0-9a-f]{32}$`)
	seen := map[string]bool{}
	for range 1000 {
		id := NewID()
		if !re.MatchString(id) {
			t.Fatalf("NewID() = %q, want 32 hex digits", id)
		}
		if seen[id] {
			t.Fatalf("NewID() repeated %q", id)
		}
		seen[id] = true
	}
}
