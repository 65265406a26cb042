package tenancyadmit

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
)

// Options configure the webhook server.
type Options struct {
	// Namespace holds the serving certificate's Secret (Drover's).
	Namespace string
	// BindAddress is host:port to listen on; port 0 picks a free one.
	BindAddress string
	// URL is how the API server reaches the webhook (https://host:port,
	// Path if it has none; the server answers on every path). Empty, and no Service: https on the bound
	// address (127.0.0.1 for an unspecified host) and port, for an API
	// server on this machine.
	URL string
	// Service is how the API server reaches the webhook in a cluster:
	// through this Service (port 443 if 0). Exclusive with URL.
	Service *Service
	// Hosts are the names and IPs of the serving certificate. Default: the
	// URL's host, or the Service's DNS names.
	Hosts []string
	// Logger for refusals and errors. Default: discard.
	Logger *slog.Logger
	// Registerer receives drover_tenancy_admission_total. Default: none.
	Registerer prometheus.Registerer
}

// Service names the Service in front of the manager's webhook port.
type Service struct {
	Namespace, Name string
	Port            int32
}

// ParseService parses namespace/name[:port].
func ParseService(s string) (*Service, error) {
	nsName, port, hasPort := strings.Cut(s, ":")
	ns, name, ok := strings.Cut(nsName, "/")
	if !ok || ns == "" || name == "" {
		return nil, fmt.Errorf("webhook service %q: want namespace/name[:port]", s)
	}
	svc := &Service{Namespace: ns, Name: name, Port: 443}
	if hasPort {
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil || p == 0 {
			return nil, fmt.Errorf("webhook service %q: port %q is not a port", s, port)
		}
		svc.Port = int32(p)
	}
	return svc, nil
}

// Server serves the webhook on all of the manager's replicas (it needs no
// leadership) and installs its certificate and configuration.
type Server struct {
	opts    Options
	cache   client.Reader
	api     client.Reader
	writer  client.Writer
	handler *Handler
	ready   chan struct{}
	addr    net.Addr
}

// Setup adds the webhook server to mgr. It watches NodeGrants (and reads
// Namespaces and FleetNodes) through mgr's cache.
func Setup(mgr ctrl.Manager, opts Options) (*Server, error) {
	if opts.Namespace == "" {
		return nil, errors.New("tenancy webhook: no namespace for its certificate's Secret")
	}
	if _, _, err := net.SplitHostPort(opts.BindAddress); err != nil {
		return nil, fmt.Errorf("tenancy webhook bind address %q: %w", opts.BindAddress, err)
	}
	if opts.URL != "" && opts.Service != nil {
		return nil, errors.New("tenancy webhook: give a URL or a Service, not both")
	}
	if opts.URL != "" {
		u, err := url.Parse(opts.URL)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return nil, fmt.Errorf("tenancy webhook URL %q: want https://host[:port][/path]", opts.URL)
		}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{opts: opts, cache: mgr.GetCache(), api: mgr.GetAPIReader(), writer: mgr.GetClient(), ready: make(chan struct{})}
	policy := &policyCache{cache: s.cache, api: s.api, log: opts.Logger}
	inf, err := mgr.GetCache().GetInformer(context.Background(), &fleetv1.NodeGrant{})
	if err != nil {
		return nil, fmt.Errorf("tenancy webhook: watch NodeGrants: %w", err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { policy.invalidate() },
		UpdateFunc: func(any, any) { policy.invalidate() },
		DeleteFunc: func(any) { policy.invalidate() },
	}); err != nil {
		return nil, fmt.Errorf("tenancy webhook: watch NodeGrants: %w", err)
	}
	// Namespaces and FleetNodes are read at every request: watched from
	// the start, so that the first requests need no API round trip.
	for _, o := range []client.Object{&corev1.Namespace{}, &fleetv1.FleetNode{}} {
		if _, err := mgr.GetCache().GetInformer(context.Background(), o); err != nil {
			return nil, fmt.Errorf("tenancy webhook: watch %T: %w", o, err)
		}
	}
	s.handler = newHandler(s.cache, s.api, policy, opts.Namespace, opts.Logger, opts.Registerer)
	if err := mgr.Add(s); err != nil {
		return nil, err
	}
	return s, nil
}

// NeedLeaderElection: every replica serves the webhook.
func (s *Server) NeedLeaderElection() bool { return false }

// Handler is the admission handler, for tests that call it directly.
func (s *Server) Handler() *Handler { return s.handler }

// Start listens, makes sure of the certificate and the webhook
// configuration, and serves until ctx ends.
func (s *Server) Start(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.opts.BindAddress)
	if err != nil {
		return fmt.Errorf("tenancy webhook: listen on %s: %w", s.opts.BindAddress, err)
	}
	defer ln.Close()
	cc, hosts := s.clientConfig(ln.Addr())
	cert, caPEM, err := ensureCert(ctx, s.api, s.writer, s.opts.Namespace, hosts, time.Now())
	if err != nil {
		return err
	}
	cc.CABundle = caPEM
	srv := &http.Server{
		// Every path: a URL given with another path (a proxy's) still
		// reaches it.
		Handler:           &admission.Webhook{Handler: s.handler},
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.opts.Logger.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.ServeTLS(ln, "", "") }()
	stop := func() error {
		// The API server gives up on a call after timeoutSeconds anyway.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeoutSeconds*time.Second)
		defer cancel()
		err := srv.Shutdown(sctx)
		if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
			err = errors.Join(err, serr)
		}
		return err
	}
	if err := ensureConfiguration(ctx, s.api, s.writer, configuration(cc)); err != nil {
		return errors.Join(err, stop())
	}
	s.opts.Logger.Info("tenancy webhook serving", "address", ln.Addr().String(), "url", ptr.Deref(cc.URL, ""),
		"service", cc.Service != nil)
	if !s.probe(ctx) {
		return stop()
	}
	s.addr = ln.Addr()
	close(s.ready)
	select {
	case <-ctx.Done():
		return stop()
	case err := <-served:
		return fmt.Errorf("tenancy webhook: %w", err)
	}
}

// probeName is the Task the server asks the API server to create in a dry
// run, until the answer is the webhook's: the API server has loaded the
// configuration and reaches a webhook server.
const (
	probeName   = "drover-tenancy-webhook-probe"
	probeAnswer = "the tenancy webhook answers (a dry-run probe)"
	// probeInterval between probes; probeWarn: how often a webhook that
	// does not answer yet is logged.
	probeInterval = 200 * time.Millisecond
	probeWarn     = 30 * time.Second
)

// probe waits until the API server calls the webhook (true), or ctx ends.
func (s *Server) probe(ctx context.Context) bool {
	began, warned := time.Now(), time.Now()
	tick := time.NewTicker(probeInterval)
	defer tick.Stop()
	for {
		t := &batchv1.Task{ObjectMeta: metav1.ObjectMeta{Namespace: s.opts.Namespace, Name: probeName},
			Spec: batchv1.TaskSpec{Command: []string{"true"}}}
		err := s.writer.Create(ctx, t, client.DryRunAll)
		if err != nil && strings.Contains(err.Error(), probeAnswer) {
			return true
		}
		if time.Since(warned) >= probeWarn {
			warned = time.Now()
			s.opts.Logger.Warn("the API server does not call the tenancy webhook yet", "after", time.Since(began).Round(time.Second), "err", err)
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
}

// Addr waits until the webhook is served and installed and the API server
// calls it, and returns the address it listens on.
func (s *Server) Addr(ctx context.Context) (net.Addr, error) {
	select {
	case <-s.ready:
		return s.addr, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// clientConfig is how the API server reaches the webhook listening on
// addr, and the names its certificate must hold.
func (s *Server) clientConfig(addr net.Addr) (admissionregv1.WebhookClientConfig, []string) {
	if svc := s.opts.Service; svc != nil {
		hosts := s.opts.Hosts
		if len(hosts) == 0 {
			hosts = []string{svc.Name + "." + svc.Namespace + ".svc", svc.Name + "." + svc.Namespace + ".svc.cluster.local"}
		}
		return admissionregv1.WebhookClientConfig{Service: &admissionregv1.ServiceReference{
			Namespace: svc.Namespace, Name: svc.Name, Path: ptr.To(Path), Port: ptr.To(svc.Port)}}, hosts
	}
	u := s.opts.URL
	if u == "" {
		host, port, _ := net.SplitHostPort(addr.String())
		if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
			host = "127.0.0.1"
		}
		u = "https://" + net.JoinHostPort(host, port)
	}
	pu, _ := url.Parse(u) // checked by Setup
	if pu.Path == "" || pu.Path == "/" {
		pu.Path = Path
	}
	hosts := s.opts.Hosts
	if len(hosts) == 0 {
		hosts = []string{pu.Hostname()}
	}
	return admissionregv1.WebhookClientConfig{URL: ptr.To(pu.String())}, hosts
}
