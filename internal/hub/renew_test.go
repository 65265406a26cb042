package hub

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/clock/clocktest"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/testenv"
)

// renew calls Renew as n, for keyPEM (n's own key when nil).
func (n *rawNode) renew(t *testing.T, addr string, keyPEM []byte) (*agentv1.RenewResponse, error) {
	t.Helper()
	if keyPEM == nil {
		keyPEM = n.keyPEM
	}
	csr, err := pki.CSRForKey(keyPEM, n.name)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return n.client(t, addr, false).Renew(ctx, &agentv1.RenewRequest{Csr: csr})
}

// setNode changes node's spec as an operator would.
func (f *fixture) setNode(node string, change func(*fleetv1.FleetNode)) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	var n fleetv1.FleetNode
	if err := f.c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		f.t.Fatal(err)
	}
	before := n.DeepCopy()
	change(&n)
	if err := f.c.Patch(ctx, &n, client.MergeFrom(before)); err != nil {
		f.t.Fatal(err)
	}
}

// recordedExpiry is node's recorded certificate expiry (zero if none).
func (f *fixture) recordedExpiry(ctx context.Context, node string) (time.Time, error) {
	var n fleetv1.FleetNode
	if err := f.c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		return time.Time{}, err
	}
	if n.Status.CertificateExpiry == nil {
		return time.Time{}, nil
	}
	return n.Status.CertificateExpiry.Time, nil
}

func wantCode(t *testing.T, what string, err error, code codes.Code, want string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), want) {
		t.Errorf("%s: %v, want %v saying %q", what, err, code, want)
	}
}

// TestRenewChecks: Renew signs the caller's own key again, with a new
// expiry recorded on the FleetNode, and only while the node may connect.
func TestRenewChecks(t *testing.T) {
	f := newFixture(t, "renew-checks")
	clk := clocktest.New(time.Now())
	const validity = 3 * time.Hour
	h := f.startHub(Options{Name: "hub-a", Clock: clk, CertificateValidity: validity})
	n := f.registerRaw(h, "renew-1")

	other, _, err := pki.NewKeyAndCSR(n.name)
	if err != nil {
		t.Fatal(err)
	}
	_, err = n.renew(t, h.addr, other)
	wantCode(t, "renewal for another key", err, codes.InvalidArgument, "a node keeps its key")

	clk.Step(time.Hour)
	resp, err := n.renew(t, h.addr, nil)
	if err != nil {
		t.Fatalf("renew: %v", err)
	}
	cert, err := x509.ParseCertificate(resp.GetCertificate())
	if err != nil {
		t.Fatal(err)
	}
	if pki.KeyFingerprint(cert) != pki.KeyFingerprint(n.cert.Leaf) || cert.Subject.CommonName != n.name {
		t.Errorf("renewed certificate is for %s key %s, want %s key %s", cert.Subject.CommonName, pki.KeyFingerprint(cert), n.name, pki.KeyFingerprint(n.cert.Leaf))
	}
	if want := clk.Now().Add(validity); !cert.NotAfter.Equal(want.Truncate(time.Second)) && cert.NotAfter.Sub(want).Abs() > time.Second {
		t.Errorf("renewed certificate expires %v, want %v", cert.NotAfter, want)
	}
	if !cert.NotAfter.After(n.cert.Leaf.NotAfter) {
		t.Errorf("renewed certificate expires %v, not after the old one's %v", cert.NotAfter, n.cert.Leaf.NotAfter)
	}
	testenv.Eventually(t, waitTimeout, "the new expiry recorded", func(ctx context.Context) (bool, error) {
		x, err := f.recordedExpiry(ctx, n.name)
		return x.Equal(cert.NotAfter), err
	})

	_, err = n.renew(t, h.addr, nil)
	wantCode(t, "a second renewal within a minute", err, codes.ResourceExhausted, "retry in")

	clk.Step(time.Minute)
	f.setNode(n.name, func(fn *fleetv1.FleetNode) { fn.Spec.Approved = false })
	_, err = n.renew(t, h.addr, nil)
	wantRefused(t, "renewal of an unapproved node", err, "is not approved")

	clk.Step(time.Minute)
	f.setNode(n.name, func(fn *fleetv1.FleetNode) { fn.Spec.Revoked = true })
	_, err = n.renew(t, h.addr, nil)
	wantRefused(t, "renewal of a revoked node", err, "is revoked")

	// A listed key is refused even under a FleetNode that is not revoked.
	m := f.registerRaw(h, "renew-2")
	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	if err := RevokeKey(ctx, f.c, f.ns, pki.KeyFingerprint(m.cert.Leaf), RevokedKey{Node: m.name, Revoked: clk.Now(), Expires: clk.Now().Add(validity)}, clk.Now()); err != nil {
		t.Fatal(err)
	}
	_, err = m.renew(t, h.addr, nil)
	wantRefused(t, "renewal of a listed key", err, "was revoked")
	if got := h.counter(t, "drover_hub_certificate_renewals_total", codes.OK.String()); got != 1 {
		t.Errorf("renewals counted OK: %v, want 1", got)
	}
}

// waitAgentHello waits until node's agent has its stream's first message:
// a step of the fake clock before would end its wait for it.
func (f *fixture) waitAgentHello(node string) {
	f.t.Helper()
	testenv.Eventually(f.t, waitTimeout, "agent "+node+" connected", func(context.Context) (bool, error) {
		return strings.Contains(f.logs.String(), "msg=connected component=agent node="+node+" "), nil
	})
}

// sessionCert is the certificate of node's open stream on h, or nil.
func sessionCert(h *runningHub, node string) *x509.Certificate {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s := h.sessions[node]; s != nil {
		return s.cert
	}
	return nil
}

// TestAgentRenewsAndKeepsItsSession: an agent renews its certificate after
// two thirds of its lifetime; when the old one expires the hub closes the
// stream it opened with it, and the agent opens another with the new one.
func TestAgentRenewsAndKeepsItsSession(t *testing.T) {
	f := newFixture(t, "renew-agent")
	clk := clocktest.New(time.Now())
	const validity = 3 * time.Hour
	// Time jumps by hours here: nodes must not go offline meanwhile.
	h := f.startHub(Options{Name: "hub-a", Clock: clk, CertificateValidity: validity, OfflineTimeout: 10 * validity})
	const node = "renew-agent-1"
	opts := f.agentOpts(node, h, newRunner())
	opts.Clock = clk
	f.startAgent(opts)
	f.waitAgentHello(node)
	first := sessionCert(h, node)

	// Past two thirds of the lifetime and the most jitter (a thirtieth).
	clk.Step(validity*2/3 + validity/30 + time.Minute)
	testenv.Eventually(t, waitTimeout, "a renewed certificate's expiry recorded", func(ctx context.Context) (bool, error) {
		x, err := f.recordedExpiry(ctx, node)
		return x.After(first.NotAfter), err
	})

	clk.Step(validity / 3)
	testenv.Eventually(t, waitTimeout, "the agent connected with its renewed certificate", func(context.Context) (bool, error) {
		clk.Step(time.Second) // the agent's reconnect backoff
		c := sessionCert(h, node)
		return c != nil && c.NotAfter.After(first.NotAfter) && pki.KeyFingerprint(c) == pki.KeyFingerprint(first), nil
	})
	if !strings.Contains(f.logs.String(), "certificate expired") {
		t.Error("the hub did not log closing the stream of an expired certificate")
	}
}

// TestCARotation: after `drover ca rotate`, certificates of the old CA
// still connect, agents that trust only the old CA still trust hubs, and
// agents renew onto the new CA; after --finish, old-CA certificates are
// refused.
func TestCARotation(t *testing.T) {
	f := newFixture(t, "ca-rotation")
	clk := clocktest.New(time.Now())
	const validity = 3 * time.Hour
	h := f.startHub(Options{Name: "hub-a", Clock: clk, CertificateValidity: validity, OfflineTimeout: 10 * validity})
	old := f.registerRaw(h, "rotate-raw")
	old.now = clk.Now
	const node = "rotate-agent"
	opts := f.agentOpts(node, h, newRunner())
	opts.Clock = clk
	f.startAgent(opts)
	f.waitAgentHello(node)
	oldCA := h.trust.Load().Current

	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	if _, err := FinishCARotation(ctx, f.c, f.ns, clk.Now(), validity, false); err == nil || !strings.Contains(err.Error(), "no rotation to finish") {
		t.Errorf("finish without a rotation: %v", err)
	}
	rotated, err := RotateCA(ctx, f.c, f.ns, clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "the hub signs with the new CA", func(context.Context) (bool, error) {
		clk.Step(caRefresh)
		return h.trust.Load().Current.Equal(rotated.Current.Cert), nil
	})
	// old trusts only the old CA: the hub's new certificate reaches it
	// through the cross certificate; its old-CA certificate is accepted.
	if err := tryStream(t, old.client(t, h.addr, false)); err != nil {
		t.Fatalf("stream with an old-CA certificate, trusting only the old CA, after the rotation: %v", err)
	}
	resp, err := old.renew(t, h.addr, nil)
	if err != nil {
		t.Fatalf("renew after the rotation: %v", err)
	}
	if c, _ := x509.ParseCertificate(resp.GetCertificate()); c == nil || c.Issuer.CommonName != rotated.Current.Cert.Subject.CommonName {
		t.Errorf("renewed after the rotation by %v, want the new CA %s", c.Issuer, rotated.Current.Cert.Subject.CommonName)
	}
	if len(resp.GetPreviousCas()) != 1 || !oldCA.Equal(mustParse(t, resp.GetPreviousCas()[0])) {
		t.Errorf("previous CAs answered: %d, want the old CA", len(resp.GetPreviousCas()))
	}

	// The agent renews onto the new CA; its stream stays on the old
	// certificate for now.
	clk.Step(validity*2/3 + validity/30 + time.Minute)
	testenv.Eventually(t, waitTimeout, "the agent's renewed expiry recorded", func(ctx context.Context) (bool, error) {
		x, err := f.recordedExpiry(ctx, node)
		return x.After(old.cert.Leaf.NotAfter), err
	})

	if _, err := FinishCARotation(ctx, f.c, f.ns, rotated.Rotated.Add(validity/2), validity, false); err == nil || !strings.Contains(err.Error(), "--force") {
		t.Errorf("finish half a lifetime after the rotation: %v, want a refusal naming --force", err)
	}
	// Forced: old-CA certificates are still valid, and refused for their CA.
	dropped, err := FinishCARotation(ctx, f.c, f.ns, clk.Now(), validity, true)
	if err != nil || len(dropped) != 1 || !dropped[0].Equal(oldCA) {
		t.Fatalf("finish: %v, dropped %d", err, len(dropped))
	}
	testenv.Eventually(t, waitTimeout, "the hub no longer trusts the old CA", func(context.Context) (bool, error) {
		clk.Step(caRefresh)
		return len(h.trust.Load().Previous) == 0, nil
	})
	if err := tryStream(t, old.client(t, h.addr, false)); err == nil {
		t.Error("a valid certificate of the dropped CA opened a stream")
	}
	// The agent's stream, opened with its old-CA certificate, is closed;
	// it reconnects with the new CA's.
	testenv.Eventually(t, waitTimeout, "the agent connected with a certificate of the new CA", func(context.Context) (bool, error) {
		clk.Step(time.Second)
		c := sessionCert(h, node)
		return c != nil && c.Issuer.CommonName == rotated.Current.Cert.Subject.CommonName, nil
	})
	newPool := x509.NewCertPool()
	newPool.AddCert(rotated.Current.Cert)
	renewed := &rawNode{name: old.name, keyPEM: old.keyPEM, ca: newPool, now: clk.Now}
	if renewed.cert, err = tls.X509KeyPair(pki.EncodeCert(resp.GetCertificate()), old.keyPEM); err != nil {
		t.Fatal(err)
	}
	if err := tryStream(t, renewed.client(t, h.addr, false)); err != nil {
		t.Errorf("stream with a new-CA certificate after the rotation finished: %v", err)
	}
}

func mustParse(t *testing.T, der []byte) *x509.Certificate {
	t.Helper()
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
