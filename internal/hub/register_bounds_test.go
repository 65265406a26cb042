package hub

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/drover-fleet/drover/internal/bootstrap"
	"github.com/drover-fleet/drover/internal/clock/clocktest"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/testenv"
)

// tokenGets counts the reads of bootstrap token Secrets through it.
type tokenGets struct {
	client.Client
	n atomic.Int64
}

func (c *tokenGets) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*corev1.Secret); ok && strings.HasPrefix(key.Name, "bootstrap-token-") {
		c.n.Add(1)
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

// registerHub is a hub that is not started: enough for Register calls that
// are refused before anything is signed.
func (f *fixture) registerHub(opts Options) *Hub {
	f.t.Helper()
	if opts.Client == nil {
		opts.Client = f.c
	}
	opts.Name, opts.Namespace, opts.Logger = "hub-register-bounds", f.ns, f.logger
	h, err := New(opts)
	if err != nil {
		f.t.Fatal(err)
	}
	return h
}

// from is ctx as a Register call from addr sees it.
func from(addr string) context.Context {
	return peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(addr), Port: 40000}})
}

// TestRegisterRefusesOversizedValuesUnlogged: a 1 MiB node name or token is
// refused with InvalidArgument, and neither the answer nor the hub's log
// carries it (it used to be logged twice and echoed back).
func TestRegisterRefusesOversizedValuesUnlogged(t *testing.T) {
	f := newFixture(t, "hub-register-oversized")
	// Unlimited: this test is about sizes, not rates.
	h := f.startHub(Options{Name: "hub-register-oversized", Features: feature(nil, &sink{}), RegisterRatePerSource: -1})
	_, csr, err := pki.NewKeyAndCSR("oversized-node")
	if err != nil {
		t.Fatal(err)
	}
	huge := strings.Repeat("a", 1<<20)
	for _, tc := range []struct {
		name string
		req  *agentv1.RegisterRequest
	}{
		{"a 1 MiB node name", &agentv1.RegisterRequest{Node: huge, BootstrapToken: f.token(), Csr: csr, Info: &agentv1.NodeInfo{}}},
		{"a 1 MiB node name with an uppercase letter", &agentv1.RegisterRequest{Node: "A" + huge, BootstrapToken: f.token(), Csr: csr, Info: &agentv1.NodeInfo{}}},
		{"a 1 MiB token", &agentv1.RegisterRequest{Node: "oversized-node", BootstrapToken: huge, Csr: csr, Info: &agentv1.NodeInfo{}}},
	} {
		before := len(f.logs.String())
		for range 50 {
			_, err := h.Register(from("192.0.2.10"), tc.req)
			if status.Code(err) != codes.InvalidArgument || len(err.Error()) > 512 {
				t.Fatalf("%s: %.600v; want InvalidArgument in a short message", tc.name, err)
			}
		}
		if grew := len(f.logs.String()) - before; grew > 64<<10 {
			t.Errorf("%s: 50 calls grew the hub's log by %d bytes, want it to carry at most a clipped prefix", tc.name, grew)
		}
	}
	if strings.Contains(f.logs.String(), strings.Repeat("a", 200)) {
		t.Error("the hub's log holds 200 bytes of an oversized value, want at most a clipped prefix")
	}
}

// TestUnknownTokensAreReadOncePerTTL: 200 calls with made-up tokens cost
// at most one read per distinct id per TokenNegativeTTL, not one each.
func TestUnknownTokensAreReadOncePerTTL(t *testing.T) {
	f := newFixture(t, "hub-register-unknown")
	clk := clocktest.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c := &tokenGets{Client: f.c}
	h := f.registerHub(Options{Client: c, Clock: clk, TokenNegativeTTL: 10 * time.Second})
	ids := []string{"aaaaaa", "bbbbbb", "cccccc", "dddddd", "eeeeee"}
	flood := func() {
		t.Helper()
		for i := range 200 {
			req := &agentv1.RegisterRequest{Node: "unknown-token-node", BootstrapToken: ids[i%len(ids)] + ".0123456789abcdef", Info: &agentv1.NodeInfo{}}
			if _, err := h.Register(context.Background(), req); status.Code(err) != codes.Unauthenticated {
				t.Fatalf("an unknown token: %v, want Unauthenticated", err)
			}
		}
	}
	flood()
	if n := c.n.Load(); n > int64(len(ids)) {
		t.Errorf("200 calls over %d unknown ids read %d token Secrets, want at most one per id", len(ids), n)
	}
	clk.Step(11 * time.Second)
	flood()
	if n := c.n.Load(); n > 2*int64(len(ids)) {
		t.Errorf("200 more calls after the TTL read %d token Secrets in all, want at most one more per id", n)
	}
}

// TestBadTokensGetOneError: an unknown id, a wrong secret, an expired token
// and a Secret of another type are refused alike, so that a caller cannot
// probe which ids exist.
func TestBadTokensGetOneError(t *testing.T) {
	f := newFixture(t, "hub-register-badtoken")
	h := f.registerHub(Options{})
	ctx := context.Background()
	good, err := bootstrap.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if err := bootstrap.Create(ctx, f.c, f.ns, good); err != nil {
		t.Fatal(err)
	}
	expired, err := bootstrap.Generate()
	if err != nil {
		t.Fatal(err)
	}
	past := time.Now().Add(-time.Hour)
	expired.Expires = &past
	if err := bootstrap.Create(ctx, f.c, f.ns, expired); err != nil {
		t.Fatal(err)
	}
	opaque, err := bootstrap.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.c.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: bootstrap.SecretName(opaque.ID)},
		Data:       map[string][]byte{bootstrap.KeyID: []byte(opaque.ID), bootstrap.KeySecret: []byte(opaque.Secret)},
	}); err != nil {
		t.Fatal(err)
	}
	want := status.New(codes.Unauthenticated, bootstrap.ErrNotValid.Error())
	for _, tc := range []struct{ name, token string }{
		{"unknown id", "zzzzzz.0123456789abcdef"},
		{"wrong secret", good.ID + ".0000000000000000"},
		{"expired", expired.String()},
		{"a Secret of another type", opaque.String()},
	} {
		_, err := h.Register(ctx, &agentv1.RegisterRequest{Node: "badtoken-node", BootstrapToken: tc.token, Info: &agentv1.NodeInfo{}})
		if got := status.Convert(err); got.Code() != want.Code() || got.Message() != want.Message() {
			t.Errorf("%s: %v, want %v", tc.name, err, want.Err())
		}
	}
}

// TestRegisterIsRateLimitedPerSource: past its burst one source is refused
// with ResourceExhausted and a retry hint, while another source is not;
// the source's bucket refills with time, and the overall limit holds too.
func TestRegisterIsRateLimitedPerSource(t *testing.T) {
	f := newFixture(t, "hub-register-rate")
	clk := clocktest.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	h := f.registerHub(Options{Clock: clk, RegisterRatePerSource: 1, RegisterBurstPerSource: 3, RegisterRate: 1, RegisterBurst: 8})
	// A malformed token: refused without a read, after the limits.
	req := &agentv1.RegisterRequest{Node: "rate-node", BootstrapToken: "malformed", Info: &agentv1.NodeInfo{}}
	call := func(addr string) error {
		_, err := h.Register(from(addr), req)
		return err
	}
	limited := func(what string, err error) {
		t.Helper()
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("%s: %v, want ResourceExhausted", what, err)
		}
		var hint time.Duration
		for _, d := range status.Convert(err).Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				hint = ri.GetRetryDelay().AsDuration()
			}
		}
		if hint < time.Second {
			t.Errorf("%s: retry hint %v, want at least 1s", what, hint)
		}
	}
	allowed := func(what string, err error) {
		t.Helper()
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("%s: %v, want it past the limits (InvalidArgument for its token)", what, err)
		}
	}
	for range 3 {
		allowed("a call within the source's burst", call("192.0.2.1"))
	}
	limited("a call past the source's burst", call("192.0.2.1"))
	allowed("another source", call("192.0.2.2"))
	// An IPv6 host holds its /64: another address in it is the same source.
	for range 3 {
		allowed("an IPv6 source within its burst", call("2001:db8::1"))
	}
	limited("another address in the same /64", call("2001:db8::2"))
	allowed("another /64", call("2001:db8:0:1::1"))
	clk.Step(time.Second)
	allowed("the first source a second later", call("192.0.2.1"))
	// The overall burst of 8 went to the 3+1+3+1 calls let through (a
	// refused call takes nothing), and its one refill to the call above.
	limited("a new source past the overall burst", call("192.0.2.3"))
}

// TestTokensAreReadFromTheCache: as `drover hub` runs it, with a manager's
// informer for Drover's Secrets as its Client, a token is found (a new one
// through the API once, if the informer has not seen it yet) and a flood of
// made-up tokens reads the API at most once per id.
func TestTokensAreReadFromTheCache(t *testing.T) {
	f := newFixture(t, "hub-register-cache")
	e := testenv.Require(t, env)
	informers, err := cache.New(e.Config, cache.Options{Scheme: f.c.Scheme(), ByObject: map[client.Object]cache.ByObject{
		&corev1.Secret{}: {Namespaces: map[string]cache.Config{f.ns: {}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = informers.Start(ctx) }()
	cached, err := client.New(e.Config, client.Options{Scheme: f.c.Scheme(), Cache: &client.CacheOptions{Reader: informers}})
	if err != nil {
		t.Fatal(err)
	}
	live := &tokenGets{Client: f.c}
	h := f.registerHub(Options{Client: cached, APIReader: live})
	_, csr, err := pki.NewKeyAndCSR("cached-token-node")
	if err != nil {
		t.Fatal(err)
	}
	tok, err := bootstrap.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if err := bootstrap.Create(ctx, f.c, f.ns, tok); err != nil {
		t.Fatal(err)
	}
	r, err := h.Register(ctx, &agentv1.RegisterRequest{Node: "cached-token-node", BootstrapToken: tok.String(), Csr: csr, Info: &agentv1.NodeInfo{}})
	if err != nil || r.GetResult() != agentv1.RegisterResponse_RESULT_PENDING {
		t.Fatalf("a valid token just created: %v, %v; want pending", r, err)
	}
	before := live.n.Load()
	for range 200 {
		req := &agentv1.RegisterRequest{Node: "cached-token-node", BootstrapToken: "zzzzzz.0123456789abcdef", Info: &agentv1.NodeInfo{}}
		if _, err := h.Register(ctx, req); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("an unknown token: %v, want Unauthenticated", err)
		}
	}
	if n := live.n.Load() - before; n > 1 {
		t.Errorf("200 calls with one unknown id read the API %d times, want at most once", n)
	}
}
