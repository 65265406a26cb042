package signer_test

// Integration tests of the signer against a real kube-apiserver (testenv):
// its checks of node requests, its callers' authentication and access,
// and a hub that signs through it over gRPC on loopback.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/bootstrap"
	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/manager"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/signer"
	"github.com/drover-fleet/drover/internal/testenv"
	"github.com/drover-fleet/drover/internal/testkit"
)

// Named timeouts: every wait is bounded by one.
const (
	waitTimeout = 30 * time.Second
	stopTimeout = 10 * time.Second
)

var env *testenv.Env

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	var stop func()
	env, stop = testenv.StartMain(testenv.Options{Scheme: manager.Scheme()})
	testkit.VerifyNoLeaksAfter(m, stop)
}

// fixture is one test's namespace, its running signer (in a manager, with
// its cache), and its logs.
type fixture struct {
	t    testing.TB
	ns   string
	svc  *signer.Service
	addr string
	log  *slog.Logger
}

func newFixture(t testing.TB, ns string, opts ...func(*signer.Options)) *fixture {
	t.Helper()
	e := testenv.Require(t, env)
	ctx := context.Background()
	if err := hub.EnsureNamespace(ctx, e.Client, ns); err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, ns: ns, log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	// As the manager runs it: reads from an informer cache, as
	// restricted as `drover manager`'s.
	mgr, err := ctrl.NewManager(e.Config, ctrl.Options{Scheme: manager.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"},
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&corev1.Secret{}: {Namespaces: map[string]cache.Config{ns: {}}},
			&corev1.ConfigMap{}: {Namespaces: map[string]cache.Config{ns: {}},
				Field: fields.OneTermEqualSelector("metadata.name", hub.RevokedKeysName)},
		}}})
	if err != nil {
		t.Fatal(err)
	}
	o := signer.Options{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Informers: mgr.GetCache(),
		Namespace: ns, BindAddress: "127.0.0.1:0", Hosts: []string{"127.0.0.1"}, CertificateValidity: time.Hour, Logger: f.log}
	for _, opt := range opts {
		opt(&o)
	}
	svc, err := signer.New(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := mgr.Add(svc); err != nil {
		t.Fatal(err)
	}
	f.svc = svc
	f.run("manager", mgr.Start)
	wctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	a, err := svc.Addr(wctx)
	if err != nil {
		t.Fatalf("the signer did not start: %v", err)
	}
	f.addr = a.String()
	return f
}

// run runs start until the test ends.
func (f *fixture) run(name string, start func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- start(ctx) }()
	f.t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				f.t.Errorf("%s: %v", name, err)
			}
		case <-time.After(stopTimeout):
			f.t.Errorf("%s did not stop within %v", name, stopTimeout)
		}
	})
}

// node creates a FleetNode registered with key (hex SHA-256), approved or
// not.
func (f *fixture) node(name, key string, approved bool) {
	f.t.Helper()
	n := &fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{fleetv1.AnnotationRegistrationKey: key}},
		Spec: fleetv1.FleetNodeSpec{Approved: approved}}
	if err := env.Client.Create(context.Background(), n); err != nil {
		f.t.Fatal(err)
	}
}

// csr is a new key's request for node, and the key's fingerprint.
func csr(t testing.TB, node string) (keyPEM, der []byte, key string) {
	t.Helper()
	keyPEM, der, err := pki.NewKeyAndCSR(node)
	if err != nil {
		t.Fatal(err)
	}
	key, err = pki.CSRKeyFingerprint(der)
	if err != nil {
		t.Fatal(err)
	}
	return keyPEM, der, key
}

// hubToken is the bearer token of a new ServiceAccount in the fixture's
// namespace, allowed to use the signer when mayCall.
func (f *fixture) hubToken(name string, mayCall bool) string {
	f.t.Helper()
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		f.t.Fatal(err)
	}
	if err := env.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name}}); err != nil {
		f.t.Fatal(err)
	}
	if mayCall {
		role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: f.ns + "-" + name},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{fleetv1.GroupVersion.Group}, Resources: []string{"fleetnodes/certificate"}, Verbs: []string{"create"}}}}
		binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role.Name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: f.ns, Name: name}}}
		for _, o := range []client.Object{role, binding} {
			if err := env.Client.Create(ctx, o); err != nil {
				f.t.Fatal(err)
			}
		}
	}
	tr, err := cs.CoreV1().ServiceAccounts(f.ns).CreateToken(ctx, name,
		&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return tr.Status.Token
}

// client is a hub's remote signer client with token.
func (f *fixture) client(hubName, token string) *signer.Client {
	f.t.Helper()
	c, err := signer.NewClient(signer.ClientOptions{Address: f.addr, Hub: hubName, Reader: env.Client, Namespace: f.ns,
		Token: func() (string, error) { return token, nil }})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := c.Trust(ctx); err != nil {
		f.t.Fatalf("read the CA bundle: %v", err)
	}
	return c
}

func TestSignerRefusesWhatTheNodeDoesNotAllow(t *testing.T) {
	f := newFixture(t, "signer-checks")
	ctx := context.Background()
	s := f.client("hub-a", f.hubToken("hub", true))

	_, okCSR, okKey := csr(t, "checks-ok")
	f.node("checks-ok", okKey, true)
	_, pendingCSR, pendingKey := csr(t, "checks-pending")
	f.node("checks-pending", pendingKey, false)
	_, _, otherKey := csr(t, "checks-other")
	_, otherCSR, _ := csr(t, "checks-other")
	f.node("checks-other", otherKey, true)
	_, revokedCSR, revokedKey := csr(t, "checks-revoked")
	f.node("checks-revoked", revokedKey, true)
	now := time.Now()
	if err := hub.RevokeKey(ctx, env.Client, f.ns, revokedKey,
		hub.RevokedKey{Node: "checks-revoked", Revoked: now, Expires: now.Add(time.Hour)}, now); err != nil {
		t.Fatal(err)
	}
	_, flaggedCSR, flaggedKey := csr(t, "checks-flagged")
	f.node("checks-flagged", flaggedKey, true)
	n := &fleetv1.FleetNode{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "checks-flagged"}, n); err != nil {
		t.Fatal(err)
	}
	n.Spec.Revoked = true
	if err := env.Client.Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	_, ghostCSR, _ := csr(t, "checks-ghost")

	for _, c := range []struct {
		name, node string
		csr        []byte
		want       codes.Code
	}{
		{"an approved node, its registered key", "checks-ok", okCSR, codes.OK},
		{"a node not approved", "checks-pending", pendingCSR, codes.PermissionDenied},
		{"another key than the registered one", "checks-other", otherCSR, codes.PermissionDenied},
		{"a key on the revocation list", "checks-revoked", revokedCSR, codes.PermissionDenied},
		{"a revoked node", "checks-flagged", flaggedCSR, codes.PermissionDenied},
		{"a node that is not registered", "checks-ghost", ghostCSR, codes.PermissionDenied},
		{"a request for another name than the node", "checks-ok", pendingCSR, codes.PermissionDenied},
	} {
		t.Run(c.name, func(t *testing.T) {
			// Both ways in: a remote hub, and a hub in the manager's process.
			for way, sign := range map[string]hub.Signer{"remote": s, "local": f.svc.Local()} {
				der, err := sign.SignNode(ctx, c.csr, c.node)
				if got := status.Code(err); got != c.want {
					t.Fatalf("%s: SignNode(%s) = %v (%v), want %v", way, c.node, got, err, c.want)
				}
				if c.want != codes.OK {
					if der != nil {
						t.Fatalf("%s: refused, yet a certificate came back", way)
					}
					continue
				}
				cert, err := x509.ParseCertificate(der)
				if err != nil || cert.Subject.CommonName != c.node || cert.NotAfter.After(time.Now().Add(time.Hour+time.Minute)) {
					t.Fatalf("%s: certificate %v (%v): want one for %s valid an hour (the signer's validity)", way, cert, err, c.node)
				}
			}
		})
	}
}

func TestSignerAuthenticatesAndAuthorizesCallers(t *testing.T) {
	f := newFixture(t, "signer-access")
	ctx := context.Background()
	_, der, key := csr(t, "access-node")
	f.node("access-node", key, true)

	// An account without fleetnodes/certificate, and a made-up token.
	for name, token := range map[string]string{"no access": f.hubToken("other", false), "a bad token": "not-a-token"} {
		c := f.client("hub-x", token)
		if _, err := c.SignNode(ctx, der, "access-node"); status.Code(err) != codes.PermissionDenied && status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s: SignNode = %v, want refused", name, err)
		}
		if _, err := c.VerifyToken(ctx, "abcdef.0123456789abcdef"); err == nil || errors.Is(err, bootstrap.ErrNotValid) {
			t.Errorf("%s: VerifyToken = %v, want refused as a caller", name, err)
		}
	}

	c := f.client("hub-x", f.hubToken("hub", true))
	if _, err := c.SignNode(ctx, der, "access-node"); err != nil {
		t.Fatalf("a hub with access: SignNode = %v", err)
	}
	tok, err := bootstrap.Generate()
	if err != nil {
		t.Fatal(err)
	}
	tok.AutoApprove, tok.Description = true, "signer test"
	if err := bootstrap.Create(ctx, env.Client, f.ns, tok); err != nil {
		t.Fatal(err)
	}
	got, err := c.VerifyToken(ctx, tok.String())
	if err != nil || got.ID != tok.ID || !got.AutoApprove || got.Description != "signer test" {
		t.Fatalf("VerifyToken(a good token) = %+v, %v", got, err)
	}
	if _, err := c.VerifyToken(ctx, tok.ID+".0000000000000000"); !errors.Is(err, bootstrap.ErrNotValid) {
		t.Errorf("VerifyToken(a wrong secret) = %v, want ErrNotValid", err)
	}
	if _, err := c.VerifyToken(ctx, "nope"); !errors.Is(err, bootstrap.ErrMalformed) {
		t.Errorf("VerifyToken(malformed) = %v, want ErrMalformed", err)
	}
	// Hub certificates: the name is the signer's, the hosts the hub's.
	_, hubCSR, _ := csr(t, "whatever")
	chain, err := c.SignHub(ctx, hub.HubCertRequest{Hub: "hub-x", Kind: hub.HubServing, CSR: hubCSR, Hosts: []string{"127.0.0.1", "hub.example"}})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(chain[0])
	if err != nil || leaf.Subject.CommonName != "drover-hub-hub-x" || leaf.VerifyHostname("hub.example") != nil {
		t.Fatalf("hub serving certificate %v (%v): want drover-hub-hub-x for hub.example", leaf, err)
	}
	if _, err := c.SignHub(ctx, hub.HubCertRequest{Hub: "hub-x", Kind: hub.MQTTClient, CSR: hubCSR, CommonName: "drover-nodes"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("an MQTT client certificate named like no hub: %v, want InvalidArgument", err)
	}
}

// TestHubRegistersAndRenewsThroughTheSigner runs a hub whose Signer is the
// remote signer: an agent registers, is signed, renews, and the hub serves
// a certificate the signer signed.
func TestHubRegistersAndRenewsThroughTheSigner(t *testing.T) {
	f := newFixture(t, "signer-hub")
	ctx := context.Background()
	s := f.client("hub-remote", f.hubToken("hub", true))
	h, err := hub.New(hub.Options{Name: "hub-remote", Client: env.Client, Namespace: f.ns, ListenAddress: "127.0.0.1:0",
		ServingHosts: []string{"127.0.0.1"}, Signer: s, Logger: f.log})
	if err != nil {
		t.Fatal(err)
	}
	f.run("hub", h.Start)
	wctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	addr, err := h.Addr(wctx)
	if err != nil {
		t.Fatal(err)
	}
	bundle, err := hub.ReadBundle(ctx, env.Client, f.ns)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := bootstrap.Generate()
	if err != nil {
		t.Fatal(err)
	}
	tok.AutoApprove = true
	if err := bootstrap.Create(ctx, env.Client, f.ns, tok); err != nil {
		t.Fatal(err)
	}
	dial := func(certs ...tls.Certificate) agentv1.AgentHubClient {
		conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			RootCAs: bundle.Pool(), ServerName: "127.0.0.1", Certificates: certs, MinVersion: tls.VersionTLS13})))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return agentv1.NewAgentHubClient(conn)
	}
	keyPEM, der, _ := csr(t, "hub-node")
	var p peer.Peer
	resp, err := dial().Register(ctx, &agentv1.RegisterRequest{Node: "hub-node", BootstrapToken: tok.String(), Csr: der}, grpc.Peer(&p))
	if err != nil || resp.GetResult() != agentv1.RegisterResponse_RESULT_APPROVED {
		t.Fatalf("register: %v %v", resp, err)
	}
	ti := p.AuthInfo.(credentials.TLSInfo)
	if cn := ti.State.PeerCertificates[0].Subject.CommonName; cn != "drover-hub-hub-remote" {
		t.Errorf("the hub serves %q, want the signer's drover-hub-hub-remote", cn)
	}
	cert, err := tls.X509KeyPair(pki.EncodeCert(resp.GetCertificate()), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	renewed, err := dial(cert).Renew(ctx, &agentv1.RenewRequest{Csr: der})
	if err != nil || len(renewed.GetCertificate()) == 0 {
		t.Fatalf("renew: %v", err)
	}
	// A bad token is refused with the one message for every bad token.
	_, der2, _ := csr(t, "hub-node-2")
	_, err = dial().Register(ctx, &agentv1.RegisterRequest{Node: "hub-node-2", BootstrapToken: tok.ID + ".0000000000000000", Csr: der2})
	if status.Code(err) != codes.Unauthenticated || status.Convert(err).Message() != bootstrap.ErrNotValid.Error() {
		t.Errorf("register with a wrong secret: %v, want Unauthenticated %q", err, bootstrap.ErrNotValid)
	}
}

// BenchmarkSignNodeRemote is one registration's signature through the
// remote signer on loopback: a TLS gRPC call, the cached access review,
// the node checks and an ECDSA signature.
func BenchmarkSignNodeRemote(b *testing.B) {
	f := newFixture(b, "signer-bench")
	ctx := context.Background()
	s := f.client("hub-bench", f.hubToken("hub", true))
	_, der, key := csr(b, "bench-node")
	f.node("bench-node", key, true)
	if _, err := s.SignNode(ctx, der, "bench-node"); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := s.SignNode(ctx, der, "bench-node"); err != nil {
			b.Fatal(fmt.Errorf("sign: %w", err))
		}
	}
}
