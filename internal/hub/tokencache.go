package hub

import (
	"crypto/sha256"
	"sync"
	"time"
)

// TokenReview results are cached, as kube-apiserver's webhook token
// authenticator caches them: `drover logs -f` on many tasks, or a script
// polling logs, would otherwise cost one apiserver write per call. Tokens
// are kept only as their SHA-256, so the cache holds nothing a reader could
// replay.
const (
	// tokenCacheTTL is how long an authenticated token is trusted without
	// asking again: a token revoked meanwhile reads logs for at most this
	// long (kube-apiserver's default for webhook tokens is 2 minutes).
	tokenCacheTTL = 30 * time.Second
	// tokenCacheNegativeTTL is how long a refused token stays refused
	// without asking, so that a caller retrying a bad token does not
	// become a TokenReview flood.
	tokenCacheNegativeTTL = 5 * time.Second
	// tokenCacheSize bounds the entries; when full, expired entries go
	// first, then all of them (a flood of distinct tokens must not grow
	// the hub's memory).
	tokenCacheSize = 4096
)

type tokenEntry struct {
	user    *user // nil: refused
	reason  string
	expires time.Time
}

type tokenCache struct {
	mu      sync.Mutex
	entries map[[sha256.Size]byte]tokenEntry
}

func newTokenCache() *tokenCache {
	return &tokenCache{entries: map[[sha256.Size]byte]tokenEntry{}}
}

// get returns the cached answer for tok, if any is still fresh.
func (c *tokenCache) get(tok string, now time.Time) (tokenEntry, bool) {
	k := sha256.Sum256([]byte(tok))
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[k]
	if !ok || !now.Before(e.expires) {
		return tokenEntry{}, false
	}
	return e, true
}

// put caches u (nil: refused, for reason) for tok.
func (c *tokenCache) put(tok string, u *user, reason string, now time.Time) {
	ttl := tokenCacheTTL
	if u == nil {
		ttl = tokenCacheNegativeTTL
	}
	k := sha256.Sum256([]byte(tok))
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= tokenCacheSize {
		for k, e := range c.entries {
			if !now.Before(e.expires) {
				delete(c.entries, k)
			}
		}
		if len(c.entries) >= tokenCacheSize {
			clear(c.entries)
		}
	}
	c.entries[k] = tokenEntry{user: u, reason: reason, expires: now.Add(ttl)}
}
