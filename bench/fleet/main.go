// Command fleet measures one hub holding many agents: it starts an embedded
// control plane (`drover controlplane`), one hub (`drover hub`) and several
// agentsim processes (simulated agents speaking the real protocol over
// loopback TLS, spread over source addresses 127.0.0.x), waits until every
// agent is connected, then measures an idle window: hub RSS and CPU,
// apiserver writes per idle node per minute, heartbeats handled. It also runs
// one real drover-agent and reads its idle RSS.
//
// The baseline, measured in the same run with the same agents, is agentsim's
// echo hub: the same gRPC/TLS server settings and protocol, with no API, no
// liveness tracking and no cache. hub/echo is what the hub's own work costs
// on top of the transport.
//
//	go run ./bench/fleet -agents 10000 -idle 10m
//
// See bench/fleet/README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/bench/internal/benchproc"
)

type options struct {
	agents, perProc, concurrency, srcPerProc int
	idle, baselineIdle, realAgentIdle        time.Duration
	connectTimeout                           time.Duration
	binDir, workDir, mdOut                   string
	realAgent, keep                          bool
}

func main() {
	var o options
	flag.IntVar(&o.agents, "agents", 2000, "simulated agents")
	flag.IntVar(&o.perProc, "per-proc", 5000, "simulated agents per agentsim process")
	flag.IntVar(&o.concurrency, "concurrency", 8, "agents registering at once, per agentsim process")
	flag.IntVar(&o.srcPerProc, "src-per-proc", 8, "loopback source addresses (127.0.0.x) per agentsim process")
	flag.DurationVar(&o.idle, "idle", 10*time.Minute, "idle window measured once every agent is connected; 10m covers one coarse lastHeartbeatTime refresh per node")
	flag.DurationVar(&o.baselineIdle, "baseline-idle", 2*time.Minute, "idle window of the echo-hub baseline; 0 skips the baseline")
	flag.DurationVar(&o.realAgentIdle, "real-agent-idle", time.Minute, "a real drover-agent idles at least this long before its RSS is read")
	flag.BoolVar(&o.realAgent, "real-agent", true, "run one real drover-agent too")
	flag.DurationVar(&o.connectTimeout, "connect-timeout", 45*time.Minute, "give up if the agents are not all connected by then")
	flag.StringVar(&o.binDir, "bin-dir", "", "use drover, drover-agent and agentsim from this directory instead of building them")
	flag.StringVar(&o.workDir, "work-dir", "", "directory for state and logs (default: a new temporary directory)")
	flag.StringVar(&o.mdOut, "md", "", "also write the results (markdown) to this file")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory")
	flag.Parse()

	ctrllog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r := &runner{o: o}
	err := r.run(ctx)
	r.stopAll()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		fmt.Fprintln(os.Stderr, "fleet: logs in", r.work)
		os.Exit(1)
	}
	if !o.keep && o.workDir == "" {
		_ = os.RemoveAll(r.work)
	}
}

type runner struct {
	o                      options
	work                   string
	drover, agentBin, sim  string
	procs                  []*benchproc.Proc
	began                  time.Time
	machine, goVer, cpuMod string
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func (r *runner) start(name, bin string, args ...string) (*benchproc.Proc, error) {
	p, err := benchproc.Start(r.work, name, bin, args...)
	if err != nil {
		return nil, err
	}
	r.procs = append(r.procs, p)
	return p, nil
}

// stopAll stops every child, newest first.
func (r *runner) stopAll() {
	for i := len(r.procs) - 1; i >= 0; i-- {
		r.procs[i].Stop(20 * time.Second)
	}
	r.procs = nil
}

func (r *runner) stopProcs(ps ...*benchproc.Proc) {
	for _, p := range ps {
		p.Stop(20 * time.Second)
	}
	keep := r.procs[:0]
	for _, q := range r.procs {
		if !contains2(ps, q) {
			keep = append(keep, q)
		}
	}
	r.procs = keep
}

func contains2(ps []*benchproc.Proc, p *benchproc.Proc) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}

func (r *runner) run(ctx context.Context) error {
	r.began = time.Now()
	var err error
	r.work = r.o.workDir
	if r.work == "" {
		if r.work, err = os.MkdirTemp("", "drover-fleet-bench-"); err != nil {
			return err
		}
	} else if err := os.MkdirAll(r.work, 0o755); err != nil {
		return err
	}
	r.machine, r.cpuMod = benchproc.Machine()
	r.goVer = runtime.Version()
	logf("fleet: %d agents, work dir %s, %s", r.o.agents, r.work, r.machine)
	if err := r.binaries(ctx); err != nil {
		return err
	}
	var base *baseline
	if r.o.baselineIdle > 0 {
		if base, err = r.runBaseline(ctx); err != nil {
			return fmt.Errorf("baseline: %w", err)
		}
	}
	res, err := r.runHub(ctx)
	if err != nil {
		return err
	}
	md := r.report(res, base)
	fmt.Print(md)
	if r.o.mdOut != "" {
		return os.WriteFile(r.o.mdOut, []byte(md), 0o644)
	}
	return nil
}

// binaries builds drover, drover-agent and agentsim (one build at a time),
// or finds them in -bin-dir.
func (r *runner) binaries(ctx context.Context) error {
	dir := r.o.binDir
	build := dir == ""
	if build {
		if _, err := os.Stat("go.mod"); err != nil {
			return errors.New("run from the repository root (go run ./bench/fleet), or pass -bin-dir")
		}
		dir = filepath.Join(r.work, "bin")
	}
	r.drover, r.agentBin, r.sim = filepath.Join(dir, "drover"), filepath.Join(dir, "drover-agent"), filepath.Join(dir, "agentsim")
	if !build {
		for _, b := range []string{r.drover, r.agentBin, r.sim} {
			if _, err := os.Stat(b); err != nil {
				return err
			}
		}
		return nil
	}
	for _, b := range []struct{ out, pkg string }{{r.drover, "./cmd/drover"}, {r.agentBin, "./cmd/drover-agent"}, {r.sim, "./bench/fleet/agentsim"}} {
		began := time.Now()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", b.out, b.pkg)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
		}
		logf("built %s in %s", b.pkg, time.Since(began).Round(100*time.Millisecond))
	}
	return nil
}

// startSims starts agentsim processes for r.o.agents agents in total.
func (r *runner) startSims(tag, hub, caFile, token string) ([]*benchproc.Proc, error) {
	n := (r.o.agents + r.o.perProc - 1) / r.o.perProc
	var ps []*benchproc.Proc
	first := 0
	for i := range n {
		count := r.o.agents / n
		if i < r.o.agents%n {
			count++
		}
		src := 10 + i*r.o.srcPerProc
		if src+r.o.srcPerProc-1 > 254 {
			return ps, fmt.Errorf("too many agentsim processes for 127.0.0.10-254 at %d source addresses each", r.o.srcPerProc)
		}
		p, err := r.start(fmt.Sprintf("%s-agentsim-%d", tag, i), r.sim,
			"-hub", hub, "-ca", caFile, "-token", token,
			"-agents", fmt.Sprint(count), "-first", fmt.Sprint(first), "-prefix", "sim",
			"-src-first", fmt.Sprint(src), "-src-count", fmt.Sprint(r.o.srcPerProc),
			"-concurrency", fmt.Sprint(r.o.concurrency))
		if err != nil {
			return ps, err
		}
		ps = append(ps, p)
		first += count
	}
	return ps, nil
}

func sumStat(ps []*benchproc.Proc, k string) int64 {
	var t int64
	for _, p := range ps {
		t += p.StatInt(k)
	}
	return t
}

func anyExited(ps []*benchproc.Proc) error {
	for _, p := range ps {
		if p.Exited() {
			return fmt.Errorf("%s exited (%v); see %s", p.Name(), p.ExitErr(), p.LogPath())
		}
	}
	return nil
}

// waitConnected polls until both the agents and the server side count want
// connections, and returns how long it took.
func (r *runner) waitConnected(ctx context.Context, ps []*benchproc.Proc, server func() (int64, error), want int64) (time.Duration, error) {
	began := time.Now()
	lastLog := began
	for {
		if err := anyExited(ps); err != nil {
			return 0, err
		}
		conn := sumStat(ps, "connected")
		srv, err := server()
		if err != nil {
			logf("read server sessions: %v", err)
		}
		if conn >= want && srv >= want {
			return time.Since(began), nil
		}
		if time.Since(lastLog) >= 15*time.Second {
			lastLog = time.Now()
			el := time.Since(began)
			logf("  %s: %d/%d connected (server: %d, registered %d, register errors %d, stream errors %d), %.1f/s",
				el.Round(time.Second), conn, want, srv, sumStat(ps, "registered"), sumStat(ps, "reg_errors"), sumStat(ps, "stream_errors"), float64(conn)/el.Seconds())
		}
		if time.Since(began) > r.o.connectTimeout {
			return 0, fmt.Errorf("only %d of %d agents connected after %v", conn, want, r.o.connectTimeout)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

func readAll(ps []*benchproc.Proc) []benchproc.Usage {
	out := make([]benchproc.Usage, len(ps))
	for i, p := range ps {
		out[i], _ = benchproc.ReadUsage(p.PID())
	}
	return out
}

// simUsage sums the agentsim processes: RSS at the end, CPU % over the window.
func simUsage(a, b []benchproc.Usage) (rssKiB int64, cpuPct float64) {
	for i := range b {
		rssKiB += b[i].RSSKiB
		cpuPct += benchproc.CPUPercent(a[i], b[i])
	}
	return
}

type baseline struct {
	agents     int
	connect    time.Duration
	window     time.Duration
	rssKiB     int64
	cpuPct     float64
	simRSSKiB  int64
	simCPUPct  float64
	sessions   int64
	heartbeats int64
}

func (r *runner) runBaseline(ctx context.Context) (*baseline, error) {
	logf("baseline: echo hub with %d agents", r.o.agents)
	caFile := filepath.Join(r.work, "echo-ca.crt")
	echo, err := r.start("echo-hub", r.sim, "-echo-hub", "-ca-out", caFile)
	if err != nil {
		return nil, err
	}
	addr, err := echo.WaitLine(ctx, "ready hub=", 30*time.Second)
	if err != nil {
		return nil, err
	}
	sims, err := r.startSims("baseline", addr, caFile, "bench.baseline")
	if err != nil {
		return nil, err
	}
	took, err := r.waitConnected(ctx, sims, func() (int64, error) { return echo.StatInt("sessions"), nil }, int64(r.o.agents))
	if err != nil {
		return nil, err
	}
	logf("baseline: %d agents connected in %s; idle %s", r.o.agents, took.Round(time.Second), r.o.baselineIdle)
	settle(ctx, 5*time.Second)
	e0, s0 := mustUsage(echo), readAll(sims)
	hb0 := sumStat(sims, "heartbeats")
	minSessions := echo.StatInt("sessions")
	end := time.Now().Add(r.o.baselineIdle)
	for time.Now().Before(end) {
		settle(ctx, min(10*time.Second, time.Until(end)))
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err := anyExited(append(sims, echo)); err != nil {
			return nil, err
		}
		minSessions = min(minSessions, echo.StatInt("sessions"))
	}
	e1, s1 := mustUsage(echo), readAll(sims)
	b := &baseline{agents: r.o.agents, connect: took, window: e1.At.Sub(e0.At), rssKiB: e1.RSSKiB, cpuPct: benchproc.CPUPercent(e0, e1),
		sessions: minSessions, heartbeats: sumStat(sims, "heartbeats") - hb0}
	b.simRSSKiB, b.simCPUPct = simUsage(s0, s1)
	logf("baseline: echo hub RSS %.1f MiB, CPU %.2f%% over %s; agentsim RSS %.1f MiB", mib(b.rssKiB), b.cpuPct, b.window.Round(time.Second), mib(b.simRSSKiB))
	r.stopProcs(append(sims, echo)...)
	return b, nil
}

func mustUsage(p *benchproc.Proc) benchproc.Usage {
	u, err := benchproc.ReadUsage(p.PID())
	if err != nil {
		logf("read usage of %s: %v", p.Name(), err)
	}
	return u
}

func settle(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

type hubResult struct {
	agents, realAgents int
	connect            time.Duration
	window             time.Duration
	minSessions        int64
	hubRSSKiB, hubHWM  int64
	hubRSSMaxKiB       int64
	hubCPUPct          float64
	cpRSSKiB           int64
	cpCPUPct           float64
	simRSSKiB          int64
	simCPUPct          float64
	apiWrites          map[string]float64 // by resource, during the window
	hubWrites          map[string]float64 // drover_hub_api_writes_total by reason, during the window
	hubWritesRamp      map[string]float64 // the same, from start to the window
	apiWritesRamp      map[string]float64
	heartbeats         float64 // received by the hub during the window
	simHeartbeats      int64
	simHBErrors        int64
	simStreamErrors    int64
	simHBMeanMs        float64
	online, nodes      int
	realRSSKiB         int64
	realHWMKiB         int64
	realAnonKiB        int64
	realFileKiB        int64
	realIdle           time.Duration
}

func (r *runner) runHub(ctx context.Context) (*hubResult, error) {
	res := &hubResult{agents: r.o.agents}
	logf("control plane: starting")
	cp, err := r.start("controlplane", r.drover, "controlplane", "--data-dir", filepath.Join(r.work, "cp"), "--port", "0",
		"--crd-dir", "config/crd/bases", "--log-level", "warn")
	if err != nil {
		return nil, err
	}
	kubeconfig, err := cp.WaitLine(ctx, "ready kubeconfig=", 5*time.Minute)
	if err != nil {
		return nil, err
	}
	out, err := exec.CommandContext(ctx, r.drover, "token", "create", "--kubeconfig", kubeconfig, "--auto-approve", "--ttl", "0", "--description", "bench/fleet").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("drover token create: %v\n%s", err, out)
	}
	token := benchproc.LastToken(string(out))
	if token == "" {
		return nil, fmt.Errorf("drover token create printed no token:\n%s", out)
	}
	port, err := benchproc.FreePort()
	if err != nil {
		return nil, err
	}
	hub, err := r.start("hub", r.drover, "hub", "--kubeconfig", kubeconfig, "--hub-name", "bench", "--hub-listen", "127.0.0.1:0", "--mqtt-listen", "127.0.0.1:0",
		"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", port), "--heartbeat-interval", "30s", "--offline-timeout", "5m", "--log-level", "warn")
	if err != nil {
		return nil, err
	}
	addr, err := hub.WaitLine(ctx, "ready hub=", 2*time.Minute)
	if err != nil {
		return nil, err
	}
	logf("hub %s (pid %d), control plane pid %d", addr, hub.PID(), cp.PID())
	caPEM, err := exec.CommandContext(ctx, r.drover, "ca", "--kubeconfig", kubeconfig).Output()
	if err != nil {
		return nil, fmt.Errorf("drover ca: %v", err)
	}
	caFile := filepath.Join(r.work, "ca.crt")
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		return nil, err
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = -1, 0 // the runner's few reads need no client-side limit
	apiHTTP, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	apiURL := strings.TrimSuffix(cfg.Host, "/") + "/metrics"
	hubURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	sessions := func() (int64, error) {
		ss, err := benchproc.Scrape(ctx, http.DefaultClient, hubURL, "drover_hub_sessions")
		if err != nil || len(ss) == 0 {
			return 0, err
		}
		return int64(ss[0].Value), nil
	}
	hubSnap := func() (writes map[string]float64, heartbeats float64, err error) {
		ss, err := benchproc.Scrape(ctx, http.DefaultClient, hubURL, "drover_hub_api_writes_total", "drover_hub_messages_received_total")
		if err != nil {
			return nil, 0, err
		}
		writes = benchproc.SumBy(ss, "drover_hub_api_writes_total", func(l map[string]string) string { return l["reason"] })
		heartbeats = benchproc.SumBy(ss, "drover_hub_messages_received_total", func(l map[string]string) string { return l["kind"] })["KIND_HEARTBEAT"]
		return writes, heartbeats, nil
	}
	apiSnap := func() (map[string]float64, error) {
		ss, err := benchproc.Scrape(ctx, apiHTTP, apiURL, "apiserver_request_total")
		if err != nil {
			return nil, err
		}
		return benchproc.APIWrites(ss), nil
	}
	apiStart, err := apiSnap()
	if err != nil {
		return nil, fmt.Errorf("apiserver metrics: %w", err)
	}

	logf("hub: connecting %d simulated agents", r.o.agents)
	sims, err := r.startSims("hub", addr, caFile, token)
	if err != nil {
		return nil, err
	}
	res.connect, err = r.waitConnected(ctx, sims, sessions, int64(r.o.agents))
	if err != nil {
		return nil, err
	}
	logf("hub: %d agents connected in %s (%.1f/s)", r.o.agents, res.connect.Round(time.Second), float64(r.o.agents)/res.connect.Seconds())

	var real *benchproc.Proc
	var realUp time.Time
	want := int64(r.o.agents)
	if r.o.realAgent {
		real, err = r.start("drover-agent", r.agentBin, "--node", "real-agent-0", "--hub", addr, "--token", token,
			"--ca-file", caFile, "--state-dir", filepath.Join(r.work, "real-agent"), "--log-level", "info")
		if err != nil {
			return nil, err
		}
		want++
		if err := waitSessions(ctx, real, sessions, want, 2*time.Minute); err != nil {
			return nil, err
		}
		realUp = time.Now()
		res.realAgents = 1
		logf("real drover-agent connected (pid %d)", real.PID())
	}
	settle(ctx, 5*time.Second) // let the last NodeState writes land before the window opens

	apiW0, err := apiSnap()
	if err != nil {
		return nil, err
	}
	hubW0, hb0, err := hubSnap()
	if err != nil {
		return nil, err
	}
	res.apiWritesRamp = benchproc.Delta(apiStart, apiW0)
	res.hubWritesRamp = hubW0
	h0, c0, s0 := mustUsage(hub), mustUsage(cp), readAll(sims)
	simHB0, simHBErr0, simSE0 := sumStat(sims, "heartbeats"), sumStat(sims, "hb_errors"), sumStat(sims, "stream_errors")
	res.minSessions, _ = sessions()
	res.hubRSSMaxKiB = h0.RSSKiB
	logf("idle window: %s", r.o.idle)
	end := time.Now().Add(r.o.idle)
	var hbMeanSum float64
	var hbMeanN int
	lastLog := time.Now()
	for time.Now().Before(end) {
		settle(ctx, min(10*time.Second, time.Until(end)))
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		all := append([]*benchproc.Proc{hub, cp}, sims...)
		if real != nil {
			all = append(all, real)
		}
		if err := anyExited(all); err != nil {
			return nil, err
		}
		if n, err := sessions(); err == nil {
			res.minSessions = min(res.minSessions, n)
		}
		if u, err := benchproc.ReadUsage(hub.PID()); err == nil {
			res.hubRSSMaxKiB = max(res.hubRSSMaxKiB, u.RSSKiB)
		}
		for _, p := range sims {
			hbMeanSum += p.StatFloat("hb_mean_ms")
			hbMeanN++
		}
		if time.Since(lastLog) >= time.Minute {
			lastLog = time.Now()
			u := mustUsage(hub)
			logf("  idle %s: sessions min %d, hub RSS %.0f MiB, hub CPU %.1f%% so far", time.Until(end).Round(time.Second), res.minSessions, mib(u.RSSKiB), benchproc.CPUPercent(h0, u))
		}
	}
	h1, c1, s1 := mustUsage(hub), mustUsage(cp), readAll(sims)
	apiW1, err := apiSnap()
	if err != nil {
		return nil, err
	}
	hubW1, hb1, err := hubSnap()
	if err != nil {
		return nil, err
	}
	if n, err := sessions(); err == nil {
		res.minSessions = min(res.minSessions, n)
	}
	res.window = h1.At.Sub(h0.At)
	res.hubRSSKiB, res.hubHWM, res.hubCPUPct = h1.RSSKiB, h1.HWMKiB, benchproc.CPUPercent(h0, h1)
	res.cpRSSKiB, res.cpCPUPct = c1.RSSKiB, benchproc.CPUPercent(c0, c1)
	res.simRSSKiB, res.simCPUPct = simUsage(s0, s1)
	res.apiWrites = benchproc.Delta(apiW0, apiW1)
	res.hubWrites = benchproc.Delta(hubW0, hubW1)
	res.heartbeats = hb1 - hb0
	res.simHeartbeats = sumStat(sims, "heartbeats") - simHB0
	res.simHBErrors = sumStat(sims, "hb_errors") - simHBErr0
	res.simStreamErrors = sumStat(sims, "stream_errors") - simSE0
	if hbMeanN > 0 {
		res.simHBMeanMs = hbMeanSum / float64(hbMeanN)
	}

	if real != nil {
		if wait := r.o.realAgentIdle - time.Since(realUp); wait > 0 {
			logf("real agent: idling %s more", wait.Round(time.Second))
			settle(ctx, wait)
		}
		u := mustUsage(real)
		res.realRSSKiB, res.realHWMKiB, res.realIdle = u.RSSKiB, u.HWMKiB, time.Since(realUp)
		res.realAnonKiB, res.realFileKiB = u.AnonKiB, u.FileKiB
	}

	// Count Online FleetNodes after the window, so the list does not load it.
	sch := k8sruntime.NewScheme()
	if err := fleetv1.AddToScheme(sch); err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: sch})
	if err != nil {
		return nil, err
	}
	var list fleetv1.FleetNodeList
	if err := c.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("list FleetNodes: %w", err)
	}
	res.nodes = len(list.Items)
	for _, n := range list.Items {
		if n.Status.Phase == fleetv1.FleetNodeOnline {
			res.online++
		}
	}
	logf("FleetNodes: %d, Online %d", res.nodes, res.online)
	return res, nil
}

// waitSessions polls the hub until it holds want sessions.
func waitSessions(ctx context.Context, p *benchproc.Proc, sessions func() (int64, error), want int64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if p.Exited() {
			return fmt.Errorf("%s exited (%v); see %s", p.Name(), p.ExitErr(), p.LogPath())
		}
		if n, err := sessions(); err == nil && n >= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("hub did not reach %d sessions within %v", want, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func mib(kib int64) float64 { return float64(kib) / 1024 }

// sortedKeys returns m's keys in order.
func sortedKeys(m map[string]float64) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
