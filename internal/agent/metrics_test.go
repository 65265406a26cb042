package agent

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/drover-fleet/drover/internal/store"
	"github.com/drover-fleet/drover/internal/testkit"
)

// scrape GETs url and parses it with Prometheus' own text parser.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %s, %v", url, resp.Status, err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("scrape %s: not the Prometheus text format: %v\n%s", url, err, body)
	}
	return fams
}

// value is the sample of family name whose labels include want (k, v, ...),
// or -1 when there is none.
func value(fams map[string]*dto.MetricFamily, name string, want ...string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for i := 0; i+1 < len(want); i += 2 {
			if have[want[i]] != want[i+1] {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

// Work items counted as they run and end, node job actions as they are
// reported, read back through a real HTTP scrape.
func TestMetricsCountWorkAndActions(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	release := make(chan struct{})
	a := newTestAgent(t, map[string]Runner{
		"fail": RunnerFunc(func(context.Context, store.Work) (string, string) { return PhaseFailed, "broken" }),
		"hold": RunnerFunc(func(ctx context.Context, w store.Work) (string, string) {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return PhaseSucceeded, ""
		}),
	})
	a.opts.Metrics = NewMetrics("v9.9.9", time.Now())
	srv := httptest.NewServer(a.opts.Metrics)
	defer srv.Close()
	for _, w := range []store.Work{
		{UID: "ok", Type: "noop", Phase: PhasePending},
		{UID: "bad", Type: "fail", Phase: PhasePending},
		{UID: "held", Type: "hold", Phase: PhasePending},
	} {
		if _, err := a.db.PutWork(ctx, w); err != nil {
			t.Fatal(err)
		}
		a.schedule(w.UID)
	}
	done := make(chan error, 1)
	go func() { done <- a.runWork(ctx) }()

	testkit.Eventually(t, testTimeout, func() string {
		f := scrape(t, srv.URL)
		if v := value(f, "drover_agent_work_running", "type", "hold"); v != 1 {
			return fmt.Sprintf("drover_agent_work_running{type=hold} = %v, want 1", v)
		}
		return ""
	})
	// A node job's action report, as the upgrade runner sends one.
	if err := a.env("held").RecordAndReport(ctx, store.Action{UID: "held", Action: "Upgrade", State: "Succeeded"}, "", ""); err != nil {
		t.Fatal(err)
	}
	close(release)
	testkit.Eventually(t, testTimeout, func() string {
		f := scrape(t, srv.URL)
		for _, c := range []struct {
			name   string
			labels []string
			want   float64
		}{
			{"drover_agent_info", []string{"version", "v9.9.9"}, 1},
			{"drover_agent_work_finished_total", []string{"type", "noop", "phase", "Succeeded"}, 1},
			{"drover_agent_work_finished_total", []string{"type", "fail", "phase", "Failed"}, 1},
			{"drover_agent_work_finished_total", []string{"type", "hold", "phase", "Succeeded"}, 1},
			{"drover_agent_work_started_total", []string{"type", "hold"}, 1},
			{"drover_agent_work_running", []string{"type", "hold"}, 0},
			{"drover_agent_nodejob_actions_total", []string{"type", "hold", "action", "Upgrade", "state", "Succeeded"}, 1},
		} {
			if v := value(f, c.name, c.labels...); v != c.want {
				return fmt.Sprintf("%s%v = %v, want %v", c.name, c.labels, v, c.want)
			}
		}
		return ""
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Sessions: the gauge follows the session, the counters add up, and label
// values are escaped.
func TestMetricsSessions(t *testing.T) {
	m := NewMetrics(`dev "x"`, time.Unix(1700000000, 500_000_000))
	m.sessionUp("hub-1:7443", true)
	m.sessionUp("hub-1:7443", false)
	m.sessionError("hub-1:7443")
	m.sessionUp("hub-2:7443", true)
	srv := httptest.NewServer(m)
	defer srv.Close()
	f := scrape(t, srv.URL)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"drover_agent_connected", []string{"hub", "hub-1:7443"}, 0},
		{"drover_agent_connected", []string{"hub", "hub-2:7443"}, 1},
		{"drover_agent_sessions_total", []string{"hub", "hub-1:7443"}, 1},
		{"drover_agent_session_errors_total", []string{"hub", "hub-1:7443"}, 1},
		{"drover_agent_info", []string{"version", `dev "x"`}, 1},
		{"drover_agent_start_time_seconds", nil, 1700000000.5},
	} {
		if v := value(f, c.name, c.labels...); v != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, v, c.want)
		}
	}
	var nilM *Metrics // an agent without --metrics-addr
	nilM.sessionUp("h", true)
	nilM.workStarted("t")
	nilM.workEnded("t", PhaseFailed)
	nilM.action("t", "a", "s")
	nilM.sessionError("h")
}
