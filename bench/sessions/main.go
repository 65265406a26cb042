// Command sessions measures session opens of serverless applications
// (serverless.drover.io, issue 16) end to end, on real drover processes
// and real instances of examples/echo-session (the process runtime), next
// to the raw runtime costs measured in the same run:
//
//   - raw start: fork/exec of echo-session in a fresh cgroup until its port
//     accepts (what a cold open cannot avoid);
//   - raw thaw: writing the cgroup freezer's thaw for a frozen echo-session
//     (what a warm open cannot avoid).
//
// Then, with an embedded control plane, the manager (serving the session
// API), one hub and -agents agents:
//
//   - warm: -warm opens through the session API (gRPC), each of a standby
//     instance (the pool is filled first and not refilled meanwhile);
//   - cold: -cold opens of an application without standby instances, each
//     creating its instance;
//   - watch: -warm opens by creating an ApplicationSession and watching it
//     to Ready (the kubectl path);
//   - bulk: -bulk sessions opened by -workers concurrent API clients on an
//     application with sessionsPerInstance 1, cold (each one an instance).
//
// It prints p50/p99 of each, each p99 minus its raw baseline (the goals of
// issue 16 are warm ≤ 10 ms above the raw thaw and cold ≤ 500 ms above the
// raw start), and the bulk rate.
//
//	go run ./bench/sessions -agents 20 -warm 50 -cold 20 -bulk 1000
//
// It must run as root on a machine with cgroups (the freezer). Results go
// to bench/RESULTS.md by hand.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	serverlessv1 "github.com/drover-fleet/drover/api/serverless/v1alpha1"
	"github.com/drover-fleet/drover/bench/internal/benchproc"
	"github.com/drover-fleet/drover/internal/agent/cgroup"
	"github.com/drover-fleet/drover/internal/manager"
	"github.com/drover-fleet/drover/internal/serverless/apptoken"
	pb "github.com/drover-fleet/drover/pkg/sessionapi/sessionapiv1"
)

type options struct {
	agents, warm, cold, bulk, workers, raw int
	binDir, work, logLevel                 string
	keep                                   bool
}

func main() {
	// On cgroup v1 a raw instance starts through this binary as the cgroup
	// shim (internal/agent/cgroup), as the agent's do through the agent.
	if len(os.Args) > 1 && os.Args[1] == cgroup.ShimArg {
		os.Exit(cgroup.RunShim(os.Args[2:]))
	}
	var o options
	flag.IntVar(&o.agents, "agents", 4, "real drover-agent processes")
	flag.IntVar(&o.warm, "warm", 30, "warm opens (a standby instance each), and as many create-and-watch opens")
	flag.IntVar(&o.cold, "cold", 10, "cold opens (an instance created for each)")
	flag.IntVar(&o.bulk, "bulk", 100, "sessions opened concurrently, one instance each (0: skip)")
	flag.IntVar(&o.workers, "workers", 16, "concurrent session API clients of the bulk phase")
	flag.IntVar(&o.raw, "raw", 30, "raw starts and thaws of the baseline")
	flag.StringVar(&o.binDir, "bin-dir", "", "directory with drover, drover-agent and echo-session (default: build them)")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory")
	flag.StringVar(&o.logLevel, "log-level", "warn", "log level of the manager, hub and agents (their logs are in the work directory)")
	flag.Parse()
	ctrllog.SetLogger(logr.Discard())
	if os.Geteuid() != 0 {
		fail(errors.New("run as root: instances need cgroups (the freezer) and the agents run them as another user"))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	work, err := os.MkdirTemp("", "drover-bench-sessions-")
	if err != nil {
		fail(err)
	}
	// Instances run as nobody: every dir above their work dirs must let
	// them through.
	if err := os.Chmod(work, 0o755); err != nil {
		fail(err)
	}
	o.work = work
	r := &runner{o: o}
	err = r.run(ctx)
	r.deleteApps(ctx)
	r.stopAll()
	if o.keep || err != nil {
		logf("work directory kept: %s", work)
	} else {
		os.RemoveAll(work)
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench/sessions:", err)
	os.Exit(1)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05 ")+format+"\n", args...)
}

type runner struct {
	o                     options
	drover, agent, echo   string
	kubeconfig, token, ca string
	sessionAPI            string
	c                     client.WithWatch
	mu                    sync.Mutex
	procs                 []*benchproc.Proc
	api                   pb.SessionsClient
	conn                  *grpc.ClientConn
}

// deleteApps deletes the run's Applications and waits (a minute at most)
// for their instances' processes to end: a stopped agent leaves its
// instances running, and they would hold the agents' output open.
func (r *runner) deleteApps(ctx context.Context) {
	if r.c == nil || r.echo == "" {
		return
	}
	_ = r.c.DeleteAllOf(ctx, &serverlessv1.Application{}, client.InNamespace("default"))
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) && running(r.echo) > 0 {
		time.Sleep(200 * time.Millisecond)
	}
}

// running counts the processes running bin.
func running(bin string) int {
	n := 0
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && strings.HasPrefix(string(b), bin+"\x00") {
			n++
		}
	}
	return n
}

func (r *runner) start(name, bin string, args ...string) (*benchproc.Proc, error) {
	p, err := benchproc.Start(r.o.work, name, bin, args...)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.procs = append(r.procs, p)
	r.mu.Unlock()
	return p, nil
}

func (r *runner) stopAll() {
	if r.conn != nil {
		r.conn.Close()
	}
	r.mu.Lock()
	ps := r.procs
	r.procs = nil
	r.mu.Unlock()
	for i := len(ps) - 1; i >= 0; i-- {
		ps[i].Stop(10 * time.Second)
	}
}

func (r *runner) run(ctx context.Context) error {
	if err := r.binaries(ctx); err != nil {
		return err
	}
	rawStart, rawThaw, err := r.rawBaseline(ctx)
	if err != nil {
		return fmt.Errorf("raw baseline: %w", err)
	}
	if err := r.startDrover(ctx); err != nil {
		return err
	}
	warm, err := r.phase(ctx, "warm", int32(r.o.warm), r.o.warm, r.openAPI)
	if err != nil {
		return err
	}
	cold, err := r.phase(ctx, "cold", 0, r.o.cold, r.openAPI)
	if err != nil {
		return err
	}
	watched, err := r.phase(ctx, "watch", int32(r.o.warm), r.o.warm, r.openWatch)
	if err != nil {
		return err
	}
	var bulkRate float64
	var bulkFailed int64
	if r.o.bulk > 0 {
		if bulkRate, bulkFailed, err = r.bulk(ctx); err != nil {
			return err
		}
	}
	desc, model := benchproc.Machine()
	fmt.Printf("\nbench/sessions on %s (%s), %d agents, %s\n\n", desc, model, r.o.agents, time.Now().UTC().Format("2006-01-02"))
	fmt.Println("| what | n | p50 | p99 | p99 − raw baseline (goal) |")
	fmt.Println("|---|---|---|---|---|")
	row := func(what string, ds []time.Duration, base time.Duration, goal string) {
		p50, p99 := pct(ds, 50), pct(ds, 99)
		above := "—"
		if base > 0 {
			above = fmt.Sprintf("%s (%s)", (p99 - base).Round(10*time.Microsecond), goal)
		}
		fmt.Printf("| %s | %d | %s | %s | %s |\n", what, len(ds), p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond), above)
	}
	row("raw start (fork/exec → port accepts)", rawStart, 0, "")
	row("raw thaw (cgroup freezer)", rawThaw, 0, "")
	row("warm open, session API", warm, pct(rawThaw, 99), "≤ 10 ms")
	row("cold open, session API", cold, pct(rawStart, 99), "≤ 500 ms")
	row("warm open, create + watch", watched, pct(rawThaw, 99), "—")
	if r.o.bulk > 0 {
		fmt.Printf("\nbulk: %d sessions (one instance each) over %d agents by %d clients: %.1f opens/s, %d failed\n",
			r.o.bulk, r.o.agents, r.o.workers, bulkRate, bulkFailed)
	}
	return nil
}

func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (len(s)*p + 99) / 100
	if i < 1 {
		i = 1
	}
	return s[i-1]
}

func (r *runner) binaries(ctx context.Context) error {
	dir := r.o.binDir
	if dir == "" {
		if _, err := os.Stat("go.mod"); err != nil {
			return errors.New("run from the repository root (go run ./bench/sessions), or pass -bin-dir")
		}
		dir = filepath.Join(r.o.work, "bin")
		for _, pkg := range []string{"./cmd/drover", "./cmd/drover-agent", "./examples/echo-session"} {
			began := time.Now()
			cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+"/", pkg)
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
			}
			logf("built %s in %s", pkg, time.Since(began).Round(100*time.Millisecond))
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			return err
		}
	}
	r.drover, r.agent, r.echo = filepath.Join(dir, "drover"), filepath.Join(dir, "drover-agent"), filepath.Join(dir, "echo-session")
	return nil
}

// rawBaseline starts echo-session -raw times in cgroups of its own, each
// until its port accepts, then freezes and thaws it.
func (r *runner) rawBaseline(ctx context.Context) (starts, thaws []time.Duration, err error) {
	m, err := cgroup.New(cgroup.Options{Parent: "drover-bench-sessions"})
	if err != nil {
		return nil, nil, err
	}
	for i := 0; i < r.o.raw; i++ {
		s, t, err := r.rawOne(ctx, m, i)
		if err != nil {
			return nil, nil, err
		}
		starts, thaws = append(starts, s), append(thaws, t)
	}
	logf("raw baseline: start p50 %s, thaw p50 %s (%s cgroups)", pct(starts, 50), pct(thaws, 50), m.Mode())
	return starts, thaws, nil
}

func (r *runner) rawOne(ctx context.Context, m *cgroup.Manager, i int) (start, thaw time.Duration, err error) {
	port, err := benchproc.FreePort()
	if err != nil {
		return 0, 0, err
	}
	g, err := m.Create("raw-"+strconv.Itoa(i), cgroup.Limits{})
	if err != nil {
		return 0, 0, err
	}
	defer g.Remove()
	cmd := exec.CommandContext(ctx, r.echo)
	cmd.Env = []string{"DROVER_PORT=" + strconv.Itoa(port), "PATH=/usr/bin:/bin"}
	done, err := g.Prepare(cmd)
	if err != nil {
		return 0, 0, err
	}
	began := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	if done != nil {
		done()
	}
	defer func() { _ = g.Kill(); _ = g.Thaw(context.Background()); _ = cmd.Wait() }()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		if time.Since(began) > 30*time.Second {
			return 0, 0, fmt.Errorf("echo-session did not listen on %s within 30 s", addr)
		}
		time.Sleep(time.Millisecond)
	}
	start = time.Since(began)
	if err := g.Freeze(ctx); err != nil {
		return 0, 0, fmt.Errorf("freeze: %w", err)
	}
	began = time.Now()
	if err := g.Thaw(ctx); err != nil {
		return 0, 0, fmt.Errorf("thaw: %w", err)
	}
	return start, time.Since(began), nil
}

// startDrover starts the control plane, the manager with the session API,
// one hub and the agents, and grants every namespace every node.
func (r *runner) startDrover(ctx context.Context) error {
	logf("control plane: starting")
	cp, err := r.start("controlplane", r.drover, "controlplane", "--data-dir", filepath.Join(r.o.work, "cp"), "--port", "0",
		"--crd-dir", "config/crd/bases", "--log-level", "warn")
	if err != nil {
		return err
	}
	if r.kubeconfig, err = cp.WaitLine(ctx, "ready kubeconfig=", 5*time.Minute); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, r.drover, "token", "create", "--kubeconfig", r.kubeconfig, "--auto-approve", "--ttl", "0", "--description", "bench/sessions").CombinedOutput()
	if err != nil {
		return fmt.Errorf("drover token create: %v\n%s", err, out)
	}
	if r.token = benchproc.LastToken(string(out)); r.token == "" {
		return fmt.Errorf("drover token create printed no token:\n%s", out)
	}
	mgr, err := r.start("manager", r.drover, "manager", "--kubeconfig", r.kubeconfig, "--leader-elect=false",
		"--metrics-bind-address", "0", "--log-level", r.o.logLevel, "--session-api-bind-address", "127.0.0.1:0")
	if err != nil {
		return err
	}
	if r.sessionAPI, err = mgr.WaitLine(ctx, "session API listening on ", 2*time.Minute); err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", r.kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 500, 1000
	if r.c, err = client.NewWithWatch(cfg, client.Options{Scheme: manager.Scheme()}); err != nil {
		return err
	}
	if err := r.c.Create(ctx, &fleetv1.NodeGrant{ObjectMeta: metav1.ObjectMeta{Name: "bench-sessions"},
		Spec: fleetv1.NodeGrantSpec{NamespaceSelector: &metav1.LabelSelector{}}}); err != nil {
		return fmt.Errorf("grant every namespace every node: %w", err)
	}
	hub, err := r.start("hub", r.drover, "hub", "--kubeconfig", r.kubeconfig, "--hub-name", "hub-0", "--hub-listen", "127.0.0.1:0",
		"--mqtt-listen", "", "--metrics-bind-address", "0", "--log-level", r.o.logLevel)
	if err != nil {
		return err
	}
	hubAddr, err := hub.WaitLine(ctx, "ready hub=", 2*time.Minute)
	if err != nil {
		return err
	}
	hubAddr = strings.Fields(hubAddr)[0]
	caPEM, err := exec.CommandContext(ctx, r.drover, "ca", "--kubeconfig", r.kubeconfig).Output()
	if err != nil {
		return fmt.Errorf("drover ca: %v", err)
	}
	r.ca = filepath.Join(r.o.work, "ca.crt")
	if err := os.WriteFile(r.ca, caPEM, 0o644); err != nil {
		return err
	}
	for i := 0; i < r.o.agents; i++ {
		node := fmt.Sprintf("sim-%d", i)
		dir := filepath.Join(r.o.work, "agents", node)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if _, err := r.start(node, r.agent, "--node", node, "--state-dir", filepath.Join(dir, "state"), "--work-dir", filepath.Join(dir, "work"),
			"--session-socket-dir", filepath.Join(dir, "s"), "--hub", hubAddr, "--token", r.token, "--ca-file", r.ca,
			"--labels", "bench=sessions", "--log-level", r.o.logLevel); err != nil {
			return err
		}
	}
	if err := r.waitOnline(ctx, 3*time.Minute); err != nil {
		return err
	}
	r.conn, err = grpc.NewClient(r.sessionAPI, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	r.api = pb.NewSessionsClient(r.conn)
	logf("%d agents online; session API at %s", r.o.agents, r.sessionAPI)
	return nil
}

func (r *runner) waitOnline(ctx context.Context, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		var list fleetv1.FleetNodeList
		if err := r.c.List(ctx, &list, client.MatchingLabels{"bench": "sessions"}); err != nil {
			return err
		}
		online := 0
		for _, x := range list.Items {
			if x.Status.Phase == fleetv1.FleetNodeOnline {
				online++
			}
		}
		if online >= r.o.agents {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d agents Online after %v", online, r.o.agents, within)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// app creates an application of echo-session with standby instances and
// a token, and waits until the standby pool is full.
func (r *runner) app(ctx context.Context, name string, standby int32, max int32) (token string, err error) {
	t, err := apptoken.New("default", name, time.Hour, time.Now())
	if err != nil {
		return "", err
	}
	a := &serverlessv1.Application{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name,
			Annotations: map[string]string{apptoken.AnnotationKey(t.ID): t.AnnotationValue()}},
		Spec: serverlessv1.ApplicationSpec{
			Command:       []string{r.echo},
			Ports:         []serverlessv1.Port{{Name: "echo"}},
			LivenessProbe: &serverlessv1.Probe{TCP: true},
			Scaling: serverlessv1.Scaling{StandbyInstances: ptr.To(standby), MaxInstances: max, Burst: 20, SessionsPerInstance: 1,
				IdleInstanceTimeout: metav1.Duration{Duration: time.Hour}},
		},
	}
	if err := r.c.Create(ctx, a); err != nil {
		return "", fmt.Errorf("create application %s: %w", name, err)
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var l serverlessv1.InstanceSliceList
		if err := r.c.List(ctx, &l, client.InNamespace("default"), client.MatchingLabels{serverlessv1.LabelApplication: name}); err != nil {
			return "", err
		}
		n := int32(0)
		for _, s := range l.Items {
			n += s.Status.Standby
		}
		if n >= standby {
			break
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("application %s: %d of %d standby instances after 5 minutes", name, n, standby)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Let the manager's view of the pool settle before the first open.
	time.Sleep(2 * time.Second)
	return t.Value, nil
}

type opener func(ctx context.Context, app, token string) (time.Duration, string, error)

// phase opens n sessions of a new application one after the other, then
// closes them.
func (r *runner) phase(ctx context.Context, name string, standby int32, n int, open opener) ([]time.Duration, error) {
	if n == 0 {
		return nil, nil
	}
	tok, err := r.app(ctx, name, standby, int32(n)+int32(standby)+10)
	if err != nil {
		return nil, err
	}
	var ds []time.Duration
	var names []string
	for i := 0; i < n; i++ {
		d, s, err := open(ctx, name, tok)
		if err != nil {
			return nil, fmt.Errorf("%s open %d: %w", name, i+1, err)
		}
		ds, names = append(ds, d), append(names, s)
	}
	logf("%s: %d opens, p50 %s p99 %s", name, n, pct(ds, 50), pct(ds, 99))
	for _, s := range names {
		_ = r.c.Delete(ctx, &serverlessv1.ApplicationSession{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: s}})
	}
	return ds, nil
}

func (r *runner) openAPI(ctx context.Context, _ string, token string) (time.Duration, string, error) {
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token), time.Minute)
	defer cancel()
	began := time.Now()
	s, err := r.api.Open(ctx, &pb.OpenRequest{})
	if err != nil {
		return 0, "", err
	}
	return time.Since(began), s.GetName(), nil
}

// openWatch creates a session and watches it until Ready.
func (r *runner) openWatch(ctx context.Context, app, _ string) (time.Duration, string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	s := &serverlessv1.ApplicationSession{ObjectMeta: metav1.ObjectMeta{Namespace: "default", GenerateName: app + "-"},
		Spec: serverlessv1.ApplicationSessionSpec{Application: app}}
	began := time.Now()
	if err := r.c.Create(ctx, s); err != nil {
		return 0, "", err
	}
	w, err := r.c.Watch(ctx, &serverlessv1.ApplicationSessionList{}, client.InNamespace("default"), client.MatchingFields{"metadata.name": s.Name})
	if err != nil {
		return 0, "", err
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		if ev.Type == watch.Error {
			return 0, "", fmt.Errorf("watch: %v", ev.Object)
		}
		got, ok := ev.Object.(*serverlessv1.ApplicationSession)
		if !ok {
			continue
		}
		if got.Status.Phase.Open() {
			return time.Since(began), s.Name, nil
		}
		if got.Status.Phase.Final() {
			return 0, "", fmt.Errorf("session %s ended %s: %s", s.Name, got.Status.Reason, got.Status.Message)
		}
	}
	return 0, "", fmt.Errorf("session %s did not open: %w", s.Name, ctx.Err())
}

// bulk opens -bulk sessions from -workers clients at once on a cold
// application and returns the open rate.
func (r *runner) bulk(ctx context.Context) (perSec float64, failed int64, err error) {
	tok, err := r.app(ctx, "bulk", 0, int32(r.o.bulk)+10)
	if err != nil {
		return 0, 0, err
	}
	var next, bad atomic.Int64
	var firstErr atomic.Value
	began := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < r.o.workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(r.o.bulk) {
				if _, _, err := r.openAPI(ctx, "bulk", tok); err != nil {
					bad.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		}()
	}
	wg.Wait()
	wall := time.Since(began)
	if e := firstErr.Load(); e != nil {
		logf("bulk: first error: %s", e)
	}
	ok := int64(r.o.bulk) - bad.Load()
	logf("bulk: %d opened in %s", ok, wall.Round(time.Millisecond))
	// Nothing is closed: the run ends here and its processes are stopped.
	return float64(ok) / wall.Seconds(), bad.Load(), nil
}
