package bootstrap

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/drover-fleet/drover/internal/clock"
)

// ErrNotValid is wrapped by every error Verifier.Verify returns for a token
// that is unknown, has another secret, has expired or is not a bootstrap
// token's Secret. Its message is the one to show a caller: it is the same
// for every such token, so a caller cannot tell which ids exist.
var ErrNotValid = errors.New("bootstrap token is not valid: it is unknown, wrong or expired; ask an operator for a new one (drover token create)")

// MaxTokenBytes bounds a token before it is parsed: "id.secret" is 23 bytes.
const MaxTokenBytes = 23

// DefaultNegativeTTL is how long an id that is not there is remembered as
// unknown.
const DefaultNegativeTTL = 10 * time.Second

// maxUnknown bounds the ids remembered as unknown; past it the oldest are
// forgotten (looked up again), so memory stays bounded under any flood.
const maxUnknown = 1 << 16

// VerifierOptions configure a Verifier.
type VerifierOptions struct {
	// Cached reads token Secrets; in a hub it is the manager's client,
	// whose informer holds the Drover namespace's Secrets. Required.
	Cached client.Reader
	// Live reads the API directly. A token Cached does not hold (one
	// created a moment ago) is looked up there once. Nil: Cached only.
	Live client.Reader
	// Namespace holds the tokens. Required.
	Namespace string
	// NegativeTTL is how long an id found in neither reader is refused
	// without another read. Default: DefaultNegativeTTL.
	NegativeTTL time.Duration
	// Clock times NegativeTTL. Default: the wall clock.
	Clock clock.Clock
}

// Verifier checks bootstrap tokens against their Secrets, reading as
// little of the API as it can: a flood of made-up ids costs at most one
// read per id per NegativeTTL.
type Verifier struct {
	opts VerifierOptions
	// group joins concurrent lookups of one id into one read.
	group singleflight.Group

	mu      sync.Mutex
	unknown map[string]time.Time // id → when it expires from the negative cache
}

// NewVerifier returns a Verifier.
func NewVerifier(opts VerifierOptions) *Verifier {
	if opts.NegativeTTL <= 0 {
		opts.NegativeTTL = DefaultNegativeTTL
	}
	opts.Clock = clock.Or(opts.Clock)
	return &Verifier{opts: opts, unknown: map[string]time.Time{}}
}

// Verify checks token's shape, finds its Secret and checks its secret (in
// constant time) and expiry at now. A token that is not there, not equal or
// expired gets an error wrapping ErrNotValid (and the reason, for the
// operator's log; the token's secret is never in it); a malformed one
// wraps ErrMalformed and does not echo it; any other error is the API's.
func (v *Verifier) Verify(ctx context.Context, token string, now time.Time) (Token, error) {
	if len(token) > MaxTokenBytes {
		return Token{}, ErrMalformed
	}
	id, secret, err := Parse(token)
	if err != nil {
		return Token{}, err
	}
	s, err := v.lookup(ctx, id)
	if err != nil {
		return Token{}, err
	}
	if s == nil || s.Type != SecretType || string(s.Data[KeyID]) != id {
		return Token{}, fmt.Errorf("token %s: %w: %w", id, ErrUnknown, ErrNotValid)
	}
	if subtle.ConstantTimeCompare(s.Data[KeySecret], []byte(secret)) != 1 {
		return Token{}, fmt.Errorf("token %s: %w: %w", id, ErrInvalid, ErrNotValid)
	}
	tok := Token{ID: id, Secret: secret, AutoApprove: string(s.Data[KeyAutoApprove]) == "true", Description: string(s.Data[KeyDescription])}
	if exp, ok := s.Data[KeyExpiration]; ok {
		t, err := time.Parse(time.RFC3339, string(exp))
		if err != nil {
			return Token{}, fmt.Errorf("token %s: expiration %q is not RFC 3339: %w: %w", id, exp, ErrInvalid, ErrNotValid)
		}
		tok.Expires = &t
		if !now.Before(t) {
			return Token{}, fmt.Errorf("token %s expired at %s: %w: %w", id, t.UTC().Format(time.RFC3339), ErrExpired, ErrNotValid)
		}
	}
	return tok, nil
}

// lookup returns id's Secret, or nil when there is none.
func (v *Verifier) lookup(ctx context.Context, id string) (*corev1.Secret, error) {
	if v.knownUnknown(id) {
		return nil, nil
	}
	s, err, _ := v.group.Do(id, func() (any, error) {
		key := client.ObjectKey{Namespace: v.opts.Namespace, Name: SecretName(id)}
		readers := []client.Reader{v.opts.Cached}
		if v.opts.Live != nil {
			readers = append(readers, v.opts.Live)
		}
		for _, r := range readers {
			var s corev1.Secret
			err := r.Get(ctx, key, &s)
			if err == nil {
				return &s, nil
			}
			if !apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("look up bootstrap token %s: %w", id, err)
			}
		}
		v.remember(id)
		return (*corev1.Secret)(nil), nil
	})
	if err != nil {
		return nil, err
	}
	return s.(*corev1.Secret), nil
}

// knownUnknown reports whether id was found missing less than NegativeTTL ago.
func (v *Verifier) knownUnknown(id string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	until, ok := v.unknown[id]
	if ok && v.opts.Clock.Now().Before(until) {
		return true
	}
	delete(v.unknown, id)
	return false
}

// remember records id as unknown for NegativeTTL.
func (v *Verifier) remember(id string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	now := v.opts.Clock.Now()
	if len(v.unknown) >= maxUnknown {
		for k, until := range v.unknown {
			if !now.Before(until) {
				delete(v.unknown, k)
			}
		}
		// Still full: forget any, as a map's order has it; they are only
		// looked up once more.
		for k := range v.unknown {
			if len(v.unknown) < maxUnknown {
				break
			}
			delete(v.unknown, k)
		}
	}
	v.unknown[id] = now.Add(v.opts.NegativeTTL)
}
