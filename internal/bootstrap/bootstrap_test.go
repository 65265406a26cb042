package bootstrap

import (
	"errors"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in      string
		wantErr bool
	}{
		{"abcdef.0123456789abcdef", false},
		{"abcdef.0123456789abcde", true},
		{"ABCDEF.0123456789abcdef", true},
		{"abcdef.0123456789abcdef; rm -rf /", true},
		{"", true},
	}
	for _, tt := range tests {
		_, _, err := Parse(tt.in)
		if (err != nil) != tt.wantErr {
			t.Errorf("Parse(%q) = %v, wantErr %v", tt.in, err, tt.wantErr)
		}
		if err != nil && !errors.Is(err, ErrMalformed) {
			t.Errorf("Parse(%q) = %v, want ErrMalformed", tt.in, err)
		}
	}
}

func TestGenerateParses(t *testing.T) {
	for range 100 {
		tok, err := Generate()
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := Parse(tok.String()); err != nil {
			t.Fatalf("Parse(Generate() = %q) = %v", tok, err)
		}
	}
}
