package protocol

import (
	"errors"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// FuzzDecode checks that Decode never panics, that every error it returns is
// classified (ErrMalformed or ErrTooLarge), and that whatever it accepts
// survives Encode and Decode unchanged.
func FuzzDecode(f *testing.F) {
	for _, e := range valid() {
		b, err := Encode(e)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	bad := valid()["dispatch"]
	bad.Kind = 1
	b, _ := proto.Marshal(bad)
	f.Add(b)
	f.Add([]byte{})
	f.Add([]byte{0x0f})
	f.Add([]byte{0x0a, 0x80}) // a length that never ends

	f.Fuzz(func(t *testing.T, in []byte) {
		e, err := Decode(in)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("Decode(%x) = %v, want ErrMalformed or ErrTooLarge", in, err)
			}
			return
		}
		out, err := Encode(e)
		if err != nil {
			t.Fatalf("Encode(Decode(%x)) = %v, want nil for an accepted envelope", in, err)
		}
		again, err := Decode(out)
		if err != nil {
			t.Fatalf("Decode(Encode(Decode(%x))) = %v", in, err)
		}
		if !proto.Equal(e, again) {
			t.Fatalf("round trip of %x changed the envelope:\n%v\nbecame\n%v", in, e, again)
		}
	})
}

// FuzzEncode builds envelopes field by field, so that the fuzzer reaches the
// accepting paths that random bytes rarely do, and checks that Encode and
// Decode agree with Validate: Encode accepts exactly what Validate accepts
// (below the size limit), and Decode accepts and reproduces what Encode
// produced.
func FuzzEncode(f *testing.F) {
	f.Add("id-1", "node-1", int32(6), uint64(4), uint8(6), "u1", "task", []byte(`{}`), "Running")
	f.Add("id-2", "node-1", int32(3), uint64(0), uint8(3), "ack-of", "", []byte(nil), "")
	f.Add("", "Node", int32(0), uint64(0), uint8(0), "", "", []byte(nil), "")
	f.Fuzz(func(t *testing.T, id, node string, kind int32, rev uint64, payload uint8, uid, typ string, spec []byte, text string) {
		var e *agentv1.Envelope
		item := &agentv1.WorkItem{Uid: uid, Type: typ, Spec: spec}
		ws := &agentv1.WorkStatus{Uid: uid, Phase: text, Reason: typ}
		switch payload % 10 {
		case 0:
			e = &agentv1.Envelope{}
		case 1:
			e = NewHeartbeat(node)
		case 2:
			e = NewNodeState(node, rev, &agentv1.NodeInfo{Labels: map[string]string{typ: text}}, []*agentv1.WorkStatus{ws})
		case 3:
			e = NewAck(node, uid)
		case 4:
			e = NewFullSyncRequest(node, rev)
		case 5:
			e = NewSnapshot(node, rev, []*agentv1.WorkItem{item})
		case 6:
			e = NewDispatch(node, rev, item)
		case 7:
			e = NewCancel(node, rev, uid)
		case 8:
			e = NewStatus(node, rev, ws)
		case 9:
			e = NewNodeConfiguration(node, &agentv1.NodeConfiguration{Hub: text})
		}
		e.Id, e.Node, e.Revision = id, node, rev
		if kind != 0 {
			e.Kind = agentv1.Kind(kind)
		}
		verr := Validate(e)
		out, err := Encode(e)
		switch {
		case verr != nil:
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Validate(%v) = %v but Encode = %v", e, verr, err)
			}
			return
		case errors.Is(err, ErrTooLarge):
			return
		case err != nil:
			// Only invalid UTF-8 in a string, which proto itself refuses,
			// may pass Validate and fail Marshal.
			if !utf8Invalid(id, node, uid, typ, text) {
				t.Fatalf("Encode(%v) = %v after Validate passed", e, err)
			}
			return
		}
		back, err := Decode(out)
		if err != nil {
			t.Fatalf("Decode(Encode(%v)) = %v", e, err)
		}
		if !proto.Equal(back, e) {
			t.Fatalf("Decode(Encode(e)) = %v, want %v", back, e)
		}
	})
}

func utf8Invalid(ss ...string) bool {
	for _, s := range ss {
		if !utf8.ValidString(s) {
			return true
		}
	}
	return false
}
