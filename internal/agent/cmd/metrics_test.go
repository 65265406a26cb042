package cmd

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/drover-fleet/drover/internal/agent"
)

// The agent's own small responder speaks HTTP that Go's client and
// Prometheus' parser accept, and stops when asked.
func TestServeMetrics(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop := serveMetrics(l, agent.NewMetrics("v1.2.3", time.Now()), slog.New(slog.DiscardHandler))
	base := "http://" + l.Addr().String()
	client := &http.Client{Timeout: 30 * time.Second}
	for range 2 { // a second scrape: each gets its own connection
		resp, err := client.Get(base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain; version=0.0.4") {
			t.Fatalf("GET /metrics = %s %q, %v", resp.Status, resp.Header.Get("Content-Type"), err)
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
		if err != nil {
			t.Fatalf("not the Prometheus text format: %v\n%s", err, body)
		}
		if fams["drover_agent_info"] == nil || fams["drover_agent_start_time_seconds"] == nil {
			t.Errorf("families %v lack drover_agent_info or drover_agent_start_time_seconds", fams)
		}
	}
	for path, want := range map[string]int{"/": http.StatusNotFound, "/metrics/x": http.StatusNotFound} {
		resp, err := client.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s = %s, want %d", path, resp.Status, want)
		}
	}
	resp, err := client.Post(base+"/metrics", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /metrics = %s, want 405", resp.Status)
	}
	stop()
	if _, err := client.Get(base + "/metrics"); err == nil {
		t.Errorf("GET after stop succeeded; want the listener closed")
	}
}
