package protocol

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"
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
