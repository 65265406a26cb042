package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/store"
)

// Certificates are short-lived (the hub's CertificateValidity, 7 days by
// default): the agent renews its own with the hub's Renew, for the same
// key, once two thirds of its lifetime have passed, and uses the new one
// for its next connection. A certificate that expired anyway (the node was
// off longer than a lifetime) is replaced by registering again with the
// bootstrap token and the same key.

// Renewal retries: from renewRetryMin, doubling to renewRetryMax.
const (
	renewRetryMin = 10 * time.Second
	renewRetryMax = 5 * time.Minute
)

// identity is the node's identity in use: what the DB holds, with its
// certificate parsed. mu serialises changes (a renewal, the hub of a new
// session) so that none writes an older identity over a newer one.
type identity struct {
	mu   sync.Mutex
	id   store.Identity
	cert atomic.Pointer[tls.Certificate]
	// renew replaces renewOnce in tests; nil: renewOnce.
	renew func(ctx context.Context, hub string) error
}

// useIdentity makes id the identity connections present.
func (a *Agent) useIdentity(id store.Identity) error {
	cert, err := tls.X509KeyPair(id.CertPEM, id.KeyPEM)
	if err != nil {
		return &FatalError{fmt.Errorf("saved identity is unusable (%v): delete %s to register again", err, a.db.Path())}
	}
	a.ident.id = id
	a.ident.cert.Store(&cert)
	return nil
}

// identity is the identity in use.
func (a *Agent) identity() store.Identity {
	a.ident.mu.Lock()
	defer a.ident.mu.Unlock()
	return a.ident.id
}

// changeIdentity saves the identity as change leaves it, and uses it.
func (a *Agent) changeIdentity(ctx context.Context, change func(*store.Identity)) error {
	a.ident.mu.Lock()
	defer a.ident.mu.Unlock()
	id := a.ident.id
	change(&id)
	if err := a.db.SaveIdentity(ctx, id); err != nil {
		return err
	}
	return a.useIdentity(id)
}

// clientCert is tls.Config's GetClientCertificate: the certificate in use
// at each handshake, so a reconnect presents a renewed one.
func (a *Agent) clientCert(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return a.ident.cert.Load(), nil
}

// tlsConfig is the client TLS configuration for hub (or a broker): the
// current certificate, and Drover's CAs as the identity holds them.
func (a *Agent) tlsConfig(hub string) *tls.Config {
	id := a.identity()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(id.CAPEM)
	return &tls.Config{
		// Certificates names the node to connectors that read it (MQTT);
		// GetClientCertificate wins at handshakes.
		Certificates:         []tls.Certificate{*a.ident.cert.Load()},
		GetClientCertificate: a.clientCert,
		RootCAs:              roots,
		ServerName:           hostOf(hub),
		MinVersion:           tls.VersionTLS13,
		// Certificates are valid on the agent's clock, as renewals are timed.
		Time: a.opts.Clock.Now,
	}
}

// caBundlePEM is what the agent trusts hubs with: the CA a hub answered
// with and those a rotation left trusted.
func caBundlePEM(ca []byte, previous [][]byte) []byte {
	b := pki.EncodeCert(ca)
	for _, p := range previous {
		b = append(b, pki.EncodeCert(p)...)
	}
	return b
}

// renewAt is when to renew a certificate valid from notBefore to notAfter:
// once two thirds of its lifetime have passed, moved by up to a thirtieth
// of it either way (jitter in [0, 1)), so that nodes that registered
// together do not all renew at once.
func renewAt(notBefore, notAfter time.Time, jitter float64) time.Time {
	life := notAfter.Sub(notBefore)
	spread := time.Duration((jitter*2 - 1) * float64(life) / 30)
	return notBefore.Add(life*2/3 + spread)
}

// renewWait is how long to wait after a failed renewal: backoff (or what
// a rate-limiting hub asks), but never past the certificate's expiry, when
// the agent registers again instead.
func renewWait(err error, backoff, untilExpiry time.Duration) time.Duration {
	return max(0, min(registerWait(err, backoff), untilExpiry))
}

// renewLoop renews the certificate in use before it expires, until ctx
// ends. It returns only a FatalError: the certificate expired and the
// node could not register again.
func (a *Agent) renewLoop(ctx context.Context) error {
	for {
		leaf := a.ident.cert.Load().Leaf
		wait := renewAt(leaf.NotBefore, leaf.NotAfter, rand.Float64()).Sub(a.opts.Clock.Now())
		if wait > 0 && a.sleep(ctx, wait) != nil {
			return nil
		}
		if err := a.renewBefore(ctx, leaf.NotAfter); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			a.log.Error("agent stopped", "err", err)
			return err
		}
	}
}

// renewBefore renews the certificate, retrying until it succeeds or
// expires at notAfter; then it registers again.
func (a *Agent) renewBefore(ctx context.Context, notAfter time.Time) error {
	hubs := a.opts.Hubs
	backoff := renewRetryMin
	for attempt := 0; ; attempt++ {
		now := a.opts.Clock.Now()
		if !now.Before(notAfter) {
			return a.registerAgain(ctx, notAfter)
		}
		hub := a.currentHub()
		if attempt > 0 || hub == "" {
			hub = hubs[attempt%len(hubs)]
		}
		renew := a.renewOnce
		if a.ident.renew != nil {
			renew = a.ident.renew
		}
		err := renew(ctx, hub)
		if err == nil {
			a.log.Info("certificate renewed", "hub", hub, "expires", a.ident.cert.Load().Leaf.NotAfter)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		wait := renewWait(err, backoff, notAfter.Sub(now))
		// Warn: a node whose renewals keep failing stops when the
		// certificate expires; the operator has until then.
		a.log.Warn("certificate renewal failed; retrying", "hub", hub, "err", err, "retryIn", wait, "expires", notAfter)
		if err := a.sleep(ctx, wait+rand.N(wait/4+1)); err != nil {
			return err
		}
		backoff = min(backoff*2, renewRetryMax)
	}
}

// currentHub is the hub of the open stream, or "".
func (a *Agent) currentHub() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.hub
}

// renewOnce asks hub for a new certificate for the node's key and uses it.
func (a *Agent) renewOnce(ctx context.Context, hub string) error {
	id := a.identity()
	csr, err := pki.CSRForKey(id.KeyPEM, a.opts.Node)
	if err != nil {
		return err
	}
	var c agentv1.AgentHubClient
	if a.opts.RenewOverSession {
		a.mu.Lock()
		c, hub = a.client, a.hub
		a.mu.Unlock()
		if c == nil {
			return status.Error(codes.Unavailable, "not connected to a hub: the certificate is renewed over the session's MQTT connection")
		}
	} else {
		conn, err := dial(hub, a.tlsConfig(hub))
		if err != nil {
			return err
		}
		defer conn.Close()
		c = agentv1.NewAgentHubClient(conn)
	}
	cctx, cancel := context.WithTimeout(ctx, registerTimeout)
	defer cancel()
	resp, err := c.Renew(cctx, &agentv1.RenewRequest{Csr: csr})
	if err != nil {
		return fmt.Errorf("renew at hub %s: %w", hub, err)
	}
	certPEM := pki.EncodeCert(resp.GetCertificate())
	if _, err := tls.X509KeyPair(certPEM, id.KeyPEM); err != nil {
		return fmt.Errorf("renew at hub %s: the certificate it signed is not for this node's key: %w", hub, err)
	}
	return a.changeIdentity(ctx, func(id *store.Identity) {
		id.CertPEM = certPEM
		id.CAPEM = caBundlePEM(resp.GetCa(), resp.GetPreviousCas())
	})
}

// registerAgain replaces a certificate that expired at expired: Register
// with the bootstrap token and the node's key (the hub signs again for a
// name registered with that key, if the node is still approved).
func (a *Agent) registerAgain(ctx context.Context, expired time.Time) error {
	what := fmt.Sprintf("the node's certificate expired at %s (the agent was off, or could not renew, longer than its lifetime)",
		expired.UTC().Format(time.RFC3339))
	fix := "create a bootstrap token with `drover token create` and restart the agent with it (--token); the node keeps its name and key"
	if a.opts.BootstrapToken == "" {
		return &FatalError{fmt.Errorf("%s and the agent has no bootstrap token to register again: %s", what, fix)}
	}
	a.log.Warn(what + "; registering again with the bootstrap token")
	id := a.identity()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(id.CAPEM)
	if a.opts.CAFile != "" {
		if b, err := os.ReadFile(a.opts.CAFile); err == nil {
			roots.AppendCertsFromPEM(b)
		}
	}
	csr, err := pki.CSRForKey(id.KeyPEM, a.opts.Node)
	if err != nil {
		return err
	}
	req := &agentv1.RegisterRequest{Node: a.opts.Node, BootstrapToken: a.opts.BootstrapToken, Csr: csr, Info: a.info()}
	backoff := time.Second
	for attempt := 0; ; attempt++ {
		hub := a.opts.Hubs[attempt%len(a.opts.Hubs)]
		resp, err := a.registerOnce(ctx, hub, roots, req)
		switch {
		case err == nil && resp.GetResult() == agentv1.RegisterResponse_RESULT_APPROVED:
			err := a.changeIdentity(ctx, func(id *store.Identity) {
				id.CertPEM = pki.EncodeCert(resp.GetCertificate())
				id.CAPEM = caBundlePEM(resp.GetCa(), resp.GetPreviousCas())
			})
			if err == nil {
				a.log.Info("registered again; certificate saved", "hub", hub, "expires", a.ident.cert.Load().Leaf.NotAfter)
			}
			return err
		case err == nil:
			a.log.Warn("registered again, waiting for approval", "hub", hub, "message", resp.GetMessage())
			if err := a.sleep(ctx, time.Duration(max(resp.GetRetryAfterSeconds(), 1))*time.Second); err != nil {
				return err
			}
			continue
		case ctx.Err() != nil:
			return ctx.Err()
		}
		if code := status.Code(err); code == codes.Unauthenticated || code == codes.PermissionDenied || code == codes.InvalidArgument {
			return &FatalError{fmt.Errorf("%s and hub %s refused to register it again: %s; %s",
				what, hub, status.Convert(err).Message(), fix)}
		}
		wait := registerWait(err, backoff)
		a.log.Warn("register again failed; retrying", "hub", hub, "err", err, "retryIn", wait)
		if err := a.sleep(ctx, wait+rand.N(wait/2+1)); err != nil {
			return err
		}
		backoff = min(backoff*2, 30*time.Second)
	}
}
