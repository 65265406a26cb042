package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/store"
)

// registerTimeout bounds one Register call; approval itself may take longer
// (the agent asks again) but a single call must not hang.
const registerTimeout = 20 * time.Second

// ensureIdentity returns the node's saved identity, registering first if it has none.
func (a *Agent) ensureIdentity(ctx context.Context) (store.Identity, error) {
	id, ok, err := a.db.Identity(ctx)
	if err != nil {
		return id, err
	}
	if ok {
		if id.Node != a.opts.Node {
			return id, &FatalError{fmt.Errorf("state dir %s belongs to node %q, not %q: use another --state-dir", a.opts.StateDir, id.Node, a.opts.Node)}
		}
		a.log.Info("resuming with saved identity", "hub", id.Hub, "keySHA256", pki.CertPEMKeyFingerprint(id.CertPEM))
		return id, nil
	}
	if a.opts.BootstrapToken == "" {
		return id, &FatalError{errors.New("this node has no identity yet: pass a bootstrap token (--token) to register; create one with `drover token create`")}
	}
	if a.opts.CAFile == "" {
		return id, &FatalError{errors.New("this node has no identity yet: pass Drover's CA certificate (--ca-file) so the agent can trust the hub")}
	}
	caPEM, err := os.ReadFile(a.opts.CAFile)
	if err != nil {
		return id, &FatalError{fmt.Errorf("read CA file: %w", err)}
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return id, &FatalError{fmt.Errorf("CA file %s holds no PEM certificate", a.opts.CAFile)}
	}
	keyPEM, csr, err := a.registrationKey()
	if err != nil {
		return id, err
	}
	req := &agentv1.RegisterRequest{Node: a.opts.Node, BootstrapToken: a.opts.BootstrapToken, Csr: csr, Info: a.info()}
	if err := protocol.CheckNodeInfo(req.Info); err != nil {
		return id, &FatalError{fmt.Errorf("node info: %w", err)}
	}
	waiting := false
	backoff := time.Second
	for attempt := 0; ; attempt++ {
		hub := a.opts.Hubs[attempt%len(a.opts.Hubs)]
		resp, err := a.registerOnce(ctx, hub, pool, req)
		switch {
		case err == nil && resp.GetResult() == agentv1.RegisterResponse_RESULT_APPROVED:
			id = store.Identity{
				Node:    a.opts.Node,
				KeyPEM:  keyPEM,
				CertPEM: pki.EncodeCert(resp.GetCertificate()),
				CAPEM:   caBundlePEM(resp.GetCa(), resp.GetPreviousCas()),
				Hub:     hub,
			}
			if err := a.db.SaveIdentity(ctx, id); err != nil {
				return id, err
			}
			if err := os.Remove(a.registrationKeyPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
				a.log.Warn("cannot remove the registration key file; the key is in the agent DB now", "err", err)
			}
			a.log.Info("registered; certificate saved", "hub", hub)
			return id, nil
		case err == nil:
			if !waiting {
				a.log.Warn("waiting for approval", "hub", hub, "message", resp.GetMessage())
				waiting = true
			}
			wait := time.Duration(max(resp.GetRetryAfterSeconds(), 1)) * time.Second
			if err := a.sleep(ctx, wait); err != nil {
				return id, err
			}
			continue
		}
		if fatal := registerFatal(hub, err, a.registrationKeyPath()); fatal != nil {
			return id, fatal
		}
		wait := registerWait(err, backoff)
		a.log.Warn("register failed; retrying", "hub", hub, "err", err, "retryIn", wait)
		// Jittered: a fleet refused at once (a hub's rate limit, a restart)
		// does not come back at once.
		if err := a.sleep(ctx, wait+rand.N(wait/2+1)); err != nil {
			return id, err
		}
		backoff = min(backoff*2, 30*time.Second)
	}
}

// registerFatal is the FatalError a refused registration ends the agent
// with, or nil when asking again may work (the hub is unreachable, busy or
// rate-limits registrations: ResourceExhausted).
func registerFatal(hub string, err error, keyPath string) error {
	switch status.Code(err) {
	case codes.Unauthenticated:
		return &FatalError{fmt.Errorf("register with hub %s: %s; start the agent again with a valid token; "+
			"a node that was waiting for approval keeps its place, its key is in %s",
			hub, status.Convert(err).Message(), keyPath)}
	case codes.PermissionDenied, codes.InvalidArgument, codes.FailedPrecondition:
		// FailedPrecondition: a broker that admits no registration over
		// MQTT (Mosquitto); its message says to register over gRPC.
		return &FatalError{fmt.Errorf("register with hub %s: %s", hub, status.Convert(err).Message())}
	}
	return nil
}

// registerWait is how long to wait before registering again after err:
// backoff, or longer when the hub asked for longer (a RetryInfo on its
// ResourceExhausted).
func registerWait(err error, backoff time.Duration) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			// Capped: a hub's hint must not park an agent for long.
			return min(max(backoff, ri.GetRetryDelay().AsDuration()), 5*time.Minute)
		}
	}
	return backoff
}

// registrationKeyPath holds the node's key from its first Register until
// it is approved: the hub binds the node's name to that key, so an agent
// restarted while it waits must ask again with the same one.
func (a *Agent) registrationKeyPath() string {
	return filepath.Join(a.opts.StateDir, "registration.key")
}

// registrationKey is the key (and a request for it) to register with: the
// one a restarted agent left waiting, else a new one, saved first.
func (a *Agent) registrationKey() (keyPEM, csr []byte, err error) {
	path := a.registrationKeyPath()
	if keyPEM, err = os.ReadFile(path); err == nil {
		if csr, err = pki.CSRForKey(keyPEM, a.opts.Node); err != nil {
			return nil, nil, &FatalError{fmt.Errorf("registration key %s: %w (remove it, and delete the FleetNode, to register afresh)", path, err)}
		}
		a.log.Info("registering with the key of an earlier start", "file", path)
		return keyPEM, csr, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, nil, err
	}
	if keyPEM, csr, err = pki.NewKeyAndCSR(a.opts.Node); err != nil {
		return nil, nil, err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, keyPEM, 0o600); err != nil {
		return nil, nil, fmt.Errorf("save the registration key: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, nil, fmt.Errorf("save the registration key: %w", err)
	}
	return keyPEM, csr, nil
}

func (a *Agent) registerOnce(ctx context.Context, hub string, roots *x509.CertPool, req *agentv1.RegisterRequest) (*agentv1.RegisterResponse, error) {
	return a.opts.Register(ctx, hub, roots, req)
}

// registerGRPC is the default Registrar: the hub's gRPC Register.
func registerGRPC(ctx context.Context, hub string, roots *x509.CertPool, req *agentv1.RegisterRequest) (*agentv1.RegisterResponse, error) {
	conn, err := dial(hub, &tls.Config{RootCAs: roots, ServerName: hostOf(hub), MinVersion: tls.VersionTLS13})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, registerTimeout)
	defer cancel()
	return agentv1.NewAgentHubClient(conn).Register(ctx, req)
}

// dial opens a gRPC client connection with the agent's keepalive settings.
func dial(hub string, cfg *tls.Config) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient(hub,
		grpc.WithTransportCredentials(credentials.NewTLS(cfg)),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(protocol.MaxEnvelopeBytes), grpc.MaxCallSendMsgSize(protocol.MaxEnvelopeBytes)),
		// Find a dead hub within ~80s even if no heartbeat is due; the hub permits pings every 30s.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 60 * time.Second, Timeout: 20 * time.Second, PermitWithoutStream: true}),
	)
	if err != nil {
		return nil, fmt.Errorf("dial hub %s: %w", hub, err)
	}
	return conn, nil
}

func hostOf(addr string) string {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return h
}

// sleep waits d on the agent's clock, or until ctx ends (its error).
func (a *Agent) sleep(ctx context.Context, d time.Duration) error {
	t := a.opts.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.Chan():
		return nil
	}
}
