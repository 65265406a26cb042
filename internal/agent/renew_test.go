package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/drover-fleet/drover/internal/clock/clocktest"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/store"
	"github.com/drover-fleet/drover/internal/testkit"
)

func TestRenewAt(t *testing.T) {
	from := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	life := 3 * time.Hour
	for _, c := range []struct {
		jitter float64
		want   time.Duration
	}{
		{0, 2*time.Hour - 6*time.Minute},
		{0.5, 2 * time.Hour},
		{0.999999, 2*time.Hour + 6*time.Minute},
	} {
		got := renewAt(from, from.Add(life), c.jitter).Sub(from)
		if (got - c.want).Abs() > time.Second {
			t.Errorf("renewAt with jitter %v: %v after issue, want %v", c.jitter, got, c.want)
		}
	}
}

func TestRenewWaitStopsAtExpiry(t *testing.T) {
	err := status.Error(codes.Unavailable, "down")
	if got := renewWait(err, time.Minute, time.Hour); got != time.Minute {
		t.Errorf("wait %v, want the backoff", got)
	}
	if got := renewWait(err, time.Minute, 10*time.Second); got != 10*time.Second {
		t.Errorf("wait %v, want the time left before expiry", got)
	}
}

// renewingAgent is a test agent on clk with a certificate of ca valid for
// life from now, and the request its key makes.
func renewingAgent(t *testing.T, clk *clocktest.Fake, issued time.Time, life time.Duration) (*Agent, *pki.CA, []byte) {
	t.Helper()
	a := newTestAgent(t, nil)
	a.opts.Clock = clk
	ca, err := pki.NewCA("test-ca", issued, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, csr, err := pki.NewKeyAndCSR("n1")
	if err != nil {
		t.Fatal(err)
	}
	der, err := ca.SignClientCSR(csr, "n1", issued, life)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.useIdentity(store.Identity{Node: "n1", KeyPEM: keyPEM, CertPEM: pki.EncodeCert(der), CAPEM: ca.CertPEM}); err != nil {
		t.Fatal(err)
	}
	return a, ca, csr
}

// TestRenewLoopRenewsAtTwoThirdsAndRetries: no renewal before two thirds
// of the lifetime (less the jitter), one after it (plus the jitter), a
// failed one retried after the backoff, and the next one timed by the new
// certificate.
func TestRenewLoopRenewsAtTwoThirdsAndRetries(t *testing.T) {
	clk := clocktest.New(time.Time{})
	const life = 3 * time.Hour
	a, ca, csr := renewingAgent(t, clk, clk.Now(), life)
	leaf := a.ident.cert.Load().Leaf
	var calls atomic.Int32
	a.ident.renew = func(ctx context.Context, _ string) error {
		if calls.Add(1) == 1 {
			return status.Error(codes.Unavailable, "hub down")
		}
		der, err := ca.SignClientCSR(csr, "n1", clk.Now(), life)
		if err != nil {
			return err
		}
		return a.changeIdentity(ctx, func(id *store.Identity) { id.CertPEM = pki.EncodeCert(der) })
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.renewLoop(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("renew loop: %v", err)
		}
	}()
	waiting := func() {
		t.Helper()
		wctx, wcancel := context.WithTimeout(ctx, testTimeout)
		defer wcancel()
		if err := clk.BlockUntilWaiters(wctx, 1); err != nil {
			t.Fatalf("the renew loop does not wait: %v", err)
		}
	}
	lifetime := leaf.NotAfter.Sub(leaf.NotBefore)
	waiting()
	clk.Step(leaf.NotBefore.Add(lifetime*2/3 - lifetime/30 - time.Second).Sub(clk.Now()))
	testkit.Never(t, testkit.ShortTimeout, func() string {
		if calls.Load() != 0 {
			return "renewed before two thirds of the lifetime (less the jitter)"
		}
		return ""
	})
	clk.Step(leaf.NotBefore.Add(lifetime*2/3 + lifetime/30 + time.Second).Sub(clk.Now()))
	testkit.Eventually(t, testTimeout, func() string {
		if n := calls.Load(); n != 1 {
			return fmt.Sprintf("renewals: %d, want 1", n)
		}
		return ""
	})
	waiting()
	clk.Step(renewRetryMin + renewRetryMin/4 + time.Second)
	testkit.Eventually(t, testTimeout, func() string {
		if c := a.ident.cert.Load().Leaf; calls.Load() != 2 || !c.NotAfter.After(leaf.NotAfter) {
			return "the failed renewal was not retried"
		}
		return ""
	})
	waiting() // for the new certificate's two thirds
	if n := calls.Load(); n != 2 {
		t.Errorf("renewals %d, want 2", n)
	}
	id, ok, err := a.db.Identity(ctx)
	if err != nil || !ok || string(id.CertPEM) != string(a.identity().CertPEM) {
		t.Errorf("the renewed certificate is not saved (%v, %v)", ok, err)
	}
}

// TestExpiredCertificateWithoutTokenStopsTheAgent: a certificate that
// expired while the agent was off cannot be renewed; without a bootstrap
// token the agent stops and says how to go on.
func TestExpiredCertificateWithoutTokenStopsTheAgent(t *testing.T) {
	clk := clocktest.New(time.Time{})
	a, _, _ := renewingAgent(t, clk, clk.Now().Add(-4*time.Hour), 3*time.Hour)
	a.ident.renew = func(context.Context, string) error {
		t.Error("renewed an expired certificate")
		return nil
	}
	err := a.renewLoop(context.Background())
	var fatal *FatalError
	if !errors.As(err, &fatal) || !strings.Contains(err.Error(), "drover token create") || !strings.Contains(err.Error(), "expired") {
		t.Errorf("renew loop: %v, want a FatalError saying the certificate expired and to create a token", err)
	}
}
