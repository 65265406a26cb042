package rbac_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// checkHubHoldsNoCA checks, as the hub's ServiceAccount, that the hub can
// read neither Drover's CA nor a bootstrap token.
func checkHubHoldsNoCA(t *testing.T, asHub client.Client) {
	t.Helper()
	ctx := context.Background()
	err := asHub.Get(ctx, client.ObjectKey{Namespace: ns, Name: "drover-ca"}, &corev1.Secret{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("the hub reading Secret drover-ca: %v, want Forbidden", err)
	}
	if err := asHub.List(ctx, &corev1.SecretList{}, client.InNamespace(ns)); !apierrors.IsForbidden(err) {
		t.Errorf("the hub listing Secrets in %s: %v, want Forbidden", ns, err)
	}
}

// registerAndRenew registers node through the hub at addr with token, as
// an agent does, then renews its certificate with it: the hub asks the
// manager's signer for both. The hub's serving certificate is the
// signer's too.
func registerAndRenew(t *testing.T, addr string, roots *x509.CertPool, token, node string) {
	t.Helper()
	ctx := context.Background()
	keyPEM, csr, err := pki.NewKeyAndCSR(node)
	if err != nil {
		t.Fatal(err)
	}
	dial := func(certs ...tls.Certificate) agentv1.AgentHubClient {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			RootCAs: roots, ServerName: "127.0.0.1", Certificates: certs, MinVersion: tls.VersionTLS13})))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return agentv1.NewAgentHubClient(conn)
	}
	var p peer.Peer
	resp, err := dial().Register(ctx, &agentv1.RegisterRequest{Node: node, BootstrapToken: token, Csr: csr}, grpc.Peer(&p))
	if err != nil {
		t.Fatalf("register %s through the hub: %v", node, err)
	}
	if resp.GetResult() != agentv1.RegisterResponse_RESULT_APPROVED || len(resp.GetCertificate()) == 0 {
		t.Fatalf("register %s: %v %q, want APPROVED with a certificate", node, resp.GetResult(), resp.GetMessage())
	}
	if ti, ok := p.AuthInfo.(credentials.TLSInfo); !ok || ti.State.PeerCertificates[0].Subject.CommonName != "drover-hub-rbac" {
		t.Errorf("the hub's serving certificate: want CN drover-hub-rbac, signed by the signer")
	}
	cert, err := tls.X509KeyPair(pki.EncodeCert(resp.GetCertificate()), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	renewed, err := dial(cert).Renew(ctx, &agentv1.RenewRequest{Csr: csr})
	if err != nil {
		t.Fatalf("renew %s through the hub: %v", node, err)
	}
	old, _ := x509.ParseCertificate(resp.GetCertificate())
	c, err := x509.ParseCertificate(renewed.GetCertificate())
	if err != nil || c.Subject.CommonName != node || c.SerialNumber.Cmp(old.SerialNumber) == 0 {
		t.Fatalf("renewed certificate %v (%v): want a new one for %s", c, err, node)
	}
}
