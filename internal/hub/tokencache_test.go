package hub

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestTokenCache(t *testing.T) {
	c := newTokenCache()
	now := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	alice := &user{name: "alice"}
	c.put("good", alice, "", now)
	c.put("bad", nil, "the bearer token is not valid", now)

	if e, ok := c.get("good", now.Add(tokenCacheTTL-time.Second)); !ok || e.user != alice {
		t.Fatalf("good token within its TTL: %v %v, want alice", e, ok)
	}
	if _, ok := c.get("good", now.Add(tokenCacheTTL)); ok {
		t.Fatal("good token past its TTL is still cached")
	}
	if e, ok := c.get("bad", now.Add(tokenCacheNegativeTTL-time.Second)); !ok || e.user != nil || e.reason == "" {
		t.Fatalf("bad token within its TTL: %v %v, want refused with a reason", e, ok)
	}
	if _, ok := c.get("bad", now.Add(tokenCacheNegativeTTL)); ok {
		t.Fatal("bad token past its negative TTL is still cached")
	}
	if _, ok := c.get("other", now); ok {
		t.Fatal("a token never seen is cached")
	}
	for k := range c.entries {
		if string(k[:]) == "good" {
			t.Fatal("the cache holds a token in clear")
		}
	}

	// A flood of distinct tokens does not grow it past its bound.
	for i := range 3 * tokenCacheSize {
		c.put(fmt.Sprint("flood-", i), nil, "no", now)
	}
	if n := len(c.entries); n > tokenCacheSize {
		t.Fatalf("%d entries, want at most %d", n, tokenCacheSize)
	}
}

func TestLogRequestsAreBounded(t *testing.T) {
	h := &Hub{opts: Options{Name: "hub-a"}, logReqs: map[string]*logRequest{}}
	for i := range maxLogRequestsPerNode {
		if err := h.addLogRequest(fmt.Sprint("a", i), &logRequest{node: "node-1"}); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	err := h.addLogRequest("one-more", &logRequest{node: "node-1"})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("request over the per-node bound: %v, want ResourceExhausted", err)
	}
	if err := h.addLogRequest("other", &logRequest{node: "node-2"}); err != nil {
		t.Fatalf("another node's request: %v", err)
	}
	for i := len(h.logReqs); i < maxLogRequests; i++ {
		h.logReqs[fmt.Sprint("f", i)] = &logRequest{node: fmt.Sprint("n", i)}
	}
	if err := h.addLogRequest("x", &logRequest{node: "node-3"}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("request over the hub's bound: %v, want ResourceExhausted", err)
	}
}
