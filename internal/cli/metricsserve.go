package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metricsEndpoint serves /metrics of a registry over plain HTTP. It
// replaces controller-runtime's metrics server so that the address it
// listens on is known (--metrics-bind-address 127.0.0.1:0 picks a free
// port, which `ready metrics=` prints for scripts, tests and scrapers).
type metricsEndpoint struct {
	bind     string
	gatherer prometheus.Gatherer
	// once guards ready, closed when addr is set or listening failed.
	once  sync.Once
	ready chan struct{}
	addr  net.Addr // nil when listening failed; read after ready
	err   error
}

func newMetricsEndpoint(bind string, g prometheus.Gatherer) *metricsEndpoint {
	return &metricsEndpoint{bind: bind, gatherer: g, ready: make(chan struct{})}
}

// NeedLeaderElection: every replica serves its own metrics.
func (m *metricsEndpoint) NeedLeaderElection() bool { return false }

// Start serves until ctx ends.
func (m *metricsEndpoint) Start(ctx context.Context) error {
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", m.bind)
	if err != nil {
		err = fmt.Errorf("--metrics-bind-address %s: %w (give a free address, or 0 to serve no metrics)", m.bind, err)
		m.once.Do(func() { m.err = err; close(m.ready) })
		return err
	}
	m.once.Do(func() { m.addr = l.Addr(); close(m.ready) })
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.gatherer, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 30 * time.Second}
	stopped := context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	defer stopped()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve metrics on %s: %w", l.Addr(), err)
	}
	return nil
}

// URL waits until the endpoint listens and returns its /metrics URL.
func (m *metricsEndpoint) URL(ctx context.Context) (string, error) {
	select {
	case <-ctx.Done():
		return "", fmt.Errorf("metrics endpoint did not start: %w", ctx.Err())
	case <-m.ready:
	}
	if m.err != nil {
		return "", m.err
	}
	host, port, _ := net.SplitHostPort(m.addr.String())
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/metrics", nil
}
