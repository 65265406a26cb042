package hub

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/drover-fleet/drover/internal/bootstrap"
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/mqtt/topics"
	"github.com/drover-fleet/drover/internal/protocol"
)

// Signer is what a hub asks for everything that takes Drover's CA key or
// a Secret: the hub itself holds neither. The manager's signer
// (internal/signer) implements it, remotely for `drover hub --signer` and
// in the process for `drover server`, and checks each request again
// against its own view of the API; the default, for tests and a hub
// without a signer, signs with the CA Secret itself (secretSigner).
type Signer interface {
	// Trust is Drover's CA bundle as it is now: the hub trusts its CAs,
	// answers agents with them and serves its chain.
	Trust(ctx context.Context) (*Bundle, error)
	// SignNode signs the DER PKCS#10 request csrDER, whose subject must be
	// node, and returns the certificate (DER). Register and Renew call it
	// once they decided the node may have one for the request's key; a
	// refusal is a gRPC status error.
	SignNode(ctx context.Context, csrDER []byte, node string) (certDER []byte, err error)
	// SignHub signs one of the hub's own certificates and returns it with
	// its chain (DER).
	SignHub(ctx context.Context, req HubCertRequest) (chainDER [][]byte, err error)
	// VerifyToken checks a bootstrap token as bootstrap.Verifier.Verify
	// does: its errors wrap bootstrap.ErrMalformed or ErrNotValid (and say
	// why, for the operator's log), or are the API's.
	VerifyToken(ctx context.Context, token string) (bootstrap.Token, error)
}

// HubCertKind is which of its certificates a hub asks for.
type HubCertKind int

const (
	// HubServing is the hub's gRPC serving certificate, named
	// drover-hub-<hub>.
	HubServing HubCertKind = iota + 1
	// MQTTServing is the serving certificate of the hub's embedded MQTT
	// broker, named drover-mqtt-<hub>.
	MQTTServing
	// MQTTClient is the certificate the hub connects to an MQTT broker
	// with: CommonName is its layout's hub user (topics.Layout.HubCN), in
	// the hubs' organization.
	MQTTClient
)

func (k HubCertKind) String() string {
	switch k {
	case HubServing:
		return "serving"
	case MQTTServing:
		return "mqtt-serving"
	case MQTTClient:
		return "mqtt-client"
	}
	return fmt.Sprintf("HubCertKind(%d)", int(k))
}

// HubCertRequest asks for one of a hub's certificates.
type HubCertRequest struct {
	// Hub is the hub's name.
	Hub  string
	Kind HubCertKind
	// CSR is a DER PKCS#10 request; only its key is used.
	CSR []byte
	// Hosts are a serving certificate's DNS names and IPs.
	Hosts []string
	// CommonName is an MQTTClient certificate's.
	CommonName string
}

// MaxHubHosts bounds the names of a hub's serving certificate.
const MaxHubHosts = 64

// hubCertValidity is how long a hub's own certificates are valid; a hub
// asks for a new serving certificate whenever Drover's CA changes.
const hubCertValidity = 365 * 24 * time.Hour

// IssueHubCert signs req with t's current CA at now, after checking it
// (names are the signer's to choose: a hub picks only its hosts), and
// returns the certificate followed by the cross certificates.
func IssueHubCert(t *Trust, req HubCertRequest, now time.Time) ([][]byte, error) {
	if err := protocol.ValidNodeName(req.Hub); err != nil {
		return nil, fmt.Errorf("hub name: %w", err)
	}
	var der []byte
	var err error
	switch req.Kind {
	case HubServing, MQTTServing:
		if err := validHosts(req.Hosts); err != nil {
			return nil, err
		}
		cn := "drover-hub-" + req.Hub
		if req.Kind == MQTTServing {
			cn = "drover-mqtt-" + req.Hub
		}
		der, err = t.Current.SignServingCSR(req.CSR, cn, req.Hosts, now, hubCertValidity)
	case MQTTClient:
		prefix, ok := strings.CutPrefix(req.CommonName, topics.HubUser+":")
		if !ok || prefix == "" || len(prefix) > 128 || strings.ContainsAny(prefix, "+#\x00") {
			return nil, fmt.Errorf("MQTT client common name %q: want %s:<topic prefix>", clipped(req.CommonName), topics.HubUser)
		}
		der, err = t.Current.SignClientCSRAs(req.CSR, req.CommonName, topics.HubOrganization, now, hubCertValidity)
	default:
		return nil, fmt.Errorf("unknown hub certificate kind %v", req.Kind)
	}
	if err != nil {
		return nil, err
	}
	return append([][]byte{der}, t.Cross...), nil
}

// SignerServerName is a DNS name of the manager's signer's serving
// certificate, and of no hub's: operators' tools (`drover logs`) send
// their bearer token only to a server whose certificate of Drover's CA has
// it, so a hub, which serves a certificate of the same CA, cannot collect
// tokens by posing as the signer.
const SignerServerName = "drover-signer"

func validHosts(hosts []string) error {
	if len(hosts) == 0 || len(hosts) > MaxHubHosts {
		return fmt.Errorf("a serving certificate names 1 to %d hosts, not %d", MaxHubHosts, len(hosts))
	}
	for _, h := range hosts {
		if strings.EqualFold(h, SignerServerName) {
			return fmt.Errorf("host %q is the signer's name, which no hub may have", h)
		}
		if net.ParseIP(h) != nil {
			continue
		}
		if errs := validation.IsDNS1123Subdomain(h); len(errs) > 0 {
			return fmt.Errorf("host %q: want an IP or a DNS name: %s", clipped(h), errs[0])
		}
	}
	return nil
}

// HubCertificate has the hub's signer sign a new key for one of the hub's
// certificates (hosts for a serving one, commonName for an MQTT client
// one). Other transports (the MQTT bridge) take theirs from here.
func (h *Hub) HubCertificate(ctx context.Context, kind HubCertKind, hosts []string, commonName string) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate a key for the hub's %v certificate: %w", kind, err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: h.opts.Name}}, key)
	if err != nil {
		return nil, fmt.Errorf("hub %v certificate request: %w", kind, err)
	}
	chain, err := h.signer.SignHub(ctx, HubCertRequest{Hub: h.opts.Name, Kind: kind, CSR: csr, Hosts: hosts, CommonName: commonName})
	if err != nil {
		return nil, fmt.Errorf("sign the hub's %v certificate: %w", kind, err)
	}
	if len(chain) == 0 {
		return nil, fmt.Errorf("sign the hub's %v certificate: the signer answered no certificate", kind)
	}
	leaf, err := x509.ParseCertificate(chain[0])
	if err != nil {
		return nil, fmt.Errorf("the hub's %v certificate: %w", kind, err)
	}
	return &tls.Certificate{Certificate: chain, PrivateKey: key, Leaf: leaf}, nil
}

// secretSigner is the default Signer: the hub's own copy of Drover's CA,
// read from the CA Secret (created if missing), and its bootstrap tokens
// read from their Secrets. A hub using it needs Secret access, which
// config/rbac no longer grants hubs: production hubs use the manager's
// signer.
type secretSigner struct {
	c        client.Client
	ns       string
	clock    clock.Clock
	validity time.Duration
	tokens   *bootstrap.Verifier
	trust    atomic.Pointer[Trust]
}

var _ Signer = (*secretSigner)(nil)

func (s *secretSigner) Trust(ctx context.Context) (*Bundle, error) {
	t, err := EnsureTrust(ctx, s.c, s.ns, s.clock.Now())
	if err != nil {
		return nil, err
	}
	s.trust.Store(t)
	return t.Bundle(), nil
}

func (s *secretSigner) current() (*Trust, error) {
	t := s.trust.Load()
	if t == nil {
		return nil, errors.New("Drover's CA is not loaded yet")
	}
	return t, nil
}

func (s *secretSigner) SignNode(_ context.Context, csrDER []byte, node string) ([]byte, error) {
	t, err := s.current()
	if err != nil {
		return nil, err
	}
	return t.Current.SignClientCSR(csrDER, node, s.clock.Now(), s.validity)
}

func (s *secretSigner) SignHub(_ context.Context, req HubCertRequest) ([][]byte, error) {
	t, err := s.current()
	if err != nil {
		return nil, err
	}
	return IssueHubCert(t, req, s.clock.Now())
}

func (s *secretSigner) VerifyToken(ctx context.Context, token string) (bootstrap.Token, error) {
	return s.tokens.Verify(ctx, token, s.clock.Now())
}
