package hub

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/testenv"
)

// deleteNode deletes node's FleetNode and waits until it is gone.
func (f *fixture) deleteNode(node string) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	if err := f.c.Delete(ctx, &fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
		f.t.Fatal(err)
	}
	testenv.Eventually(f.t, waitTimeout, "FleetNode "+node+" deleted", func(ctx context.Context) (bool, error) {
		err := f.c.Get(ctx, client.ObjectKey{Name: node}, &fleetv1.FleetNode{})
		return apierrors.IsNotFound(err), nil
	})
}

// forgeCert returns node's certificate for a fresh key, signed by the
// fixture's CA as a hub signs one: valid, but for a key node never
// registered with (a certificate kept from another registration).
func (f *fixture) forgeCert(node string) *rawNode {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	var s corev1.Secret
	if err := f.c.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: CASecretName}, &s); err != nil {
		f.t.Fatal(err)
	}
	ca, err := pki.ParseCA(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		f.t.Fatal(err)
	}
	keyPEM, csr, err := pki.NewKeyAndCSR(node)
	if err != nil {
		f.t.Fatal(err)
	}
	der, err := ca.SignClientCSR(csr, node, time.Now(), time.Hour)
	if err != nil {
		f.t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(pki.EncodeCert(der), keyPEM)
	if err != nil {
		f.t.Fatal(err)
	}
	return &rawNode{name: node, cert: cert, ca: f.caPool()}
}

func (f *fixture) caPool() *x509.CertPool {
	f.t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(f.caPEM()) {
		f.t.Fatal("no CA certificate")
	}
	return pool
}

// tryRegister calls Register for node with csr and a fresh auto-approving
// token.
func (f *fixture) tryRegister(h *runningHub, node string, csr []byte) (*agentv1.RegisterResponse, error) {
	f.t.Helper()
	conn := dialRaw(f.t, h.addr, &tls.Config{RootCAs: f.caPool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13})
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return agentv1.NewAgentHubClient(conn).Register(ctx, &agentv1.RegisterRequest{Node: node, BootstrapToken: f.token(), Csr: csr})
}

// registerKey is registerRaw with a key the test keeps.
func (f *fixture) registerKey(h *runningHub, node string, keyPEM, csr []byte) *rawNode {
	f.t.Helper()
	resp, err := f.tryRegister(h, node, csr)
	if err != nil {
		f.t.Fatalf("register %s: %v", node, err)
	}
	if resp.GetResult() != agentv1.RegisterResponse_RESULT_APPROVED {
		f.t.Fatalf("register %s: %v %s", node, resp.GetResult(), resp.GetMessage())
	}
	cert, err := tls.X509KeyPair(pki.EncodeCert(resp.GetCertificate()), keyPEM)
	if err != nil {
		f.t.Fatal(err)
	}
	return &rawNode{name: node, cert: cert, ca: f.caPool()}
}

// tryStream opens a stream with c and returns the status it ends with
// at once, or nil if it stays open (it is then closed at cleanup).
func tryStream(t *testing.T, c agentv1.AgentHubClient) error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := c.GetMessage(ctx, &agentv1.GetMessageRequest{})
	if err != nil {
		return err
	}
	// A stream the hub accepts starts with the node's configuration.
	if _, err := stream.Recv(); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("stream ended without a status")
		}
		return err
	}
	return nil
}

// wantRefused checks err is a PermissionDenied whose message has want.
func wantRefused(t *testing.T, what string, err error, want string) {
	t.Helper()
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), want) {
		t.Errorf("%s: %v, want PermissionDenied saying %q", what, err, want)
	}
}

// TestOldCertificateOfARevokedAndReRegisteredNodeIsRefused is attack 3 of
// issue 15: node-2 is revoked, its FleetNode deleted, a new machine
// registers as node-2; the old certificate (still valid) must neither open
// a stream nor take the new machine's session over, nor send as it.
func TestOldCertificateOfARevokedAndReRegisteredNodeIsRefused(t *testing.T) {
	f := newFixture(t, "identity-attack")
	h := f.startHub(Options{Name: "hub-a"})
	const node = "identity-node-2"
	old := f.registerRaw(h, node)
	streamEnvelopes(t, h, old.client(t, h.addr, false), node)

	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	if listed, err := RevokeNode(ctx, f.c, f.ns, node, time.Now()); err != nil || !listed {
		t.Fatalf("RevokeNode = %v, %v; want its key listed", listed, err)
	}
	testenv.Eventually(t, waitTimeout, "revoked node's stream closed", func(context.Context) (bool, error) {
		return !h.Connected(node), nil
	})
	f.deleteNode(node)

	// A new machine takes the name and connects.
	fresh := f.registerRaw(h, node)
	envs := streamEnvelopes(t, h, fresh.client(t, h.addr, false), node)
	nextOfKind(t, envs, agentv1.Kind_KIND_NODE_CONFIGURATION)
	s := h.session(t, node)

	// The old certificate: no stream, no takeover, no message.
	oldClient := old.client(t, h.addr, false)
	wantRefused(t, "stream with the old certificate", tryStream(t, oldClient), "was revoked")
	cctx, ccancel := context.WithTimeout(context.Background(), callTimeout)
	defer ccancel()
	_, err := oldClient.SendMessage(cctx, protocol.NewHeartbeat(node))
	wantRefused(t, "heartbeat with the old certificate", err, "does not match the key node "+node+" registered with")
	if got := h.session(t, node); got != s {
		t.Fatal("the old certificate replaced the new machine's session")
	}
	select {
	case <-s.done:
		t.Fatal("the new machine's session was closed")
	default:
	}
	// The new machine still talks to the hub.
	if _, err := fresh.client(t, h.addr, false).SendMessage(cctx, protocol.NewHeartbeat(node)); err != nil {
		t.Errorf("heartbeat of the new machine: %v", err)
	}
	// One stream per node: the registered key's new stream (a reconnect
	// after a cut) replaces its old one.
	if err := tryStream(t, fresh.client(t, h.addr, false)); err != nil {
		t.Fatalf("a second stream with the registered key: %v", err)
	}
	select {
	case <-s.done:
	case <-time.After(waitTimeout):
		t.Fatal("the registered key's new stream did not replace its old one")
	}
}

// TestCertificateForAnotherKeyIsRefused: a certificate the CA signed for
// node, but for a key the node's FleetNode was not registered with, opens
// no stream, even with no other stream open.
func TestCertificateForAnotherKeyIsRefused(t *testing.T) {
	f := newFixture(t, "identity-key")
	h := f.startHub(Options{Name: "hub-a"})
	const node = "identity-key-1"
	f.registerRaw(h, node)
	other := f.forgeCert(node)
	wantRefused(t, "stream with another key's certificate", tryStream(t, other.client(t, h.addr, false)),
		"certificate key does not match the key node "+node+" registered with; the node was re-registered by another machine")
	if h.Connected(node) {
		t.Error("a certificate for another key opened the node's stream")
	}
}

// TestRevokedKeyStaysRefused: once revoked, a key is refused though its
// FleetNode is deleted: registering it again is refused, and so is a
// stream under a FleetNode created with it by other means.
func TestRevokedKeyStaysRefused(t *testing.T) {
	f := newFixture(t, "identity-list")
	h := f.startHub(Options{Name: "hub-a"})
	const node = "identity-list-1"
	keyPEM, csr, err := pki.NewKeyAndCSR(node)
	if err != nil {
		t.Fatal(err)
	}
	n := f.registerKey(h, node, keyPEM, csr)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	if _, err := RevokeNode(ctx, f.c, f.ns, node, time.Now()); err != nil {
		t.Fatal(err)
	}
	f.deleteNode(node)

	// The same machine registers again with its old key.
	_, err = f.tryRegister(h, node, csr)
	wantRefused(t, "registering a revoked key again", err, "was revoked")

	// An administrator re-creates the FleetNode with the old key, approved.
	key, _ := pki.CSRKeyFingerprint(csr)
	if err := f.c.Create(ctx, &fleetv1.FleetNode{
		ObjectMeta: metav1.ObjectMeta{Name: node, Annotations: map[string]string{fleetv1.AnnotationRegistrationKey: key}},
		Spec:       fleetv1.FleetNodeSpec{Approved: true},
	}); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, "stream with a revoked key", tryStream(t, n.client(t, h.addr, false)), "was revoked")
}

// TestRevokedWithKubectlIsListed: spec.revoked set without `drover revoke`
// puts the key on the list too (the hub lists it), so deleting the
// FleetNode does not readmit it.
func TestRevokedWithKubectlIsListed(t *testing.T) {
	f := newFixture(t, "identity-kubectl")
	h := f.startHub(Options{Name: "hub-a"})
	const node = "identity-kubectl-1"
	keyPEM, csr, err := pki.NewKeyAndCSR(node)
	if err != nil {
		t.Fatal(err)
	}
	f.registerKey(h, node, keyPEM, csr)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	var fn fleetv1.FleetNode
	if err := f.c.Get(ctx, client.ObjectKey{Name: node}, &fn); err != nil {
		t.Fatal(err)
	}
	before := fn.DeepCopy()
	fn.Spec.Revoked = true
	if err := f.c.Patch(ctx, &fn, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	key := fn.Annotations[fleetv1.AnnotationRegistrationKey]
	testenv.Eventually(t, waitTimeout, "the revoked node's key listed", func(ctx context.Context) (bool, error) {
		_, listed, err := h.revokedKey(ctx, key)
		return listed, err
	})
	f.deleteNode(node)
	_, err = f.tryRegister(h, node, csr)
	wantRefused(t, "registering a key revoked with kubectl", err, "was revoked")
}

// TestAdmitKey: what the embedded broker is told at a node's connect.
func TestAdmitKey(t *testing.T) {
	f := newFixture(t, "identity-admit")
	h := f.startHub(Options{Name: "hub-a"})
	const node = "identity-admit-1"
	keyPEM, csr, err := pki.NewKeyAndCSR(node)
	if err != nil {
		t.Fatal(err)
	}
	f.registerKey(h, node, keyPEM, csr)
	key, _ := pki.CSRKeyFingerprint(csr)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	if err := h.AdmitKey(ctx, node, key); err != nil {
		t.Errorf("the registered key: %v", err)
	}
	wantRefused(t, "another key", h.AdmitKey(ctx, node, strings.Repeat("0", 64)), "does not match the key node "+node+" registered with")
	if _, err := RevokeNode(ctx, f.c, f.ns, node, time.Now()); err != nil {
		t.Fatal(err)
	}
	// Revoked, FleetNode still there: admitted to hear why at its hello.
	testenv.Eventually(t, waitTimeout, "revoked node's key admitted", func(ctx context.Context) (bool, error) {
		return h.AdmitKey(ctx, node, key) == nil, nil
	})
	f.deleteNode(node)
	wantRefused(t, "a revoked key without its FleetNode", h.AdmitKey(ctx, node, key), "was revoked")
	if err := h.AdmitKey(ctx, "identity-admit-never", strings.Repeat("1", 64)); err != nil {
		t.Errorf("an unlisted key of a node without a FleetNode (its hello says to register): %v", err)
	}
}
