package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
)

// DefaultReadyTimeout is how long Start waits for etcd and then for the
// apiserver's /readyz when Options.ReadyTimeout is zero. A warm start takes a
// few seconds; the margin is for a loaded 2-core machine.
const DefaultReadyTimeout = 2 * time.Minute

// Options configure Start.
type Options struct {
	// DataDir holds everything the control plane keeps: etcd data in
	// DataDir/etcd, certificates and keys in DataDir/pki, the admin
	// kubeconfig at DataDir/kubeconfig, logs in DataDir/*.log. Required.
	// Created with mode 0700 if missing.
	DataDir string

	// APIServerPort is the loopback port kube-apiserver serves on. Zero
	// picks a free port at each start (the kubeconfig is rewritten at each
	// start, so clients that read it always find the server).
	APIServerPort int

	// Logger receives the control plane's own messages and the errors of
	// kube-apiserver and etcd (their full logs go to files in DataDir).
	// Nil discards.
	Logger *slog.Logger

	// ReadyTimeout bounds the wait for etcd and then for /readyz. Zero means
	// DefaultReadyTimeout.
	ReadyTimeout time.Duration

	// ExtraAPIServerArgs are appended to the kube-apiserver flags Start
	// chooses, so they can override them (e.g. "--runtime-config=...").
	// The logging flags (--v, --vmodule) have no effect.
	ExtraAPIServerArgs []string
}

func (o *Options) validate() error {
	if o.DataDir == "" {
		return errors.New("controlplane: Options.DataDir is required")
	}
	if o.APIServerPort < 0 || o.APIServerPort > 65535 {
		return fmt.Errorf("controlplane: Options.APIServerPort %d is not a port", o.APIServerPort)
	}
	if o.ReadyTimeout < 0 {
		return fmt.Errorf("controlplane: Options.ReadyTimeout %s is negative", o.ReadyTimeout)
	}
	return nil
}

func (o *Options) setDefaults() {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = DefaultReadyTimeout
	}
	if abs, err := filepath.Abs(o.DataDir); err == nil {
		o.DataDir = abs
	}
}

// ControlPlane is a running etcd + kube-apiserver pair. Stop it by
// cancelling the ctx given to Start, then call Wait.
type ControlPlane struct {
	restConfig     *rest.Config
	kubeconfigPath string

	done chan struct{}
	// err is written once before done is closed.
	err error
	// gate forwards the embedded components' errors to the Logger.
	gate *errGate
}

// Quiet stops forwarding the embedded components' errors to the Logger
// (they stay in apiserver.log and etcd.log). A process shutting down calls
// it first: the informers and controllers it stops before the control
// plane log errors (caches that never synced, closed watches) that say
// nothing about a fault.
func (c *ControlPlane) Quiet() { c.gate.stopping() }

// started guards the one-per-process rule; see the package doc.
var started atomic.Bool

// Start starts etcd and kube-apiserver, waits until the apiserver is ready,
// writes the admin kubeconfig and returns. The control plane runs until ctx is
// cancelled. Start fails, and leaves nothing running, if any step fails or
// does not finish within Options.ReadyTimeout.
func Start(ctx context.Context, opts Options) (*ControlPlane, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	opts.setDefaults()
	if !started.CompareAndSwap(false, true) {
		return nil, errors.New("controlplane: already started once in this process; kube-apiserver keeps process-wide state, run one control plane per process")
	}
	log := opts.Logger
	begin := time.Now()

	if err := os.MkdirAll(opts.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir %s: %w", opts.DataDir, err)
	}
	p, err := ensurePKI(filepath.Join(opts.DataDir, "pki"), time.Now())
	if err != nil {
		return nil, err
	}

	apiLog, err := openLog(filepath.Join(opts.DataDir, "apiserver.log"))
	if err != nil {
		return nil, fmt.Errorf("open apiserver log: %w", err)
	}
	etcdLog, err := openLog(filepath.Join(opts.DataDir, "etcd.log"))
	if err != nil {
		apiLog.Close()
		return nil, fmt.Errorf("open etcd log: %w", err)
	}
	closeLogs := func() { apiLog.Close(); etcdLog.Close() }

	// Errors of the apiserver and etcd reach the Logger through the gate:
	// held back while starting, forwarded while serving (see errGate).
	gate := &errGate{}
	forward := gate.handler(log.Handler())
	// klog is process-wide: from here on every klog line of this process
	// goes to apiserver.log, and errors also to the Logger.
	klog.SetSlogLogger(slog.New(newTeeHandler(apiLog, slog.LevelInfo,
		forward.WithAttrs([]slog.Attr{slog.String("component", "kube-apiserver")}))))

	etcd, etcdURL, err := startEtcd(ctx, filepath.Join(opts.DataDir, "etcd"),
		newEtcdLogger(etcdLog, forward.WithAttrs([]slog.Attr{slog.String("component", "etcd")})),
		opts.ReadyTimeout)
	if err != nil {
		gate.failed()
		closeLogs()
		return nil, err
	}
	log.Debug("etcd ready", "url", etcdURL, "elapsed", time.Since(begin).Round(time.Millisecond))

	listener, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(opts.APIServerPort)))
	if err != nil {
		gate.failed()
		etcd.Close()
		closeLogs()
		return nil, fmt.Errorf("listen for kube-apiserver on 127.0.0.1:%d: %w", opts.APIServerPort, err)
	}
	port := listener.Addr().(*net.TCPAddr).Port
	host := "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port))

	args := append(apiserverArgs(p, etcdURL, filepath.Join(opts.DataDir, "pki")), opts.ExtraAPIServerArgs...)
	apiCtx, stopAPI := context.WithCancel(ctx)
	apiDone := make(chan error, 1)
	go func() { apiDone <- runAPIServer(apiCtx, args, listener) }()

	c := &ControlPlane{
		restConfig:     adminRESTConfig(host, p),
		kubeconfigPath: filepath.Join(opts.DataDir, "kubeconfig"),
		done:           make(chan struct{}),
		gate:           gate,
	}

	// stop tears down after a failed start: apiserver first, then etcd.
	stop := func() {
		gate.failed()
		stopAPI()
		<-apiDone
		etcd.Close()
		closeLogs()
	}
	if err := waitReady(ctx, c.restConfig, opts.ReadyTimeout, apiDone); err != nil {
		stop()
		return nil, err
	}
	if err := writeKubeconfig(c.kubeconfigPath, host, p); err != nil {
		stop()
		return nil, err
	}
	gcStopped, err := startGarbageCollector(apiCtx, c.restConfig)
	if err != nil {
		stop()
		return nil, err
	}
	aggStopped, err := startRoleAggregation(apiCtx, c.restConfig)
	if err != nil {
		stop()
		gcStopped()
		return nil, err
	}
	gate.serving()
	log.Info("control plane ready", "url", host, "kubeconfig", c.kubeconfigPath,
		"elapsed", time.Since(begin).Round(time.Millisecond))

	go func() {
		var err error
		select {
		case <-ctx.Done():
			// Shutdown asked for: the errors of closing listeners and
			// connections are noise, so stop forwarding them.
			gate.stopping()
			if err = <-apiDone; err != nil {
				err = fmt.Errorf("kube-apiserver: %w", err)
			}
		case err = <-apiDone:
			if err == nil {
				err = errors.New("kube-apiserver stopped unexpectedly (see apiserver.log)")
			}
			err = fmt.Errorf("kube-apiserver: %w", err)
		case err = <-etcd.Err():
			err = fmt.Errorf("etcd: %w", err)
			stopAPI()
			<-apiDone
		}
		stopAPI()
		gcStopped()
		aggStopped()
		etcd.Close()
		closeLogs()
		c.err = err
		close(c.done)
	}()
	return c, nil
}

// RESTConfig returns a copy of the admin client configuration
// (user drover-admin in group system:masters). QPS and Burst are left zero:
// callers choose their own client-side rate limits.
func (c *ControlPlane) RESTConfig() *rest.Config { return rest.CopyConfig(c.restConfig) }

// KubeconfigPath returns the path of the admin kubeconfig written by Start.
func (c *ControlPlane) KubeconfigPath() string { return c.kubeconfigPath }

// Done is closed when both the apiserver and etcd have exited.
func (c *ControlPlane) Done() <-chan struct{} { return c.done }

// Wait blocks until both the apiserver and etcd have exited. It returns nil
// after a shutdown caused by cancelling Start's ctx, and the cause otherwise.
func (c *ControlPlane) Wait() error {
	<-c.done
	return c.err
}

func adminRESTConfig(host string, p *pki) *rest.Config {
	return &rest.Config{
		Host: host,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   p.caPEM,
			CertData: p.adminCertPEM,
			KeyData:  p.adminKeyPEM,
		},
	}
}

// waitReady polls /readyz until it answers 200, the apiserver exits, the
// timeout passes or ctx ends.
func waitReady(ctx context.Context, cfg *rest.Config, timeout time.Duration, apiDone <-chan error) error {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return fmt.Errorf("client for readiness check: %w", err)
	}
	hc.Timeout = 5 * time.Second
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()

	var last string
	for {
		ok, detail := probeReadyz(ctx, hc, cfg.Host)
		if ok {
			return nil
		}
		last = detail
		select {
		case err := <-apiDone:
			if err == nil {
				err = errors.New("exited without error")
			}
			return fmt.Errorf("kube-apiserver failed while starting (see apiserver.log): %w", err)
		case <-deadline.C:
			return fmt.Errorf("kube-apiserver at %s not ready after %s (see apiserver.log); last /readyz: %s", cfg.Host, timeout, last)
		case <-ctx.Done():
			return fmt.Errorf("wait for kube-apiserver: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

func probeReadyz(ctx context.Context, hc *http.Client, host string) (bool, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, host+"/readyz?verbose", nil)
	if err != nil {
		return false, err.Error()
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode == http.StatusOK {
		return true, ""
	}
	return false, fmt.Sprintf("HTTP %d: %s", resp.StatusCode, failedChecks(body))
}

// failedChecks keeps the failing lines ("[-]...") of a verbose /readyz body.
func failedChecks(body []byte) string {
	var failed []string
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "[-]") {
			failed = append(failed, strings.TrimPrefix(line, "[-]"))
		}
	}
	if len(failed) == 0 {
		return strings.TrimSpace(string(body))
	}
	return strings.Join(failed, "; ")
}
