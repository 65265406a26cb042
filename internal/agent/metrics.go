package agent

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Metrics counts what an agent does, for a local Prometheus scrape
// (drover-agent --metrics-addr). A nil *Metrics records nothing.
//
// It writes the Prometheus text format itself instead of linking
// client_golang: that library and its dependencies add ~0.8 MiB to the
// stripped agent, which must stay under 20 MiB, for a handful of counters
// and gauges. Tests parse the output with Prometheus' own parser.
type Metrics struct {
	mu         sync.Mutex
	version    string
	started    time.Time
	connected  map[string]float64 // hub → 1 while a session to it is open
	sessions   map[string]float64 // hub → sessions opened
	connErrs   map[string]float64 // hub → sessions that could not open or ended with an error
	running    map[string]float64 // work type → items running now
	workStarts map[string]float64 // work type → items started (claimed or resumed)
	finished   map[[2]string]float64
	actions    map[[3]string]float64 // (type, action, state) → node-job action reports
}

// NewMetrics returns metrics for an agent of version, started now.
func NewMetrics(version string, now time.Time) *Metrics {
	return &Metrics{
		version: version, started: now,
		connected: map[string]float64{}, sessions: map[string]float64{}, connErrs: map[string]float64{},
		running: map[string]float64{}, workStarts: map[string]float64{},
		finished: map[[2]string]float64{}, actions: map[[3]string]float64{},
	}
}

// known starts every series of the agent's hubs and work types at 0, so
// that a scrape shows them before anything happened (rate() and alerts on
// absent series need a first sample).
func (m *Metrics) known(hubs, types []string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, h := range hubs {
		m.connected[h] += 0
		m.sessions[h] += 0
		m.connErrs[h] += 0
	}
	for _, typ := range types {
		m.running[typ] += 0
		m.workStarts[typ] += 0
		for _, phase := range []string{PhaseSucceeded, PhaseFailed, PhaseCancelled} {
			m.finished[[2]string{typ, phase}] += 0
		}
	}
}

func (m *Metrics) sessionUp(hub string, up bool) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if up {
		m.connected[hub] = 1
		m.sessions[hub]++
	} else {
		m.connected[hub] = 0
	}
}

func (m *Metrics) sessionError(hub string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.connErrs[hub]++
}

func (m *Metrics) workStarted(typ string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.workStarts[typ]++
	m.running[typ]++
}

// workEnded is called when a running item leaves the running set; phase is
// its end ("" when it was not recorded as ended here, e.g. dropped).
func (m *Metrics) workEnded(typ, phase string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.running[typ] > 0 {
		m.running[typ]--
	}
	if phase != "" {
		m.finished[[2]string{typ, phase}]++
	}
}

func (m *Metrics) action(typ, action, state string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.actions[[3]string{typ, action, state}]++
}

// ServeHTTP writes the metrics in the Prometheus text format (0.0.4).
func (m *Metrics) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_ = m.Write(w)
}

// Write writes the metrics in the Prometheus text format.
func (m *Metrics) Write(w io.Writer) error {
	m.mu.Lock()
	var b strings.Builder
	family(&b, "drover_agent_info", "gauge", "Always 1; the agent's version is a label.",
		[]sample{{labels: []string{"version", m.version}, v: 1}})
	family(&b, "drover_agent_start_time_seconds", "gauge", "When this agent process started, in seconds since the epoch.",
		[]sample{{v: float64(m.started.UnixNano()) / 1e9}})
	family(&b, "drover_agent_connected", "gauge", "1 while a session to the hub is open, else 0.", byOne(m.connected, "hub"))
	family(&b, "drover_agent_sessions_total", "counter", "Sessions opened to a hub.", byOne(m.sessions, "hub"))
	family(&b, "drover_agent_session_errors_total", "counter",
		"Sessions to a hub that failed to open or ended with an error (the agent then reconnects).", byOne(m.connErrs, "hub"))
	family(&b, "drover_agent_work_running", "gauge", "Work items running now by type (tasks: task-exec; node jobs: nodejob-upgrade, nodejob-prepull).",
		byOne(m.running, "type"))
	family(&b, "drover_agent_work_started_total", "counter", "Work items started (or resumed after an agent start) by type.",
		byOne(m.workStarts, "type"))
	var fin []sample
	for k, v := range m.finished {
		fin = append(fin, sample{labels: []string{"type", k[0], "phase", k[1]}, v: v})
	}
	family(&b, "drover_agent_work_finished_total", "counter",
		"Work items ended by type and phase (Succeeded, Failed, Cancelled); upgrades are type nodejob-upgrade.", fin)
	var acts []sample
	for k, v := range m.actions {
		acts = append(acts, sample{labels: []string{"type", k[0], "action", k[1], "state", k[2]}, v: v})
	}
	family(&b, "drover_agent_nodejob_actions_total", "counter",
		"Node job action reports (Check, Confirm, BackUp, Upgrade, RollBack, PrePull...) by type, action and state.", acts)
	m.mu.Unlock()
	_, err := io.WriteString(w, b.String())
	return err
}

type sample struct {
	labels []string // name, value, name, value...
	v      float64
}

func byOne(m map[string]float64, label string) []sample {
	s := make([]sample, 0, len(m))
	for k, v := range m {
		s = append(s, sample{labels: []string{label, k}, v: v})
	}
	return s
}

func family(b *strings.Builder, name, typ, help string, samples []sample) {
	fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
	lines := make([]string, 0, len(samples))
	for _, s := range samples {
		var l strings.Builder
		l.WriteString(name)
		if len(s.labels) > 0 {
			l.WriteByte('{')
			for i := 0; i+1 < len(s.labels); i += 2 {
				if i > 0 {
					l.WriteByte(',')
				}
				fmt.Fprintf(&l, "%s=\"%s\"", s.labels[i], escapeLabel(s.labels[i+1]))
			}
			l.WriteByte('}')
		}
		l.WriteString(" " + strconv.FormatFloat(s.v, 'g', -1, 64) + "\n")
		lines = append(lines, l.String())
	}
	slices.Sort(lines) // a stable order: scrapes diff cleanly
	for _, l := range lines {
		b.WriteString(l)
	}
}

// escapeLabel escapes a label value as the text format requires.
func escapeLabel(v string) string {
	return strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`).Replace(v)
}
