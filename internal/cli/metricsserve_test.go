package cli

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metricsTimeout bounds the endpoint's start and one scrape.
const metricsTimeout = 30 * time.Second

func TestMetricsEndpointServesOnAPickedPort(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "drover_test_gauge", Help: "test"})
	reg.MustRegister(g)
	g.Set(7)
	ep := newMetricsEndpoint("127.0.0.1:0", reg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ep.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start after cancel = %v, want nil", err)
		}
	}()
	wctx, wcancel := context.WithTimeout(ctx, metricsTimeout)
	defer wcancel()
	u, err := ep.URL(wctx)
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasSuffix(u, ":0/metrics") || !strings.HasPrefix(u, "http://127.0.0.1:") {
		t.Fatalf("URL = %q, want http://127.0.0.1:<picked port>/metrics", u)
	}
	cl := &http.Client{Timeout: metricsTimeout}
	resp, err := cl.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "drover_test_gauge 7") {
		t.Errorf("GET %s = %s:\n%s\nwant 200 with drover_test_gauge 7", u, resp.Status, b)
	}
}

func TestMetricsEndpointAddressInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ep := newMetricsEndpoint(l.Addr().String(), prometheus.NewRegistry())
	ctx, cancel := context.WithTimeout(context.Background(), metricsTimeout)
	defer cancel()
	err = ep.Start(ctx)
	if err == nil || !strings.Contains(err.Error(), "--metrics-bind-address") {
		t.Fatalf("Start on a used address = %v, want an error naming --metrics-bind-address", err)
	}
	if _, uerr := ep.URL(ctx); uerr == nil {
		t.Error("URL after a failed start = nil error, want the start's error")
	}
}
