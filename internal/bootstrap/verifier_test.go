package bootstrap

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/drover-fleet/drover/internal/clock/clocktest"
)

const ns = "drover-system"

// countingClient is a fake API holding objs whose Gets are counted.
func countingClient(t *testing.T, gets *atomic.Int64, objs ...client.Object) client.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			gets.Add(1)
			return c.Get(ctx, key, obj, opts...)
		},
	}).Build()
}

func tokenSecret(tok Token, typ corev1.SecretType) *corev1.Secret {
	data := map[string][]byte{KeyID: []byte(tok.ID), KeySecret: []byte(tok.Secret)}
	if tok.Expires != nil {
		data[KeyExpiration] = []byte(tok.Expires.UTC().Format(time.RFC3339))
	}
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: SecretName(tok.ID)}, Type: typ, Data: data}
}

// TestVerifyGivesOneErrorForEveryBadToken: an unknown id, a wrong secret,
// an expired token and a Secret of another type all say the same, so a
// caller cannot tell which ids exist; the reason stays for the log.
func TestVerifyGivesOneErrorForEveryBadToken(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	past := now.Add(-time.Hour)
	good := Token{ID: "abcdef", Secret: "0123456789abcdef"}
	expired := Token{ID: "expire", Secret: "0123456789abcdef", Expires: &past}
	other := Token{ID: "othert", Secret: "0123456789abcdef"}
	var gets atomic.Int64
	c := countingClient(t, &gets, tokenSecret(good, SecretType), tokenSecret(expired, SecretType), tokenSecret(other, corev1.SecretTypeOpaque))
	v := NewVerifier(VerifierOptions{Cached: c, Namespace: ns})
	if tok, err := v.Verify(context.Background(), good.String(), now); err != nil || tok.ID != good.ID {
		t.Fatalf("Verify(good) = %+v, %v", tok, err)
	}
	for _, tc := range []struct {
		name, token string
		reason      error
	}{
		{"unknown id", "zzzzzz.0123456789abcdef", ErrUnknown},
		{"wrong secret", good.ID + ".0000000000000000", ErrInvalid},
		{"expired", expired.String(), ErrExpired},
		{"another type of Secret", other.String(), ErrUnknown},
	} {
		_, err := v.Verify(context.Background(), tc.token, now)
		if !errors.Is(err, ErrNotValid) || !errors.Is(err, tc.reason) {
			t.Errorf("%s: %v, want ErrNotValid and %v", tc.name, err, tc.reason)
		}
		if err != nil && strings.Contains(err.Error(), tc.token[7:]) {
			t.Errorf("%s: %v shows the token's secret", tc.name, err)
		}
	}
}

// TestVerifyRefusesMalformedTokensUnread: a malformed or oversized token is
// refused before any read, and its error does not echo it.
func TestVerifyRefusesMalformedTokensUnread(t *testing.T) {
	var gets atomic.Int64
	v := NewVerifier(VerifierOptions{Cached: countingClient(t, &gets), Namespace: ns})
	for _, tok := range []string{"", "abcdef", "abcdef.0123456789abcdefg", strings.Repeat("a", 1<<20), "ABCDEF.0123456789abcdef"} {
		_, err := v.Verify(context.Background(), tok, time.Now())
		if !errors.Is(err, ErrMalformed) || len(err.Error()) > 200 {
			t.Errorf("Verify(%.30q) = %.300v, want a short ErrMalformed", tok, err)
		}
	}
	if n := gets.Load(); n != 0 {
		t.Errorf("%d reads for malformed tokens, want none", n)
	}
}

// TestVerifyCachesUnknownIDs: a flood of made-up ids costs one read per id
// and reader per NegativeTTL; a token that only the live reader holds yet
// (created a moment ago) is found.
func TestVerifyCachesUnknownIDs(t *testing.T) {
	clk := clocktest.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	fresh := Token{ID: "fresh1", Secret: "0123456789abcdef"}
	var cachedGets, liveGets atomic.Int64
	cached := countingClient(t, &cachedGets)
	live := countingClient(t, &liveGets, tokenSecret(fresh, SecretType))
	v := NewVerifier(VerifierOptions{Cached: cached, Live: live, Namespace: ns, NegativeTTL: 10 * time.Second, Clock: clk})
	ids := []string{"aaaaaa", "bbbbbb", "cccccc", "dddddd"}
	flood := func() {
		t.Helper()
		for i := range 200 {
			_, err := v.Verify(context.Background(), ids[i%len(ids)]+".0123456789abcdef", clk.Now())
			if !errors.Is(err, ErrNotValid) {
				t.Fatalf("unknown token: %v, want ErrNotValid", err)
			}
		}
	}
	flood()
	if c, l := cachedGets.Load(), liveGets.Load(); c != int64(len(ids)) || l != int64(len(ids)) {
		t.Errorf("200 calls over %d unknown ids read the cache %d and the API %d times, want once each", len(ids), c, l)
	}
	clk.Step(9 * time.Second)
	flood()
	if l := liveGets.Load(); l != int64(len(ids)) {
		t.Errorf("within the TTL the API was read %d times, want %d", l, len(ids))
	}
	clk.Step(2 * time.Second)
	flood()
	if l := liveGets.Load(); l != 2*int64(len(ids)) {
		t.Errorf("after the TTL the API was read %d times, want %d (once more per id)", l, 2*len(ids))
	}
	if tok, err := v.Verify(context.Background(), fresh.String(), clk.Now()); err != nil || tok.ID != fresh.ID {
		t.Errorf("a token only the API holds yet: %+v, %v; want it found", tok, err)
	}
}
