package hub

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/drover-fleet/drover/internal/bootstrap"
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/hub/liveness"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/protocol/operatorv1"
)

// Options configure a Hub. Zero values are replaced by the documented defaults.
type Options struct {
	// Name identifies the hub in FleetNode status and its Lease. Default: the host name.
	Name string
	// Client reads and writes the API. Reads may be cached (a manager's
	// client); the revocation list (RevokedKeysName) is read through it at
	// every connect, so a cache should hold that one ConfigMap of Namespace
	// (as `drover hub` restricts it).
	Client client.Client
	// APIReader reads uncached, for writes that must see the latest object. Default: Client.
	APIReader client.Reader
	// Namespace holds the CA Secret, bootstrap tokens and hub Leases. Default: drover-system.
	Namespace string
	// ListenAddress is where agents connect. Default: 127.0.0.1:7443. Port 0 picks a free one.
	ListenAddress string
	// ServingHosts are the names and IPs in the hub's serving certificate.
	// Default: 127.0.0.1, localhost and the host name.
	ServingHosts []string
	// HeartbeatInterval is what agents are told to use. Default: 30s.
	HeartbeatInterval time.Duration
	// OfflineTimeout is how long a silent node stays Online. Default: 5m.
	OfflineTimeout time.Duration
	// HeartbeatRefresh is how often a live node's coarse lastHeartbeatTime is
	// written. Default: 10m (0.1 writes per idle node per minute).
	HeartbeatRefresh time.Duration
	// LeaseDuration of the hub's Lease. Default: 40s, renewed every third of it.
	LeaseDuration time.Duration
	// CertificateValidity of the client certificates the hub signs; agents
	// renew theirs after two thirds of it. Default:
	// DefaultCertificateValidity (7 days).
	CertificateValidity time.Duration
	// Signer signs node certificates and the hub's own, checks bootstrap
	// tokens and tells Drover's CA bundle: the manager's signer
	// (internal/signer). Default: the hub's own copy of Drover's CA, read
	// from the CA Secret (created if missing), and bootstrap tokens read
	// from their Secrets, through Client and APIReader; that needs Secret
	// access, which config/rbac does not grant hubs.
	Signer Signer
	// Features are the hub sides of the kinds of work it carries (node
	// jobs, tasks): their items make up each node's snapshot, and each
	// agent report goes to the feature that owns its uid. New attaches each
	// one. Default: none (the hub carries no work).
	Features []Feature
	// Clock tells the time and times the hub's rules: liveness, the
	// Lease, log request timeouts. Default: the wall clock.
	Clock clock.Clock
	// Logger for operators; nothing is logged per heartbeat at info. Default: discard.
	Logger *slog.Logger
	// Registerer receives the hub's metrics. Default: none.
	Registerer prometheus.Registerer
	// Recorder records a FleetNode's transitions as Events (Connected,
	// Disconnected, Offline). Default: none.
	Recorder events.EventRecorder

	// RegisterRate bounds Register calls per second over all sources, with
	// RegisterBurst calls at once. Negative: no limit. Defaults: 500 and
	// 1000, above the fleet's registration goal (about 100 nodes/s).
	RegisterRate  float64
	RegisterBurst int
	// RegisterRatePerSource bounds Register calls per second from one
	// source (an IPv4 address or IPv6 /64), with RegisterBurstPerSource at
	// once. Many agents may share one NAT address. Negative: no limit.
	// Defaults: 20 and 50.
	RegisterRatePerSource  float64
	RegisterBurstPerSource int
	// TokenNegativeTTL is how long the default Signer refuses a bootstrap
	// token id that does not exist without reading the API again. Tokens
	// are read through Client (a manager's informer cache) and, for one it
	// does not hold yet, once through APIReader. Default: 10s.
	TokenNegativeTTL time.Duration
}

func (o *Options) defaults() error {
	if o.Client == nil {
		return errors.New("hub options: Client is required")
	}
	if o.APIReader == nil {
		o.APIReader = o.Client
	}
	if o.Name == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("hub options: no Name and no host name: %w", err)
		}
		o.Name = h
	}
	if err := protocol.ValidNodeName(o.Name); err != nil {
		return fmt.Errorf("hub name %q: want a lowercase DNS name, as it names the hub's Lease: %w", o.Name, err)
	}
	if o.Namespace == "" {
		o.Namespace = "drover-system"
	}
	if o.ListenAddress == "" {
		o.ListenAddress = "127.0.0.1:7443"
	}
	if len(o.ServingHosts) == 0 {
		o.ServingHosts = []string{"127.0.0.1", "localhost"}
		if h, err := os.Hostname(); err == nil {
			o.ServingHosts = append(o.ServingHosts, h)
		}
	}
	if o.HeartbeatInterval <= 0 {
		o.HeartbeatInterval = 30 * time.Second
	}
	if o.OfflineTimeout <= 0 {
		o.OfflineTimeout = 5 * time.Minute
	}
	if o.OfflineTimeout <= o.HeartbeatInterval {
		return fmt.Errorf("hub options: OfflineTimeout %v must be longer than HeartbeatInterval %v", o.OfflineTimeout, o.HeartbeatInterval)
	}
	if o.HeartbeatRefresh <= 0 {
		o.HeartbeatRefresh = 10 * time.Minute
	}
	if o.LeaseDuration <= 0 {
		o.LeaseDuration = 40 * time.Second
	}
	if o.CertificateValidity <= 0 {
		o.CertificateValidity = DefaultCertificateValidity
	}
	o.RegisterRate, o.RegisterBurst = orLimit(o.RegisterRate, o.RegisterBurst, 500, 1000)
	o.RegisterRatePerSource, o.RegisterBurstPerSource = orLimit(o.RegisterRatePerSource, o.RegisterBurstPerSource, 20, 50)
	if o.TokenNegativeTTL <= 0 {
		o.TokenNegativeTTL = bootstrap.DefaultNegativeTTL
	}
	o.Clock = clock.Or(o.Clock)
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return nil
}

// orLimit defaults a rate (0: def) and its burst (0: defBurst, or twice a
// rate that is not the default; at least 1).
func orLimit(r float64, burst int, def float64, defBurst int) (float64, int) {
	if r == 0 {
		r = def
	}
	if burst <= 0 {
		burst = defBurst
		if r != def {
			burst = max(1, int(math.Ceil(2*r)))
		}
	}
	return r, burst
}

// limit is r as rate.Limiter takes it: a negative rate is no limit.
func limit(r float64) rate.Limit {
	if r < 0 {
		return rate.Inf
	}
	return rate.Limit(r)
}

// recvLimit is the largest message the hub's gRPC server decodes.
const recvLimit = 2 * protocol.MaxEnvelopeBytes

// Hub serves agents. Create it with New and run it with Start.
type Hub struct {
	agentv1.UnimplementedAgentHubServer
	operatorv1.UnimplementedOperatorServer

	opts    Options
	log     *slog.Logger
	metrics *metrics
	// router joins the features; logs is the one that finds task logs
	// (nil: none); calls are the Calls waiting for agents' reports.
	router *router
	logs   LogFinder
	calls  calls

	// mu guards live, sessions and wasReady.
	mu       sync.Mutex
	live     *liveness.Tracker
	sessions map[string]*session
	// wasReady is the Ready condition a node had when it was marked
	// NotResponding, restored when it is heard from again (so that a
	// MovedHub stays MovedHub).
	wasReady map[string]metav1.Condition

	// registers bounds Register calls.
	registers *registerLimiter

	ready chan struct{} // closed once listening
	addr  net.Addr

	// trust is Drover's CA bundle as the hub last read it (refreshTrust),
	// and serving the hub's certificate from its current CA.
	trust   atomic.Pointer[Bundle]
	serving atomic.Pointer[tls.Certificate]
	// signer signs certificates and checks tokens (Options.Signer);
	// renewals bounds Renew calls per node.
	signer   Signer
	renewals *renewLimiter

	// kubeCAs are the kube-apiserver's client CAs, and clientCAs the pool of
	// them and Drover's CAs that client certificates are verified against
	// (clientCAsMu serialises its updates).
	kubeCAs     atomic.Pointer[[]*x509.Certificate]
	clientCAs   atomic.Pointer[x509.CertPool]
	clientCAsMu sync.Mutex

	// stopping is set when the hub shuts down: its streams end then, and
	// that says nothing of the nodes.
	stopping atomic.Bool

	// logMu guards logReqs: TaskLogs calls waiting for chunks, by request id.
	logMu   sync.Mutex
	logReqs map[string]*logRequest
}

// New validates opts and returns a Hub that is not running yet, attached
// to each of its features.
func New(opts Options) (*Hub, error) {
	// Without its own APIReader, the Client is the only reader: tokens are
	// not looked up twice in it.
	liveReader := opts.APIReader
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	log := opts.Logger.With("hub", opts.Name)
	m := newMetrics(opts.Registerer)
	r, err := newRouter(opts.Features, m.unrouted, m.foreign, log)
	if err != nil {
		return nil, err
	}
	logs, err := r.logFinder()
	if err != nil {
		return nil, err
	}
	h := &Hub{
		opts:    opts,
		log:     log,
		metrics: m,
		router:  r,
		logs:    logs,
		live: liveness.New(liveness.Options{OfflineTimeout: opts.OfflineTimeout, RefreshInterval: opts.HeartbeatRefresh,
			// A node that was connected reconnects within a heartbeat or two.
			AdoptGrace: min(2*opts.HeartbeatInterval, opts.OfflineTimeout/2),
			// Three heartbeats missed, as kube-controller-manager's
			// node-monitor-grace-period is a few kubelet updates.
			LateAfter: min(3*opts.HeartbeatInterval, opts.OfflineTimeout/2)}),
		sessions: map[string]*session{},
		ready:    make(chan struct{}),
		logReqs:  map[string]*logRequest{},
		wasReady: map[string]metav1.Condition{},
		registers: newRegisterLimiter(limit(opts.RegisterRate), opts.RegisterBurst,
			limit(opts.RegisterRatePerSource), opts.RegisterBurstPerSource),
		renewals: newRenewLimiter(renewInterval),
		signer:   opts.Signer,
	}
	if h.signer == nil {
		h.signer = &secretSigner{c: opts.Client, ns: opts.Namespace, clock: opts.Clock, validity: opts.CertificateValidity,
			tokens: bootstrap.NewVerifier(bootstrap.VerifierOptions{Cached: opts.Client, Live: liveReader,
				Namespace: opts.Namespace, NegativeTTL: opts.TokenNegativeTTL, Clock: opts.Clock})}
	}
	for _, f := range opts.Features {
		f.Attach(link{h: h, f: f})
	}
	return h, nil
}

// Name is the hub's name.
func (h *Hub) Name() string { return h.opts.Name }

// Addr waits until the hub listens and returns its address.
func (h *Hub) Addr(ctx context.Context) (net.Addr, error) {
	select {
	case <-h.ready:
		return h.addr, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Started waits until the hub has loaded Drover's CA bundle and listens
// (it does as it starts): then TrustedCAs and HubCertificate serve other
// transports (the MQTT bridge).
func (h *Hub) Started(ctx context.Context) error {
	select {
	case <-h.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// OfflineTimeout is how long a silent node stays Online.
func (h *Hub) OfflineTimeout() time.Duration { return h.opts.OfflineTimeout }

// Clock is the hub's clock: transports that carry its sessions (the MQTT
// bridge) time them with it by default.
func (h *Hub) Clock() clock.Clock { return h.opts.Clock }

// Logger is the hub's logger.
func (h *Hub) Logger() *slog.Logger { return h.log }

// NeedLeaderElection is false: every hub serves, none leads.
func (h *Hub) NeedLeaderElection() bool { return false }

// Start serves until ctx ends. It is a controller-runtime Runnable.
func (h *Hub) Start(ctx context.Context) error {
	if err := ensureNamespace(ctx, h.opts.APIReader, h.opts.Client, h.opts.Namespace); err != nil {
		return err
	}
	if err := h.firstTrust(ctx); err != nil {
		return err
	}
	h.loadKubeClientCA(ctx)
	lis, err := net.Listen("tcp", h.opts.ListenAddress)
	if err != nil {
		return fmt.Errorf("hub listen on %s: %w", h.opts.ListenAddress, err)
	}
	h.addr = lis.Addr()
	base := &tls.Config{
		// The certificate of the CA the hub read last (refreshTrust).
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return h.serving.Load(), nil },
		// Register comes without a client certificate; every other call
		// checks one. Agents present certificates from Drover's CA,
		// operators from the kube-apiserver's client CA (or a token): each
		// call checks which root it needs (nodeFromPeer, authenticate).
		ClientAuth: tls.VerifyClientCertIfGiven,
		ClientCAs:  h.clientCAs.Load(),
		MinVersion: tls.VersionTLS13,
		// Certificates expire on the hub's clock, as they are signed on it.
		Time: h.opts.Clock.Now,
	}
	tlsConfig := base.Clone()
	tlsConfig.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := base.Clone()
		c.ClientCAs = h.clientCAs.Load()
		return c, nil
	}
	srv := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(tlsConfig)),
		// Decode up to twice the protocol's limit, so that SendMessage can
		// refuse a slightly oversized envelope with InvalidArgument and a
		// reason (an agent drops what it gets InvalidArgument for instead of
		// retrying it for ever). Anything larger gets gRPC's own
		// ResourceExhausted before it is decoded.
		grpc.MaxRecvMsgSize(recvLimit),
		grpc.MaxSendMsgSize(protocol.MaxEnvelopeBytes),
		// Streams are long-lived and mostly idle: ping rarely so 100k of them
		// cost little, but often enough to find dead peers behind NAT.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 2 * time.Minute, Timeout: 20 * time.Second}),
		// Agents ping every 60s at most; allow it even without active RPCs.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 30 * time.Second, PermitWithoutStream: true}),
		// Small per-stream windows: 100k idle streams must not reserve 64 KiB each.
		grpc.InitialWindowSize(32<<10),
		grpc.InitialConnWindowSize(64<<10),
		grpc.ReadBufferSize(8<<10),
		grpc.WriteBufferSize(8<<10),
	)
	agentv1.RegisterAgentHubServer(srv, h)
	operatorv1.RegisterOperatorServer(srv, h)
	close(h.ready)
	h.log.Info("hub serving agents", "address", h.addr.String())

	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("hub serve: %w", err)
		}
		return nil
	})
	g.Go(func() error { return h.runLease(ctx) })
	g.Go(func() error { return h.runLiveness(ctx) })
	g.Go(func() error { return h.watchNodes(ctx) })
	g.Go(func() error { return h.refreshKubeClientCA(ctx) })
	g.Go(func() error { return h.refreshTrust(ctx) })
	g.Go(func() error {
		<-ctx.Done()
		h.stopping.Store(true)
		h.closeAllSessions()
		stopped := make(chan struct{})
		go func() { srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(5 * time.Second):
			// Wall time, not the hub's clock: a shutdown must end even
			// under a test's fake clock that nobody steps any more.
			srv.Stop()
		}
		return nil
	})
	return g.Wait()
}
