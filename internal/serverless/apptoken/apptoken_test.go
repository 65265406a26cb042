package apptoken

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestTokenLifecycle(t *testing.T) {
	now := time.Date(2026, 11, 29, 1, 0, 0, 0, time.UTC)
	tok, err := New("games", "sim.v2", time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	ns, app, id, err := Parse(tok.Value)
	if err != nil || ns != "games" || app != "sim.v2" || id != tok.ID {
		t.Fatalf("Parse = %q %q %q %v", ns, app, id, err)
	}
	ann := map[string]string{AnnotationKey(tok.ID): tok.AnnotationValue(), "other": "x"}
	if strings.Contains(tok.AnnotationValue(), tok.Value) {
		t.Fatal("the annotation holds the token itself, not its hash")
	}
	if err := Check(tok.Value, ann, now.Add(59*time.Minute)); err != nil {
		t.Fatalf("a fresh token: %v", err)
	}
	other, _ := New("games", "sim.v2", time.Hour, now)
	last := "A"
	if strings.HasSuffix(tok.Value, "A") {
		last = "B"
	}
	tests := []struct {
		name  string
		value string
		ann   map[string]string
		at    time.Time
	}{
		{"expired", tok.Value, ann, now.Add(time.Hour)},
		{"revoked", tok.Value, map[string]string{}, now},
		{"another token with a stored id", strings.Replace(other.Value, other.ID, tok.ID, 1), ann, now},
		{"one byte changed", tok.Value[:len(tok.Value)-1] + last, ann, now},
		{"not a token", "Bearer abc", ann, now},
		{"garbled stored value", tok.Value, map[string]string{AnnotationKey(tok.ID): "sha256=zz"}, now},
	}
	for _, tt := range tests {
		if err := Check(tt.value, tt.ann, tt.at); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Check = %v, want ErrInvalid", tt.name, err)
		}
	}
	if l := List(ann); len(l) != 1 || l[0].ID != tok.ID || !l[0].Expires.Equal(now.Add(time.Hour)) {
		t.Errorf("List = %+v", l)
	}
}

func TestNewRefusesBadTTL(t *testing.T) {
	for _, ttl := range []time.Duration{0, -time.Second, MaxTTL + time.Hour} {
		if _, err := New("a", "b", ttl, time.Now()); err == nil {
			t.Errorf("New with ttl %s: no error", ttl)
		}
	}
}
