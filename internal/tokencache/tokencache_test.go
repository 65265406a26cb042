package tokencache

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestCache(t *testing.T) {
	c := New[string]()
	now := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	c.Accept("good", "alice", now)
	c.Refuse("bad", errors.New("the bearer token is not valid"), now)

	if e, ok := c.Get("good", now.Add(TTL-time.Second)); !ok || !e.OK || e.Value != "alice" {
		t.Fatalf("good token within its TTL: %+v %v, want alice", e, ok)
	}
	if _, ok := c.Get("good", now.Add(TTL)); ok {
		t.Fatal("good token past its TTL is still cached")
	}
	if e, ok := c.Get("bad", now.Add(NegativeTTL-time.Second)); !ok || e.OK || e.Err == nil {
		t.Fatalf("bad token within its TTL: %+v %v, want refused with a reason", e, ok)
	}
	if _, ok := c.Get("bad", now.Add(NegativeTTL)); ok {
		t.Fatal("bad token past its negative TTL is still cached")
	}
	if _, ok := c.Get("other", now); ok {
		t.Fatal("a token never seen is cached")
	}
	for k := range c.entries {
		if string(k[:]) == "good" {
			t.Fatal("the cache holds a token in clear")
		}
	}
	// A flood of distinct tokens does not grow it past its bound.
	for i := range 3 * Size {
		c.Refuse(fmt.Sprint("flood-", i), errors.New("no"), now)
	}
	if n := c.Len(); n > Size {
		t.Fatalf("%d entries, want at most %d", n, Size)
	}
}
