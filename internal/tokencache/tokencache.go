// Package tokencache caches the answers of TokenReviews (and of other
// checks keyed by a secret), as kube-apiserver's webhook token
// authenticator caches them: callers that present the same bearer token
// again and again (`drover logs -f`, a hub registering hundreds of nodes a
// second through the signer) would otherwise cost one apiserver request
// per call. Keys are kept only as their SHA-256, so the cache holds nothing
// a reader could replay. It is bounded: a flood of distinct keys does not
// grow it.
//
// What it does not do: ask the API (its callers do), or refresh entries.
package tokencache

import (
	"crypto/sha256"
	"sync"
	"time"
)

const (
	// TTL is how long an accepted key is trusted without asking again: a
	// token revoked meanwhile is accepted for at most this long
	// (kube-apiserver's default for webhook tokens is 2 minutes).
	TTL = 30 * time.Second
	// NegativeTTL is how long a refused key stays refused without asking,
	// so that a caller retrying a bad token does not become a flood.
	NegativeTTL = 5 * time.Second
	// Size bounds the entries; when full, expired entries go first, then
	// all of them.
	Size = 4096
)

// Entry is a cached answer: Value when OK, else the refusal, returned
// again as it was first (its gRPC code included).
type Entry[V any] struct {
	Value V
	OK    bool
	Err   error

	expires time.Time
}

// Cache maps keys (bearer tokens) to answers. The zero value is not
// usable; call New.
type Cache[V any] struct {
	mu      sync.Mutex
	entries map[[sha256.Size]byte]Entry[V]
}

// New returns an empty cache.
func New[V any]() *Cache[V] {
	return &Cache[V]{entries: map[[sha256.Size]byte]Entry[V]{}}
}

// Get returns the cached answer for key, if one is still fresh at now.
func (c *Cache[V]) Get(key string, now time.Time) (Entry[V], bool) {
	k := sha256.Sum256([]byte(key))
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[k]
	if !ok || !now.Before(e.expires) {
		return Entry[V]{}, false
	}
	return e, true
}

// Accept caches v for key for TTL.
func (c *Cache[V]) Accept(key string, v V, now time.Time) {
	c.put(key, Entry[V]{Value: v, OK: true, expires: now.Add(TTL)}, now)
}

// Refuse caches a refusal of key, for reason, for NegativeTTL.
func (c *Cache[V]) Refuse(key string, err error, now time.Time) {
	c.put(key, Entry[V]{Err: err, expires: now.Add(NegativeTTL)}, now)
}

// Len is how many entries the cache holds, fresh or not.
func (c *Cache[V]) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

func (c *Cache[V]) put(key string, e Entry[V], now time.Time) {
	k := sha256.Sum256([]byte(key))
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= Size {
		for k, old := range c.entries {
			if !now.Before(old.expires) {
				delete(c.entries, k)
			}
		}
		if len(c.entries) >= Size {
			clear(c.entries)
		}
	}
	c.entries[k] = e
}
