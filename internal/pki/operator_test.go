package pki

import (
	"crypto/x509"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/protocol"
)

func TestOperatorCertificate(t *testing.T) {
	now := time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)
	ca, err := NewCA("drover-ca", now, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// A request naming a node gets the fixed operator subject all the same.
	_, csr, err := NewKeyAndCSR("node-a")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		id   OperatorIdentity
	}{
		{"groups", OperatorIdentity{User: "alice", UID: "u-1", Groups: []string{"devs", "system:authenticated", "ünïcode group"}}},
		{"no groups, no uid", OperatorIdentity{User: "system:serviceaccount:team-a:reader"}},
		// Extra fields are kept: an authorizer may restrict a token by
		// them (scopes), so the certificate must carry them too.
		{"extra", OperatorIdentity{User: "bob", Groups: []string{"devs"}, Extra: OperatorExtras(map[string][]string{
			"scopes.authorization.openshift.io":          {"user:info"},
			"authentication.kubernetes.io/credential-id": {"JTI=abc"},
		})}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			der, err := ca.SignOperatorCSR(csr, tt.id, now, OperatorValidity)
			if err != nil {
				t.Fatal(err)
			}
			c, err := x509.ParseCertificate(der)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Verify(x509.VerifyOptions{Roots: ca.Pool(), CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
				t.Errorf("does not verify as a client certificate: %v", err)
			}
			if got := c.NotAfter.Sub(now); got != OperatorValidity {
				t.Errorf("valid for %s after signing, want %s", got, OperatorValidity)
			}
			if c.Subject.CommonName != OperatorCommonName || slices.Contains(c.Subject.Organization, "drover:nodes") {
				t.Errorf("subject %v: want CN %q and not the nodes' organization", c.Subject, OperatorCommonName)
			}
			if protocol.ValidNodeName(c.Subject.CommonName) == nil {
				t.Errorf("CN %q is a valid node name", c.Subject.CommonName)
			}
			if !IsOperatorCert(c) {
				t.Error("no operator usage")
			}
			got, err := OperatorIdentityOf(c)
			if err != nil {
				t.Fatal(err)
			}
			if got.User != tt.id.User || got.UID != tt.id.UID || !slices.Equal(got.Groups, tt.id.Groups) || !reflect.DeepEqual(got.ExtraMap(), tt.id.ExtraMap()) {
				t.Errorf("identity %+v, want %+v", got, tt.id)
			}
		})
	}

	// Node and serving certificates have no operator usage.
	nodeDER, err := ca.SignClientCSR(csr, "node-a", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	node, _ := x509.ParseCertificate(nodeDER)
	if IsOperatorCert(node) {
		t.Error("a node certificate has the operator usage")
	}
	if _, err := OperatorIdentityOf(node); err == nil {
		t.Error("a node certificate has an operator identity")
	}
	srvDER, err := ca.SignServingCSR(csr, "drover-hub-a", []string{"127.0.0.1"}, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := x509.ParseCertificate(srvDER)
	if IsOperatorCert(srv) {
		t.Error("a serving certificate has the operator usage")
	}

	if _, err := ca.SignOperatorCSR(csr, OperatorIdentity{}, now, OperatorValidity); err == nil {
		t.Error("an identity without a user was signed")
	}
	if _, err := ca.SignOperatorCSR([]byte("garbage"), tests[0].id, now, OperatorValidity); err == nil {
		t.Error("a garbage request was signed")
	}
}
