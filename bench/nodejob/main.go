// Command nodejob measures one NodeUpgradeJob over many simulated nodes: it
// starts an embedded control plane (`drover controlplane`), the controllers
// (`drover manager`), one hub (`drover hub`) and agentsim processes with
// -nodejobs (simulated agents over the real protocol whose upgrade actions
// are no-ops that answer at once), waits until every node is Online, then
//
//   - baseline: N plain apiserver writes from one client, one at a time
//     (creating N small ConfigMaps, no client-side rate limit);
//   - for each -job-concurrency: creates one NodeUpgradeJob over all N
//     nodes (labelSelector) and measures the wall time from create to
//     Completed, the apiserver write requests meanwhile, the largest object
//     (the job and each NodeTaskSlice, as JSON) and the slice count.
//
// It prints a markdown table with job time / baseline time (goal ≤ 0.5).
// With -real-agents it then runs real drover-agent processes and one
// ImagePrePullJob from an in-process registry (realpull.go).
//
//	go run ./bench/nodejob -nodes 10000 -job-concurrency 0,1000
//
// See bench/nodejob/README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	"github.com/drover-fleet/drover/bench/internal/benchproc"
)

const (
	benchLabel = "drover.bench/nodejob"
	fromVer    = "v0.1.0"
)

type options struct {
	nodes, perProc, concurrency, srcPerProc int
	jobConc                                 []int
	baselineWrites                          int
	realAgents                              int
	connectTimeout, jobTimeout              time.Duration
	binDir, workDir, mdOut                  string
	keep, pprof                             bool
	progress                                time.Duration
	logLevel                                string
}

func main() {
	var o options
	jc := flag.String("job-concurrency", "0", "comma-separated spec.concurrency of the jobs to run one after the other; 0 means all nodes at once")
	flag.IntVar(&o.nodes, "nodes", 1000, "simulated nodes (0: skip the simulated run)")
	flag.IntVar(&o.perProc, "per-proc", 5000, "simulated agents per agentsim process")
	flag.IntVar(&o.concurrency, "concurrency", 16, "agents registering at once, per agentsim process")
	flag.IntVar(&o.srcPerProc, "src-per-proc", 8, "loopback source addresses (127.0.0.x) per agentsim process")
	flag.IntVar(&o.baselineWrites, "baseline-writes", 0, "plain writes of the baseline (default: -nodes)")
	flag.IntVar(&o.realAgents, "real-agents", 0, "then run this many real drover-agent processes and one ImagePrePullJob (0 skips)")
	flag.DurationVar(&o.connectTimeout, "connect-timeout", 30*time.Minute, "give up if the nodes are not all Online by then")
	flag.DurationVar(&o.jobTimeout, "job-timeout", 15*time.Minute, "give up on a job after this long")
	flag.StringVar(&o.binDir, "bin-dir", "", "use drover, drover-agent and agentsim from this directory instead of building them")
	flag.StringVar(&o.workDir, "work-dir", "", "directory for state and logs (default: a new temporary directory)")
	flag.StringVar(&o.mdOut, "md", "", "also write the results (markdown) to this file")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory")
	flag.StringVar(&o.logLevel, "log-level", "warn", "log level of the manager and the hub (logs are in the work directory)")
	flag.DurationVar(&o.progress, "progress", 10*time.Second, "how often to print a running job's counts")
	flag.BoolVar(&o.pprof, "pprof", false, "serve pprof from the manager on 127.0.0.1:6061 and the hub on 127.0.0.1:6062, and kube-apiserver's /debug/pprof")
	flag.Parse()
	for f := range strings.SplitSeq(*jc, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			fmt.Fprintf(os.Stderr, "nodejob: -job-concurrency: %q\n", f)
			os.Exit(2)
		}
		o.jobConc = append(o.jobConc, n)
	}
	if o.baselineWrites == 0 {
		o.baselineWrites = o.nodes
	}

	ctrllog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r := &runner{o: o}
	err := r.run(ctx)
	r.stopAll()
	if err != nil {
		fmt.Fprintln(os.Stderr, "nodejob:", err)
		fmt.Fprintln(os.Stderr, "nodejob: logs in", r.work)
		os.Exit(1)
	}
	if !o.keep && o.workDir == "" {
		_ = os.RemoveAll(r.work)
	}
}

type runner struct {
	o                     options
	work                  string
	drover, agentBin, sim string
	procs                 []*benchproc.Proc

	kubeconfig, token, hubAddr, caFile string
	cfg                                *rest.Config
	c                                  client.Client
	apiHTTP                            *http.Client
	hubMetrics, mgrMetrics             string
	hub                                *benchproc.Proc
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

func (r *runner) run(ctx context.Context) error {
	var err error
	r.work = r.o.workDir
	if r.work == "" {
		if r.work, err = os.MkdirTemp("", "drover-nodejob-bench-"); err != nil {
			return err
		}
	} else if err := os.MkdirAll(r.work, 0o755); err != nil {
		return err
	}
	mach, _ := benchproc.Machine()
	logf("nodejob: %d simulated nodes, jobs at concurrency %v, work dir %s, %s", r.o.nodes, r.o.jobConc, r.work, mach)
	if err := r.binaries(ctx); err != nil {
		return err
	}
	if err := r.startControl(ctx); err != nil {
		return err
	}
	var md strings.Builder
	fmt.Fprintf(&md, "- Date: %s\n- Machine: %s\n- Go: %s\n\n", time.Now().UTC().Format("2006-01-02 15:04 MST"), mach, runtime.Version())
	if r.o.nodes > 0 {
		res, err := r.runSim(ctx)
		if err != nil {
			return err
		}
		md.WriteString(res.markdown())
	}
	if r.o.realAgents > 0 {
		rr, err := r.runReal(ctx)
		if err != nil {
			return err
		}
		md.WriteString(rr.markdown())
	}
	fmt.Print(md.String())
	if r.o.mdOut != "" {
		return os.WriteFile(r.o.mdOut, []byte(md.String()), 0o644)
	}
	return nil
}

// binaries builds drover, agentsim and (with -real-agents) drover-agent,
// one build at a time, or finds them in -bin-dir.
func (r *runner) binaries(ctx context.Context) error {
	dir := r.o.binDir
	build := dir == ""
	if build {
		if _, err := os.Stat("go.mod"); err != nil {
			return errors.New("run from the repository root (go run ./bench/nodejob), or pass -bin-dir")
		}
		dir = filepath.Join(r.work, "bin")
	}
	r.drover, r.agentBin, r.sim = filepath.Join(dir, "drover"), filepath.Join(dir, "drover-agent"), filepath.Join(dir, "agentsim")
	want := []struct{ out, pkg string }{{r.drover, "./cmd/drover"}, {r.sim, "./bench/fleet/agentsim"}}
	if r.o.realAgents > 0 {
		want = append(want, struct{ out, pkg string }{r.agentBin, "./cmd/drover-agent"})
	}
	for _, b := range want {
		if !build {
			if _, err := os.Stat(b.out); err != nil {
				return err
			}
			continue
		}
		began := time.Now()
		if out, err := exec.CommandContext(ctx, "go", "build", "-o", b.out, b.pkg).CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
		}
		logf("built %s in %s", b.pkg, time.Since(began).Round(100*time.Millisecond))
	}
	return nil
}

// startControl starts the control plane, the manager and one hub.
func (r *runner) startControl(ctx context.Context) error {
	logf("control plane: starting")
	cpArgs := []string{"controlplane", "--data-dir", filepath.Join(r.work, "cp"), "--port", "0", "--crd-dir", "config/crd/bases", "--log-level", "warn"}
	if r.o.pprof {
		cpArgs = append(cpArgs, "--apiserver-arg=--profiling=true")
	}
	cp, err := r.start("controlplane", r.drover, cpArgs...)
	if err != nil {
		return err
	}
	if r.kubeconfig, err = cp.WaitLine(ctx, "ready kubeconfig=", 5*time.Minute); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, r.drover, "token", "create", "--kubeconfig", r.kubeconfig, "--auto-approve", "--ttl", "0", "--description", "bench/nodejob").CombinedOutput()
	if err != nil {
		return fmt.Errorf("drover token create: %v\n%s", err, out)
	}
	if r.token = benchproc.LastToken(string(out)); r.token == "" {
		return fmt.Errorf("drover token create printed no token:\n%s", out)
	}
	hubPort, err := benchproc.FreePort()
	if err != nil {
		return err
	}
	mgrPort, err := benchproc.FreePort()
	if err != nil {
		return err
	}
	r.hubMetrics = fmt.Sprintf("http://127.0.0.1:%d/metrics", hubPort)
	r.mgrMetrics = fmt.Sprintf("http://127.0.0.1:%d/metrics", mgrPort)
	mgrPprof, hubPprof := "", ""
	if r.o.pprof {
		mgrPprof, hubPprof = "127.0.0.1:6061", "127.0.0.1:6062"
	}
	if _, err := r.start("manager", r.drover, "manager", "--kubeconfig", r.kubeconfig, "--leader-elect=false",
		"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", mgrPort), "--pprof-bind-address", mgrPprof, "--log-level", r.o.logLevel); err != nil {
		return err
	}
	r.hub, err = r.start("hub", r.drover, "hub", "--kubeconfig", r.kubeconfig, "--hub-name", "bench", "--hub-listen", "127.0.0.1:0", "--mqtt-listen", "127.0.0.1:0",
		"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", hubPort), "--pprof-bind-address", hubPprof, "--log-level", r.o.logLevel)
	if err != nil {
		return err
	}
	if r.hubAddr, err = r.hub.WaitLine(ctx, "ready hub=", 2*time.Minute); err != nil {
		return err
	}
	caPEM, err := exec.CommandContext(ctx, r.drover, "ca", "--kubeconfig", r.kubeconfig).Output()
	if err != nil {
		return fmt.Errorf("drover ca: %v", err)
	}
	r.caFile = filepath.Join(r.work, "ca.crt")
	if err := os.WriteFile(r.caFile, caPEM, 0o600); err != nil {
		return err
	}
	if r.cfg, err = clientcmd.BuildConfigFromFlags("", r.kubeconfig); err != nil {
		return err
	}
	r.cfg.QPS, r.cfg.Burst = -1, 0 // the runner is "one client" with no client-side limit
	if r.apiHTTP, err = rest.HTTPClientFor(r.cfg); err != nil {
		return err
	}
	sch := k8sruntime.NewScheme()
	for _, add := range []func(*k8sruntime.Scheme) error{fleetv1.AddToScheme, opsv1.AddToScheme, corev1.AddToScheme} {
		if err := add(sch); err != nil {
			return err
		}
	}
	if r.c, err = client.New(r.cfg, client.Options{Scheme: sch}); err != nil {
		return err
	}
	logf("hub %s (pid %d), control plane pid %d", r.hubAddr, r.hub.PID(), cp.PID())
	return nil
}

func (r *runner) sessions(ctx context.Context) (int64, error) {
	ss, err := benchproc.Scrape(ctx, http.DefaultClient, r.hubMetrics, "drover_hub_sessions")
	if err != nil || len(ss) == 0 {
		return 0, err
	}
	return int64(ss[0].Value), nil
}

func (r *runner) apiSnap(ctx context.Context) (map[string]float64, error) {
	ss, err := benchproc.Scrape(ctx, r.apiHTTP, strings.TrimSuffix(r.cfg.Host, "/")+"/metrics", "apiserver_request_total")
	if err != nil {
		return nil, err
	}
	return benchproc.APIWrites(ss), nil
}

// startSims starts agentsim processes for n agents named <prefix>-NNNNN.
func (r *runner) startSims(n int) ([]*benchproc.Proc, error) {
	procs := (n + r.o.perProc - 1) / r.o.perProc
	var ps []*benchproc.Proc
	first := 0
	for i := range procs {
		count := n / procs
		if i < n%procs {
			count++
		}
		src := 10 + i*r.o.srcPerProc
		if src+r.o.srcPerProc-1 > 254 {
			return ps, fmt.Errorf("too many agentsim processes for 127.0.0.10-254 at %d source addresses each", r.o.srcPerProc)
		}
		p, err := r.start(fmt.Sprintf("agentsim-%d", i), r.sim,
			"-hub", r.hubAddr, "-ca", r.caFile, "-token", r.token,
			"-agents", fmt.Sprint(count), "-first", fmt.Sprint(first), "-prefix", "sim",
			"-src-first", fmt.Sprint(src), "-src-count", fmt.Sprint(r.o.srcPerProc),
			"-concurrency", fmt.Sprint(r.o.concurrency),
			"-nodejobs", "-version", fromVer, "-labels", benchLabel+"=sim")
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

// countOnline counts FleetNodes with label sel=val that are Online.
func (r *runner) countOnline(ctx context.Context, key, val string) (online, total int, err error) {
	var list fleetv1.FleetNodeList
	if err := r.c.List(ctx, &list, client.MatchingLabels{key: val}); err != nil {
		return 0, 0, err
	}
	for _, n := range list.Items {
		if n.Status.Phase == fleetv1.FleetNodeOnline {
			online++
		}
	}
	return online, len(list.Items), nil
}

type jobRun struct {
	concurrency  int
	wall         time.Duration
	phase        opsv1.JobPhase
	counts       opsv1.NodeTaskCounts
	writes       map[string]float64
	slices       int
	maxSlice     int
	maxSliceName string
	jobBytes     int
	managerCPU   float64 // seconds over the job
	hubCPU       float64
	cpCPU        float64
}

type simResult struct {
	nodes          int
	simProcs       int
	connect        time.Duration
	baselineN      int
	baseline       time.Duration
	baselineWrites float64
	jobs           []jobRun
}

func (r *runner) runSim(ctx context.Context) (*simResult, error) {
	res := &simResult{nodes: r.o.nodes}
	logf("connecting %d simulated agents", r.o.nodes)
	began := time.Now()
	sims, err := r.startSims(r.o.nodes)
	if err != nil {
		return nil, err
	}
	res.simProcs = len(sims)
	lastLog := time.Now()
	for {
		if err := anyExited(append([]*benchproc.Proc{r.hub}, sims...)); err != nil {
			return nil, err
		}
		conn := sumStat(sims, "connected")
		srv, _ := r.sessions(ctx)
		if conn >= int64(r.o.nodes) && srv >= int64(r.o.nodes) {
			online, total, err := r.countOnline(ctx, benchLabel, "sim")
			if err == nil && online >= r.o.nodes {
				break
			}
			logf("  all connected; FleetNodes Online %d of %d (%v)", online, total, err)
		} else if time.Since(lastLog) >= 15*time.Second {
			lastLog = time.Now()
			el := time.Since(began)
			logf("  %s: %d/%d connected (hub sessions %d, register errors %d, stream errors %d), %.1f/s",
				el.Round(time.Second), conn, r.o.nodes, srv, sumStat(sims, "reg_errors"), sumStat(sims, "stream_errors"), float64(conn)/el.Seconds())
		}
		if time.Since(began) > r.o.connectTimeout {
			return nil, fmt.Errorf("only %d of %d agents connected after %v", conn, r.o.nodes, r.o.connectTimeout)
		}
		settle(ctx, 2*time.Second)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	res.connect = time.Since(began)
	logf("%d nodes Online after %s (%.1f/s)", r.o.nodes, res.connect.Round(time.Second), float64(r.o.nodes)/res.connect.Seconds())
	settle(ctx, 5*time.Second)

	// Baseline: N creates, one at a time, from this one client.
	res.baselineN = r.o.baselineWrites
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench-baseline"}}
	if err := r.c.Create(ctx, ns); err != nil {
		return nil, err
	}
	w0, err := r.apiSnap(ctx)
	if err != nil {
		return nil, err
	}
	logf("baseline: %d ConfigMap creates, one at a time", res.baselineN)
	t0 := time.Now()
	for i := range res.baselineN {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: fmt.Sprintf("cm-%05d", i)},
			Data: map[string]string{"node": fmt.Sprintf("sim-%05d", i), "phase": "Successful"}}
		if err := r.c.Create(ctx, cm); err != nil {
			return nil, fmt.Errorf("baseline write %d: %w", i, err)
		}
	}
	res.baseline = time.Since(t0)
	w1, err := r.apiSnap(ctx)
	if err != nil {
		return nil, err
	}
	res.baselineWrites = benchproc.Total(benchproc.Delta(w0, w1))
	logf("baseline: %d writes in %s (%.0f/s); apiserver counted %.0f writes", res.baselineN, res.baseline.Round(time.Millisecond),
		float64(res.baselineN)/res.baseline.Seconds(), res.baselineWrites)
	settle(ctx, 3*time.Second)

	for i, c := range r.o.jobConc {
		if c == 0 {
			c = r.o.nodes
		}
		jr, err := r.runJob(ctx, i, c, sims)
		if err != nil {
			return nil, err
		}
		res.jobs = append(res.jobs, *jr)
		settle(ctx, 5*time.Second)
	}
	return res, nil
}

func (r *runner) cpuOf(name string) (float64, bool) {
	for _, p := range r.procs {
		if p.Name() == name {
			u, err := benchproc.ReadUsage(p.PID())
			return u.CPU.Seconds(), err == nil
		}
	}
	return 0, false
}

func (r *runner) runJob(ctx context.Context, i, conc int, sims []*benchproc.Proc) (*jobRun, error) {
	jr := &jobRun{concurrency: conc}
	ver := fmt.Sprintf("v0.%d.0", i+2)
	job := &opsv1.NodeUpgradeJob{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%d-c%d", i, conc)},
		Spec: opsv1.NodeUpgradeJobSpec{
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{benchLabel: "sim"}},
			Version:       ver,
			Artifact: opsv1.AgentArtifact{URL: "https://downloads.example.com/drover-agent-" + ver,
				SHA256: strings.Repeat("ab", 32)},
			JobExecution: opsv1.JobExecution{Concurrency: int32(conc), TimeoutSeconds: 600},
		},
	}
	w0, err := r.apiSnap(ctx)
	if err != nil {
		return nil, err
	}
	m0, _ := r.cpuOf("manager")
	h0, _ := r.cpuOf("hub")
	c0, _ := r.cpuOf("controlplane")
	items0, st0 := sumStat(sims, "job_items"), sumStat(sims, "job_statuses")
	logf("job %s: %d nodes, concurrency %d, version %s", job.Name, r.o.nodes, conc, ver)
	t0 := time.Now()
	if err := r.c.Create(ctx, job); err != nil {
		return nil, fmt.Errorf("create %s: %w", job.Name, err)
	}
	lastLog := time.Now()
	for {
		var got opsv1.NodeUpgradeJob
		if err := r.c.Get(ctx, client.ObjectKeyFromObject(job), &got); err != nil {
			logf("get job: %v", err)
		} else if got.Status.Phase.Final() {
			jr.wall = time.Since(t0)
			jr.phase, jr.counts = got.Status.Phase, got.Status.Counts
			break
		} else if time.Since(lastLog) >= r.o.progress {
			lastLog = time.Now()
			ct := got.Status.Counts
			logf("  %s: %s total %d pending %d inProgress %d successful %d failure %d unknown %d; agents answered %d items, %d statuses",
				time.Since(t0).Round(time.Second), got.Status.Phase, ct.Total, ct.Pending, ct.InProgress, ct.Successful, ct.Failure, ct.Unknown,
				sumStat(sims, "job_items")-items0, sumStat(sims, "job_statuses")-st0)
		}
		if time.Since(t0) > r.o.jobTimeout {
			return nil, fmt.Errorf("job %s not final after %v", job.Name, r.o.jobTimeout)
		}
		if err := anyExited(r.procs); err != nil {
			return nil, err
		}
		settle(ctx, 200*time.Millisecond)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	m1, _ := r.cpuOf("manager")
	h1, _ := r.cpuOf("hub")
	c1, _ := r.cpuOf("controlplane")
	jr.managerCPU, jr.hubCPU, jr.cpCPU = m1-m0, h1-h0, c1-c0
	w1, err := r.apiSnap(ctx)
	if err != nil {
		return nil, err
	}
	jr.writes = benchproc.Delta(w0, w1)
	ct := jr.counts
	logf("job %s: %s in %s (successful %d, failure %d, unknown %d); %.0f apiserver writes", job.Name, jr.phase, jr.wall.Round(time.Millisecond),
		ct.Successful, ct.Failure, ct.Unknown, benchproc.Total(jr.writes))

	// Sizes: each object as the apiserver serves it (JSON).
	base := strings.TrimSuffix(r.cfg.Host, "/") + "/apis/" + opsv1.GroupVersion.Group + "/" + opsv1.GroupVersion.Version
	if jr.jobBytes, err = r.getSize(ctx, base+"/nodeupgradejobs/"+job.Name); err != nil {
		return nil, err
	}
	var got opsv1.NodeUpgradeJob
	if err := r.c.Get(ctx, client.ObjectKeyFromObject(job), &got); err != nil {
		return nil, err
	}
	var slices opsv1.NodeTaskSliceList
	if err := r.c.List(ctx, &slices, client.MatchingLabels{opsv1.LabelJobUID: string(got.UID)}); err != nil {
		return nil, err
	}
	jr.slices = len(slices.Items)
	for _, s := range slices.Items {
		n, err := r.getSize(ctx, base+"/nodetaskslices/"+s.Name)
		if err != nil {
			return nil, err
		}
		if n > jr.maxSlice {
			jr.maxSlice, jr.maxSliceName = n, s.Name
		}
	}
	logf("job %s: %d slices, largest %d bytes; job %d bytes", job.Name, jr.slices, jr.maxSlice, jr.jobBytes)
	return jr, nil
}

// getSize GETs url as JSON and returns the body's length.
func (r *runner) getSize(ctx context.Context, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := r.apiHTTP.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return len(b), nil
}

func (res *simResult) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "### %s simulated nodes, one NodeUpgradeJob\n\n", comma(res.nodes))
	fmt.Fprintf(&b, "%d agentsim process(es) with -nodejobs (no-op actions that answer at once); registration + connect + Online: %s (%.1f nodes/s).\n",
		res.simProcs, res.connect.Round(time.Second), float64(res.nodes)/res.connect.Seconds())
	fmt.Fprintf(&b, "Baseline: %s ConfigMap creates, one at a time, from one client without a client-side rate limit: %s (%.0f writes/s; the apiserver counted %s writes).\n\n",
		comma(res.baselineN), res.baseline.Round(time.Millisecond), float64(res.baselineN)/res.baseline.Seconds(), comma(int(res.baselineWrites)))
	b.WriteString("| job concurrency | outcome | wall time, create → final | job / baseline | goal ≤ 0.5 | apiserver writes during the job | writes per node | slices | largest slice (JSON) | job object (JSON) | CPU s: manager / hub / control plane |\n")
	b.WriteString("|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---|\n")
	for _, j := range res.jobs {
		ratio := j.wall.Seconds() / res.baseline.Seconds()
		pass := "pass"
		if ratio > 0.5 {
			pass = "MISS"
		}
		w := benchproc.Total(j.writes)
		fmt.Fprintf(&b, "| %s | %s: %s of %s successful, %d failed, %d unknown | %s | %.3f | %s | %s | %.2f | %d | %s B | %s B | %.1f / %.1f / %.1f |\n",
			comma(j.concurrency), j.phase, comma(int(j.counts.Successful)), comma(int(j.counts.Total)), j.counts.Failure, j.counts.Unknown,
			j.wall.Round(time.Millisecond), ratio, pass, comma(int(w)), w/float64(res.nodes), j.slices, comma(j.maxSlice), comma(j.jobBytes),
			j.managerCPU, j.hubCPU, j.cpCPU)
	}
	b.WriteString("\nWrites during each job, by resource:\n\n")
	for _, j := range res.jobs {
		var parts []string
		for _, k := range sortedKeys(j.writes) {
			parts = append(parts, fmt.Sprintf("`%s` %s", k, comma(int(j.writes[k]))))
		}
		fmt.Fprintf(&b, "- concurrency %s: %s\n", comma(j.concurrency), strings.Join(parts, ", "))
	}
	b.WriteString("\n")
	return b.String()
}

func comma(n int) string {
	s := strconv.Itoa(n)
	if n < 0 {
		return "-" + comma(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func settle(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// sortedKeys returns m's keys in order.
func sortedKeys(m map[string]float64) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
