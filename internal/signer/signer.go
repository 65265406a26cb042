package signer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
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
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/drover-fleet/drover/internal/bootstrap"
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol/signerv1"
	"github.com/drover-fleet/drover/internal/tokencache"
)

// Options configure a Service. Zero values are replaced by the documented
// defaults.
type Options struct {
	// Client reads FleetNodes, the revocation list, bootstrap token
	// Secrets and the CA Secret of Namespace (a manager's cache), creates
	// the CA Secret if it is missing, writes the CA bundle ConfigMap, and
	// creates TokenReviews and SubjectAccessReviews. Required.
	Client client.Client
	// APIReader reads uncached: a refusal the cache may be behind on is
	// confirmed with it, and the bundle ConfigMap is read with it before
	// a write. Default: Client.
	APIReader client.Reader
	// Informers, when set, tell the signer of FleetNode changes, so that
	// a request for a node created a moment ago waits for the cache
	// rather than reading the API. Default: a refusal is confirmed with
	// APIReader at once.
	Informers cache.Informers
	// Namespace holds the CA Secret, the bundle, bootstrap tokens and the
	// revocation list. Default: drover-system.
	Namespace string
	// BindAddress is where hubs reach the signer (host:port, port 0 picks
	// one). Default: "", no listener (in-process hubs only, Local).
	BindAddress string
	// Hosts are the names and IPs of the signer's serving certificate.
	// Default: 127.0.0.1, localhost and the host name.
	Hosts []string
	// CertificateValidity of the node certificates it signs. Default:
	// hub.DefaultCertificateValidity (7 days).
	CertificateValidity time.Duration
	// TokenNegativeTTL is how long an unknown bootstrap token id is
	// refused without reading the API again. Default:
	// bootstrap.DefaultNegativeTTL.
	TokenNegativeTTL time.Duration
	// Clock signs and times. Default: the wall clock.
	Clock clock.Clock
	// Logger for operators: refusals at info, signatures at debug.
	// Default: discard.
	Logger *slog.Logger
	// Registerer receives the signer's metrics. Default: none.
	Registerer prometheus.Registerer
	// OperatorReviewRate and OperatorReviewBurst bound the TokenReviews
	// of operator tokens the signer has not cached (per second, and the
	// burst). Default: 20 and 50.
	OperatorReviewRate  float64
	OperatorReviewBurst int
}

func (o *Options) defaults() error {
	if o.OperatorReviewRate <= 0 {
		o.OperatorReviewRate, o.OperatorReviewBurst = operatorReviewRate, operatorReviewBurst
	}
	if o.OperatorReviewBurst <= 0 {
		o.OperatorReviewBurst = 1
	}
	if o.Client == nil {
		return errors.New("signer options: Client is required")
	}
	if o.APIReader == nil {
		o.APIReader = o.Client
	}
	if o.Namespace == "" {
		o.Namespace = "drover-system"
	}
	if o.BindAddress != "" {
		if _, _, err := net.SplitHostPort(o.BindAddress); err != nil {
			return fmt.Errorf("signer bind address %q: %w", o.BindAddress, err)
		}
	}
	if len(o.Hosts) == 0 {
		o.Hosts = []string{"127.0.0.1", "localhost"}
		if h, err := os.Hostname(); err == nil {
			o.Hosts = append(o.Hosts, h)
		}
	}
	if o.CertificateValidity <= 0 {
		o.CertificateValidity = hub.DefaultCertificateValidity
	}
	o.Clock = clock.Or(o.Clock)
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return nil
}

// caRefresh is how often the signer reads the CA Secret again (from its
// cache), so that `drover ca rotate` reaches it without a restart.
const caRefresh = 30 * time.Second

// Service signs for hubs. Create it with New and run it with Start (a
// controller-runtime Runnable on every manager replica).
type Service struct {
	signerv1.UnimplementedSignerServer

	opts    Options
	log     *slog.Logger
	metrics *metrics

	// trust is Drover's CA as the signer last read it; bundle the bundle
	// it last wrote; serving its own certificate from trust.
	trust   atomic.Pointer[hub.Trust]
	bundle  atomic.Pointer[hub.Bundle]
	serving atomic.Pointer[tls.Certificate]

	tokens *bootstrap.Verifier
	// callers caches who presented a bearer token and whether they may
	// use the signer (TokenReview and SubjectAccessReview together).
	callers *tokencache.Cache[string]
	// operators caches who presented a bearer token to SignOperator (a
	// TokenReview only: operators need no access to the signer).
	operators *tokencache.Cache[pki.OperatorIdentity]
	// reviews bounds the TokenReviews SignOperator makes for tokens it has
	// not cached: anyone who reaches the signer may call it, and a flood of
	// new tokens must not become a flood of apiserver requests.
	reviews *rate.Limiter

	// changedMu guards changed, closed and replaced at each FleetNode
	// event: requests waiting for the cache wake up and look again.
	changedMu sync.Mutex
	changed   chan struct{}

	ready chan struct{}
	addr  net.Addr
}

// New validates opts and returns a Service that is not running yet.
func New(opts Options) (*Service, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	s := &Service{
		opts:    opts,
		log:     opts.Logger,
		metrics: newMetrics(opts.Registerer),
		tokens: bootstrap.NewVerifier(bootstrap.VerifierOptions{Cached: opts.Client, Live: opts.APIReader,
			Namespace: opts.Namespace, NegativeTTL: opts.TokenNegativeTTL, Clock: opts.Clock}),
		callers:   tokencache.New[string](),
		operators: tokencache.New[pki.OperatorIdentity](),
		reviews:   rate.NewLimiter(rate.Limit(opts.OperatorReviewRate), opts.OperatorReviewBurst),
		changed:   make(chan struct{}),
		ready:     make(chan struct{}),
	}
	return s, nil
}

// NeedLeaderElection is false: every manager replica signs.
func (s *Service) NeedLeaderElection() bool { return false }

// Addr waits until the signer serves and returns where it listens (nil
// without a BindAddress).
func (s *Service) Addr(ctx context.Context) (net.Addr, error) {
	if err := s.wait(ctx); err != nil {
		return nil, err
	}
	return s.addr, nil
}

func (s *Service) wait(ctx context.Context) error {
	select {
	case <-s.ready:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("the signer has not loaded Drover's CA: %w", ctx.Err())
	}
}

// Start loads Drover's CA (creating it if missing), writes its bundle,
// serves until ctx ends, and follows the CA Secret.
func (s *Service) Start(ctx context.Context) error {
	t, err := hub.EnsureTrust(ctx, s.opts.Client, s.opts.Namespace, s.opts.Clock.Now())
	if err != nil {
		return fmt.Errorf("signer: %w", err)
	}
	if err := s.setTrust(ctx, t); err != nil {
		return fmt.Errorf("signer: %w", err)
	}
	if s.opts.Informers != nil {
		if err := s.watchNodes(ctx); err != nil {
			return err
		}
	}
	g, ctx := errgroup.WithContext(ctx)
	if s.opts.BindAddress != "" {
		lis, err := net.Listen("tcp", s.opts.BindAddress)
		if err != nil {
			return fmt.Errorf("signer listen on %s: %w", s.opts.BindAddress, err)
		}
		s.addr = lis.Addr()
		srv := grpc.NewServer(
			grpc.Creds(credentials.NewTLS(&tls.Config{
				GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.serving.Load(), nil },
				MinVersion:     tls.VersionTLS13,
			})),
			// A request is a CSR and a few names.
			grpc.MaxRecvMsgSize(maxRequestBytes),
		)
		signerv1.RegisterSignerServer(srv, s)
		g.Go(func() error {
			if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				return fmt.Errorf("signer serve: %w", err)
			}
			return nil
		})
		g.Go(func() error {
			<-ctx.Done()
			srv.Stop()
			return nil
		})
		s.log.Info("signer serving hubs", "address", s.addr.String())
		// Operators' tools find the signer there (the bundle is public).
		_, port, _ := net.SplitHostPort(s.addr.String())
		advertised := net.JoinHostPort(s.opts.Hosts[0], port)
		if err := hub.WriteSignerAddress(ctx, s.opts.APIReader, s.opts.Client, s.opts.Namespace, advertised); err != nil {
			// Not fatal: `drover logs --signer` still finds it.
			s.log.Error("publish the signer's address for operators' tools", "err", err)
		}
	}
	close(s.ready)
	g.Go(func() error { return s.refresh(ctx) })
	return g.Wait()
}

// maxRequestBytes bounds one request.
const maxRequestBytes = 64 << 10

// setTrust makes t the signer's CA, with a serving certificate of it, and
// writes its bundle when it changed.
func (s *Service) setTrust(ctx context.Context, t *hub.Trust) error {
	b := t.Bundle()
	if old := s.bundle.Load(); old != nil && old.Same(b) {
		return nil
	}
	// ServerName is one of its names: operators' tools check it.
	hosts := append([]string{ServerName}, s.opts.Hosts...)
	certPEM, keyPEM, err := t.Current.IssueServing(ServerName, hosts, s.opts.Clock.Now(), 365*24*time.Hour)
	if err != nil {
		return err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("load the signer's serving certificate: %w", err)
	}
	cert.Certificate = append(cert.Certificate, t.Cross...)
	if err := hub.WriteBundle(ctx, s.opts.APIReader, s.opts.Client, s.opts.Namespace, b); err != nil {
		return err
	}
	s.serving.Store(&cert)
	s.trust.Store(t)
	if s.bundle.Swap(b) != nil {
		s.log.Info("Drover's CA changed: signing with the current CA", "current", t.Current.Cert.Subject.CommonName, "previous", len(t.Previous))
	}
	return nil
}

// refresh reads the CA Secret every caRefresh until ctx ends.
func (s *Service) refresh(ctx context.Context) error {
	tick := s.opts.Clock.NewTicker(caRefresh)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.Chan():
		}
		var sec corev1.Secret
		err := s.opts.Client.Get(ctx, client.ObjectKey{Namespace: s.opts.Namespace, Name: hub.CASecretName}, &sec)
		var t *hub.Trust
		if err == nil {
			t, err = hub.ParseTrust(&sec)
		}
		if err == nil {
			err = s.setTrust(ctx, t)
		}
		if err != nil && ctx.Err() == nil {
			s.log.Error("re-read Drover's CA; keeping the one loaded", "err", err)
		}
	}
}

// metrics are the signer's Prometheus metrics.
type metrics struct {
	requests  *prometheus.CounterVec
	liveReads prometheus.Counter
	reviews   prometheus.Counter
	// reviewsLimited counts new operator tokens refused by the review
	// rate limit.
	reviewsLimited prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "drover_signer_requests_total",
			Help: "Requests to the signer, by method and gRPC result code."}, []string{"method", "code"}),
		liveReads: prometheus.NewCounter(prometheus.CounterOpts{Name: "drover_signer_api_reads_total",
			Help: "FleetNode reads from the API to confirm a refusal the signer's cache was behind on."}),
		reviews: prometheus.NewCounter(prometheus.CounterOpts{Name: "drover_signer_access_reviews_total",
			Help: "TokenReviews and SubjectAccessReviews the signer asked (its cache missed)."}),
		reviewsLimited: prometheus.NewCounter(prometheus.CounterOpts{Name: "drover_signer_operator_reviews_limited_total",
			Help: "Operator tokens SignOperator refused (ResourceExhausted) because new tokens came faster than it reviews them."}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.liveReads, m.reviews, m.reviewsLimited)
	}
	return m
}
