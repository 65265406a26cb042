package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/featuregate"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrlmanager "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/drover-fleet/drover/internal/features"
	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/hub/mqttbridge"
	"github.com/drover-fleet/drover/internal/hubsetup"
	"github.com/drover-fleet/drover/internal/manager"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/signer"
	"github.com/drover-fleet/drover/internal/statemetrics"
	"github.com/drover-fleet/drover/internal/tenancy/tenancyadmit"
)

// componentOptions are the flags of the parts `drover server`, `drover
// manager` and `drover hub` run.
type componentOptions struct {
	namespace        string
	metricsAddr      string
	pprofAddr        string
	healthAddr       string
	hubName          string
	hubListen        string
	hubHosts         []string
	heartbeat        time.Duration
	offlineTimeout   time.Duration
	heartbeatRefresh time.Duration
	registerRate     float64
	registerRateSrc  float64
	certValidity     time.Duration
	leaderElect      bool
	gates            featuregate.MutableFeatureGate
	mqtt             mqttOptions
	webhook          webhookOptions
	signer           signerOptions
	sessionAPI       sessionAPIOptions
}

// signerOptions are the signer's flags: where the manager serves it, and
// where a hub finds it.
type signerOptions struct {
	bind  string
	hosts []string
	addr  string
}

func (s *signerOptions) addServeFlags(fs *pflag.FlagSet, defaultBind string) {
	fs.StringVar(&s.bind, "signer-bind-address", defaultBind, "address the signer (Drover's CA: hubs' certificates, bootstrap tokens) listens on over TLS for hubs (drover hub --signer); port 0 picks a free one; 0 serves no remote hubs")
	fs.StringSliceVar(&s.hosts, "signer-hosts", nil, "names and IPs of the signer's serving certificate, as hubs reach it; the first, with the port, is published for `drover logs` on the drover-ca-bundle ConfigMap (default: 127.0.0.1, localhost, host name)")
}

func (s *signerOptions) addClientFlags(fs *pflag.FlagSet) {
	fs.StringVar(&s.addr, "signer", "", "host:port of the manager's signer (its --signer-bind-address), which signs certificates and checks bootstrap tokens for this hub, "+
		"so that the hub needs no Secret access. Empty: the hub signs with the CA Secret itself (it needs to read Secrets in --namespace)")
}

func (s *signerOptions) validate() error {
	if s.bind != "" && s.bind != "0" {
		if _, _, err := net.SplitHostPort(s.bind); err != nil {
			return fmt.Errorf("--signer-bind-address %q: %w", s.bind, err)
		}
	}
	if s.addr != "" {
		if _, _, err := net.SplitHostPort(s.addr); err != nil {
			return fmt.Errorf("--signer %q: want host:port: %w", s.addr, err)
		}
	}
	return nil
}

// webhookOptions are the tenancy webhook's flags (`drover manager` and
// `drover server`).
type webhookOptions struct {
	bind    string
	url     string
	service string
	hosts   []string
	// mayDisable: "0" switches it off (`drover manager` only; `drover
	// server` always enforces NodeGrants at admission).
	mayDisable bool
}

func (w *webhookOptions) addFlags(fs *pflag.FlagSet, defaultBind string, mayDisable bool) {
	w.mayDisable = mayDisable
	usage := "address the tenancy admission webhook (NodeGrants) listens on over TLS; port 0 picks a free one"
	if mayDisable {
		usage += "; 0 disables it (then only the scheduler enforces NodeGrants)"
	}
	fs.StringVar(&w.bind, "webhook-bind-address", defaultBind, usage)
	fs.StringVar(&w.url, "webhook-url", "", "https URL the kube-apiserver calls the webhook at (default: https://<bind address>, 127.0.0.1 for an unspecified host)")
	fs.StringVar(&w.service, "webhook-service", "", "namespace/name[:port] of the Service in front of the webhook port, for a manager running in the cluster (instead of --webhook-url)")
	fs.StringSliceVar(&w.hosts, "webhook-hosts", nil, "names and IPs of the webhook's serving certificate (default: the URL's host, or the Service's DNS names)")
}

func (w *webhookOptions) validate() error {
	if w.bind == "0" && w.mayDisable {
		return nil
	}
	if _, _, err := net.SplitHostPort(w.bind); err != nil {
		return fmt.Errorf("--webhook-bind-address %q: %w", w.bind, err)
	}
	if w.url != "" && w.service != "" {
		return errors.New("--webhook-url and --webhook-service: give one of them")
	}
	if w.service != "" {
		if _, err := tenancyadmit.ParseService(w.service); err != nil {
			return fmt.Errorf("--webhook-service: %w", err)
		}
	}
	return nil
}

// options are the webhook's options; nil when it is off.
func (w *webhookOptions) options(namespace string, log *slog.Logger) *tenancyadmit.Options {
	if w.bind == "0" && w.mayDisable {
		return nil
	}
	o := &tenancyadmit.Options{Namespace: namespace, BindAddress: w.bind, URL: w.url, Hosts: w.hosts,
		Logger: log.With("component", "tenancy-webhook"), Registerer: metrics.Registry}
	if w.service != "" {
		o.Service, _ = tenancyadmit.ParseService(w.service) // checked by validate
	}
	return o
}

func (c *componentOptions) addManagerFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.namespace, "namespace", "drover-system", "namespace for Drover's CA, bootstrap tokens and hub Leases")
	fs.StringVar(&c.metricsAddr, "metrics-bind-address", "127.0.0.1:8080", "Prometheus /metrics address; 0 disables")
	fs.StringVar(&c.pprofAddr, "pprof-bind-address", "", "Go pprof address for profiling (empty disables)")
	fs.StringVar(&c.healthAddr, "health-probe-bind-address", "0", "address of /healthz and /readyz for liveness and readiness probes, e.g. :8081; 0 disables")
	fs.DurationVar(&c.offlineTimeout, "offline-timeout", 5*time.Minute, "a node silent this long is Offline")
	fs.DurationVar(&c.certValidity, "certificate-validity", hub.DefaultCertificateValidity, "validity of the node certificates the signer signs; agents renew theirs after two thirds of it")
	c.gates = features.New()
	fs.Var(features.Flag{Gate: c.gates}, "feature-gates", "comma-separated name=bool pairs (a bare name means true). Known: "+strings.Join(c.gates.KnownFeatures(), "; "))
}

func (c *componentOptions) addHubFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.hubName, "hub-name", "", "hub name in FleetNode status and its Lease (default: host name)")
	fs.StringVar(&c.hubListen, "hub-listen", "127.0.0.1:7443", "address agents connect to")
	fs.StringSliceVar(&c.hubHosts, "hub-hosts", nil, "names and IPs for the hub's serving certificate (default: 127.0.0.1, localhost, host name)")
	fs.DurationVar(&c.heartbeat, "heartbeat-interval", 30*time.Second, "heartbeat interval agents are told to use")
	fs.DurationVar(&c.heartbeatRefresh, "heartbeat-refresh", 10*time.Minute, "how often a live node's coarse lastHeartbeatTime is written")
	fs.Float64Var(&c.registerRate, "register-rate", 500, "Register calls per second the hub accepts from all sources (burst: twice that); negative: no limit")
	fs.Float64Var(&c.registerRateSrc, "register-rate-per-source", 20, "Register calls per second the hub accepts from one IPv4 address or IPv6 /64 (burst: 50 at the default, else twice the rate); negative: no limit")
	c.mqtt.addFlags(fs)
}

func (c *componentOptions) validate(withHub bool) error {
	if err := c.signer.validate(); err != nil {
		return err
	}
	if err := c.sessionAPI.validate(); err != nil {
		return err
	}
	if c.certValidity != 0 && c.certValidity < 10*time.Minute {
		return fmt.Errorf("--certificate-validity %v: want at least 10m (agents renew after two thirds of it, and may renew once a minute)", c.certValidity)
	}
	if c.webhook.bind != "" {
		if err := c.webhook.validate(); err != nil {
			return err
		}
	}
	if withHub && c.offlineTimeout <= c.heartbeat {
		return fmt.Errorf("--offline-timeout %v must be longer than --heartbeat-interval %v", c.offlineTimeout, c.heartbeat)
	}
	if withHub {
		if c.hubName != "" && protocol.ValidNodeName(c.hubName) != nil {
			return fmt.Errorf("--hub-name %q: want a lowercase DNS name (a-z, 0-9, '-' and '.', at most 253 characters), as it names the hub's Lease", c.hubName)
		}
		if _, _, err := net.SplitHostPort(c.hubListen); err != nil {
			return fmt.Errorf("--hub-listen %q: %w", c.hubListen, err)
		}
		if err := c.mqtt.validate(); err != nil {
			return err
		}
	}
	return nil
}

// running is what runComponents started.
type running struct {
	mgr       ctrl.Manager
	admission *tenancyadmit.Server // nil when the webhook is off
	hub       *hub.Hub
	mqtt      *mqttbridge.Bridge // nil when MQTT is off
	signer    *signer.Service    // nil without the manager
	metrics   *metricsEndpoint   // nil with --metrics-bind-address 0
}

// newComponents builds a controller-runtime manager holding the manager's
// controllers and/or a hub. Start it with mgr.Start(ctx).
func newComponents(cfg *rest.Config, c componentOptions, withManager, withHub bool, log *slog.Logger) (*running, error) {
	// A hub registers nodes in bursts (about a dozen requests each) and
	// writes their transitions; the CLI's 50 requests/s would make a cold
	// start of 10,000 nodes take 20 minutes.
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 500, 1000
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: manager.Scheme(),
		// Served by metricsEndpoint, which tells the address it got.
		Metrics: metricsserver.Options{BindAddress: "0"},
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			// Only Drover's own Secrets and Leases are ever read.
			&corev1.Secret{}:        {Namespaces: map[string]cache.Config{c.namespace: {}}},
			&coordinationv1.Lease{}: {Namespaces: map[string]cache.Config{c.namespace: {}}},
			// Hubs check the revocation list at every connect: only that
			// ConfigMap is watched, and read without a copy (hub.revokedKey
			// only reads it).
			&corev1.ConfigMap{}: {Namespaces: map[string]cache.Config{c.namespace: {}},
				Field: fields.OneTermEqualSelector("metadata.name", hub.RevokedKeysName), UnsafeDisableDeepCopy: ptr.To(true)},
		}},
		HealthProbeBindAddress:  cmp.Or(c.healthAddr, "0"),
		PprofBindAddress:        c.pprofAddr,
		LeaderElection:          withManager && c.leaderElect,
		LeaderElectionID:        "drover-manager",
		LeaderElectionNamespace: c.namespace,
		// A manager that stops cleanly lets the next one lead at once,
		// not after the Lease expires.
		LeaderElectionReleaseOnCancel: true,
	})
	if err == nil && c.healthAddr != "" && c.healthAddr != "0" {
		err = errors.Join(mgr.AddHealthzCheck("ping", healthz.Ping), mgr.AddReadyzCheck("ping", healthz.Ping))
	}
	if err != nil {
		return nil, fmt.Errorf("create manager: %w", err)
	}
	r := &running{mgr: mgr}
	if c.metricsAddr != "" && c.metricsAddr != "0" {
		r.metrics = newMetricsEndpoint(c.metricsAddr, metrics.Registry)
		if err := mgr.Add(r.metrics); err != nil {
			return nil, fmt.Errorf("serve metrics: %w", err)
		}
	}
	if withManager {
		var admission *tenancyadmit.Options
		if c.webhook.bind != "" {
			admission = c.webhook.options(c.namespace, log)
		}
		parts, err := manager.Setup(mgr, manager.Options{
			NodeJobs: !c.gates.Enabled(features.DisableNodeTaskV1alpha2), Tasks: true, Apps: true, Admission: admission})
		if err != nil {
			return nil, err
		}
		r.admission = parts.Admission
		if err := c.sessionAPI.setup(mgr, parts.Apps, log); err != nil {
			return nil, err
		}
		state := statemetrics.New(statemetrics.Options{Reader: mgr.GetCache(), Namespace: c.namespace, Elected: mgr.Elected(),
			NodeJobs: !c.gates.Enabled(features.DisableNodeTaskV1alpha2), Tasks: true, Logger: log.With("component", "statemetrics")})
		// A second manager in one process (tests) shares the first one's.
		if err := metrics.Registry.Register(state); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			return nil, fmt.Errorf("register the object metrics: %w", err)
		}
		bind := c.signer.bind
		if bind == "0" {
			bind = ""
		}
		r.signer, err = signer.New(signer.Options{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Informers: mgr.GetCache(),
			Namespace: c.namespace, BindAddress: bind, Hosts: c.signer.hosts, CertificateValidity: c.certValidity,
			Logger: log.With("component", "signer"), Registerer: metrics.Registry})
		if err == nil {
			err = mgr.Add(r.signer)
		}
		if err != nil {
			return nil, fmt.Errorf("set up the signer: %w", err)
		}
	}
	if withHub {
		hubSigner, err := c.hubSigner(cfg, mgr, r.signer, log)
		if err != nil {
			return nil, err
		}
		h, err := hubsetup.Setup(mgr, hubsetup.Options{
			Hub: hub.Options{
				Name:              c.hubName,
				Namespace:         c.namespace,
				ListenAddress:     c.hubListen,
				ServingHosts:      c.hubHosts,
				HeartbeatInterval: c.heartbeat,
				OfflineTimeout:    c.offlineTimeout,
				HeartbeatRefresh:  c.heartbeatRefresh,
				RegisterRate:      c.registerRate,
				// Per source, as a NAT address may hold many agents.
				RegisterRatePerSource: c.registerRateSrc,
				CertificateValidity:   c.certValidity,
				Signer:                hubSigner,
				Logger:                log,
				Registerer:            metrics.Registry,
			},
			NodeJobs: !c.gates.Enabled(features.DisableNodeTaskV1alpha2),
			Tasks:    true,
			Apps:     true,
			MQTT:     c.mqtt.options(),
		})
		if err != nil {
			return nil, err
		}
		r.hub, r.mqtt = h.Hub, h.MQTT
	}
	return r, nil
}

// hubSigner is the signer of the hub: the manager's in this process, or
// the one --signer names; nil (the hub signs with the CA Secret) without.
func (c *componentOptions) hubSigner(cfg *rest.Config, mgr ctrl.Manager, local *signer.Service, log *slog.Logger) (hub.Signer, error) {
	switch {
	case local != nil:
		return local.Local(), nil
	case c.signer.addr == "":
		log.Warn("no --signer: this hub signs with Drover's CA Secret itself and reads bootstrap tokens; " +
			"give --signer (the manager's --signer-bind-address) so that hubs hold no CA key")
		return nil, nil
	}
	tokens, err := signer.TokenSource(cfg)
	if err != nil {
		return nil, fmt.Errorf("--signer: %w", err)
	}
	name := c.hubName
	if name == "" {
		if name, err = os.Hostname(); err != nil {
			return nil, fmt.Errorf("--signer: no --hub-name and no host name: %w", err)
		}
	}
	cl, err := signer.NewClient(signer.ClientOptions{Address: c.signer.addr, Hub: name, Reader: mgr.GetAPIReader(),
		Namespace: c.namespace, Token: tokens})
	if err != nil {
		return nil, err
	}
	// Closed when the manager stops.
	if err := mgr.Add(ctrlmanager.RunnableFunc(func(ctx context.Context) error {
		<-ctx.Done()
		return cl.Close()
	})); err != nil {
		return nil, err
	}
	return cl, nil
}

// signerAddress waits for the signer to serve and returns where it
// listens ("" when it serves no remote hubs).
func (r *running) signerAddress(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	a, err := r.signer.Addr(ctx)
	if err != nil {
		return "", err
	}
	if a == nil {
		return "", nil
	}
	return a.String(), nil
}

// webhookAddress waits for the tenancy webhook to serve and be installed,
// and returns where it listens.
func (r *running) webhookAddress(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	a, err := r.admission.Addr(ctx)
	if err != nil {
		return "", fmt.Errorf("tenancy webhook did not start: %w", err)
	}
	return a.String(), nil
}

// metricsURL waits for the metrics endpoint to listen and returns its
// URL; "" when metrics are off.
func (r *running) metricsURL(ctx context.Context) (string, error) {
	if r.metrics == nil {
		return "", nil
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return r.metrics.URL(ctx)
}

// hubAddress waits for the hub to listen and returns host:port.
func (r *running) hubAddress(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	a, err := r.hub.Addr(ctx)
	if err != nil {
		return "", fmt.Errorf("hub did not start listening: %w", err)
	}
	host, port, _ := net.SplitHostPort(a.String())
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	p, _ := strconv.Atoi(port)
	return net.JoinHostPort(host, strconv.Itoa(p)), nil
}
