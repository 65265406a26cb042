// Command tasks measures Drover tasks (batch.drover.io) end to end: tasks
// that run `true` on real drover-agent processes, dispatched through gRPC
// and through MQTT (the hub's embedded broker, and a Mosquitto process).
//
// It starts an embedded control plane (`drover controlplane`), the manager
// (`drover manager`), then for each transport one hub (`drover hub`) and
// -agents agents, creates -tasks Tasks from -workers concurrent clients and
// watches them. It prints, per transport: tasks per second from the first
// create to the last Completed, p50/p99 from create to started (first seen
// Running, or already ended), and, measured in the same run, the raw
// throughput of the transport: plain gRPC stream messages, and plain QoS 1
// publish→receive on the same broker; then the ratio of Drover's dispatch
// rate to it.
//
//	go run ./bench/tasks -tasks 500 -agents 4
//
// Results go to bench/RESULTS.md by hand.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/bench/internal/benchproc"
	"github.com/drover-fleet/drover/internal/manager"
)

type options struct {
	tasks, agents, workers, rawN int
	latencyTasks, dispatchN      int
	transports                   string
	binDir, work, logLevel       string
	cpuProfile                   string
	keep                         bool
}

func main() {
	var o options
	flag.IntVar(&o.tasks, "tasks", 300, "tasks per transport")
	flag.IntVar(&o.agents, "agents", 4, "real drover-agent processes per transport")
	flag.IntVar(&o.workers, "workers", 8, "concurrent clients creating tasks")
	flag.IntVar(&o.latencyTasks, "latency-tasks", 50, "tasks created one at a time, each after the last started, for create → started latency on an idle system")
	flag.IntVar(&o.dispatchN, "dispatch-messages", 20000, "noop items dispatched by an in-process hub straight to the agents, for Drover's dispatch message rate (0: skip)")
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of this process (the in-process hub, bridge and broker) during the dispatch-message phases to this file")
	flag.IntVar(&o.rawN, "raw-messages", 100000, "messages in each raw transport baseline")
	flag.StringVar(&o.transports, "transports", "grpc,mqtt,mosquitto", "transports to measure")
	flag.StringVar(&o.binDir, "bin-dir", "", "directory with drover and drover-agent (default: build them)")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory")
	flag.StringVar(&o.logLevel, "log-level", "warn", "log level of the manager, hubs and agents (their logs are in the work directory)")
	flag.Parse()
	ctrllog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	work, err := os.MkdirTemp("", "drover-bench-tasks-")
	if err != nil {
		fail(err)
	}
	o.work = work
	r := &runner{o: o}
	err = r.run(ctx)
	r.stopAll()
	if !o.keep && err == nil {
		_ = os.RemoveAll(work)
	} else {
		logf("work directory kept: %s", work)
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench/tasks:", err)
	os.Exit(1)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05 ")+format+"\n", args...)
}

type runner struct {
	o                         options
	drover, agent             string
	kubeconfig, token, caFile string
	cfg                       *rest.Config
	c                         client.WithWatch
	mu                        sync.Mutex
	procs                     []*benchproc.Proc
	brokerURL                 string
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
	r.mu.Lock()
	ps := r.procs
	r.procs = nil
	r.mu.Unlock()
	for i := len(ps) - 1; i >= 0; i-- {
		ps[i].Stop(10 * time.Second)
	}
}

// result is one transport's figures.
type result struct {
	transport      string
	tasks, agents  int
	wall           time.Duration
	p50, p99       time.Duration // burst
	idle50, idle99 time.Duration // one at a time
	failed         int
	rawPerSec      float64
	rawWhat        string
	dispatchPerSec float64
	dispatch       dispatchResult
}

func (r *runner) run(ctx context.Context) error {
	if err := r.binaries(ctx); err != nil {
		return err
	}
	if err := r.startControl(ctx); err != nil {
		return err
	}
	var results []result
	for _, t := range strings.Split(r.o.transports, ",") {
		m, ok := modes[strings.TrimSpace(t)]
		if !ok {
			return fmt.Errorf("unknown transport %q", t)
		}
		m.key = strings.TrimSpace(t)
		res, err := r.runMode(ctx, m)
		if err != nil {
			return fmt.Errorf("%s: %w", m.name, err)
		}
		if r.o.dispatchN > 0 {
			logf("%s: %d dispatch messages from an in-process hub", m.name, r.o.dispatchN)
			if res.dispatch, err = r.runDispatch(ctx, m); err != nil {
				return fmt.Errorf("%s: dispatch messages: %w", m.name, err)
			}
			d := res.dispatch
			logf("%s: %.0f dispatch messages/s acked; %d noop items ended at %.0f/s; %d Dispatch, %d Ack and %d Status envelopes (%.2f per item)",
				m.name, d.perSecAcked, d.succeeded, d.perSecRunEnd, d.envelopes, d.acks, d.reports, float64(d.envelopes+d.acks+d.reports)/float64(d.messages))
		}
		results = append(results, res)
	}
	mach, _ := benchproc.Machine()
	fmt.Printf("\n### bench/tasks, %s, %s\n\n", time.Now().UTC().Format("2006-01-02"), mach)
	if r.o.tasks > 0 || r.o.latencyTasks > 0 {
		fmt.Println("| transport | agents | idle p50 / p99 create → started (goal p99 < 100 ms) | burst tasks | failed | burst tasks/s (create → Completed) | burst p50 / p99 create → started | raw transport msgs/s | tasks/s ÷ raw |")
		fmt.Println("|---|---|---|---|---|---|---|---|---|")
	}
	for _, x := range results {
		idle, burst := "—", "— | — | — | — |"
		if r.o.latencyTasks > 0 {
			idle = fmt.Sprintf("%s / %s", x.idle50.Round(time.Millisecond), x.idle99.Round(time.Millisecond))
		}
		if r.o.tasks > 0 {
			burst = fmt.Sprintf("%d | %d | %.1f | %s / %s |", x.tasks, x.failed, float64(x.tasks)/x.wall.Seconds(),
				x.p50.Round(time.Millisecond), x.p99.Round(time.Millisecond))
		}
		switch {
		case r.o.tasks > 0:
			fmt.Printf("| %s | %d | %s | %s %.0f (%s) | %.4f |\n", x.transport, x.agents, idle, burst, x.rawPerSec, x.rawWhat, x.dispatchPerSec/x.rawPerSec)
		case r.o.latencyTasks > 0:
			fmt.Printf("| %s | %d | %s | %s %.0f (%s) | — |\n", x.transport, x.agents, idle, burst, x.rawPerSec, x.rawWhat)
		}
	}
	if r.o.dispatchN > 0 {
		fmt.Println()
		fmt.Println("| transport | agents | dispatch messages | acked in | Drover dispatch msgs/s (acked) | raw transport msgs/s | dispatch ÷ raw (goal ≥ 0.5) | noop items run and reported/s |")
		fmt.Println("|---|---|---|---|---|---|---|---|")
		for _, x := range results {
			d := x.dispatch
			fmt.Printf("| %s | %d | %d | %s | %.0f | %.0f (%s) | %.3f | %.0f (%d of %d) |\n", x.transport, x.agents, d.messages,
				d.acked.Round(time.Millisecond), d.perSecAcked, x.rawPerSec, x.rawWhat, d.perSecAcked/x.rawPerSec,
				d.perSecRunEnd, d.succeeded, d.messages)
		}
	}
	return nil
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

func (r *runner) binaries(ctx context.Context) error {
	dir := r.o.binDir
	if dir == "" {
		if _, err := os.Stat("go.mod"); err != nil {
			return errors.New("run from the repository root (go run ./bench/tasks), or pass -bin-dir")
		}
		dir = filepath.Join(r.o.work, "bin")
		for _, pkg := range []string{"./cmd/drover", "./cmd/drover-agent"} {
			began := time.Now()
			if out, err := exec.CommandContext(ctx, "go", "build", "-o", dir+"/", pkg).CombinedOutput(); err != nil {
				return fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
			}
			logf("built %s in %s", pkg, time.Since(began).Round(100*time.Millisecond))
		}
	}
	r.drover, r.agent = filepath.Join(dir, "drover"), filepath.Join(dir, "drover-agent")
	return nil
}

func (r *runner) startControl(ctx context.Context) error {
	logf("control plane: starting")
	cp, err := r.start("controlplane", r.drover, "controlplane", "--data-dir", filepath.Join(r.o.work, "cp"), "--port", "0",
		"--crd-dir", "config/crd/bases", "--log-level", "warn")
	if err != nil {
		return err
	}
	if r.kubeconfig, err = cp.WaitLine(ctx, "ready kubeconfig=", 5*time.Minute); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, r.drover, "token", "create", "--kubeconfig", r.kubeconfig, "--auto-approve", "--ttl", "0", "--description", "bench/tasks").CombinedOutput()
	if err != nil {
		return fmt.Errorf("drover token create: %v\n%s", err, out)
	}
	if r.token = benchproc.LastToken(string(out)); r.token == "" {
		return fmt.Errorf("drover token create printed no token:\n%s", out)
	}
	if _, err := r.start("manager", r.drover, "manager", "--kubeconfig", r.kubeconfig, "--leader-elect=false",
		"--metrics-bind-address", "0", "--log-level", r.o.logLevel); err != nil {
		return err
	}
	if r.cfg, err = clientcmd.BuildConfigFromFlags("", r.kubeconfig); err != nil {
		return err
	}
	r.cfg.QPS, r.cfg.Burst = 500, 1000
	if r.c, err = client.NewWithWatch(r.cfg, client.Options{Scheme: manager.Scheme()}); err != nil {
		return err
	}
	return nil
}

// caFileFor writes Drover's CA (the hub creates it) for agents.
func (r *runner) writeCA(ctx context.Context) error {
	if r.caFile != "" {
		return nil
	}
	caPEM, err := exec.CommandContext(ctx, r.drover, "ca", "--kubeconfig", r.kubeconfig).Output()
	if err != nil {
		return fmt.Errorf("drover ca: %v", err)
	}
	r.caFile = filepath.Join(r.o.work, "ca.crt")
	return os.WriteFile(r.caFile, caPEM, 0o600)
}

// mode is one transport: how to start the hub and agents, and its raw baseline.
type mode struct {
	// key names hubs, labels and namespaces; name is for the table.
	key, name string
	// setup runs before the hub starts and returns extra hub flags.
	setup func(ctx context.Context, r *runner) (hubArgs []string, err error)
	// agentArgs are extra flags for each agent, given the hub's gRPC address.
	agentArgs func(r *runner, hubAddr string) []string
	// raw measures the transport's plain message rate.
	raw func(ctx context.Context, r *runner) (perSec float64, what string, err error)
}

// mqttAgentArgs point an agent at the current mode's broker.
func (r *runner) mqttAgentArgs(_ *runner, _ string) []string {
	return []string{"--transport", "mqtt", "--mqtt-broker", r.brokerURL}
}

// rawPrefix is the topic prefix of the raw measurement on Mosquitto: not
// the hub's (see rawMQTT).
const rawPrefix = "bench-raw"

func (r *runner) rawBroker(ctx context.Context, prefix string) (float64, string, error) {
	v, err := r.rawMQTT(ctx, r.brokerURL, prefix, r.o.rawN/10)
	return v, "QoS 1 publish → receive", err
}

var modes = map[string]mode{
	"mqtt": {
		name: "mqtt (embedded broker)",
		setup: func(_ context.Context, r *runner) ([]string, error) {
			port, err := benchproc.FreePort()
			if err != nil {
				return nil, err
			}
			addr := fmt.Sprintf("127.0.0.1:%d", port)
			r.brokerURL = "ssl://" + addr
			return []string{"--mqtt-listen", addr}, nil
		},
		agentArgs: func(r *runner, hub string) []string { return r.mqttAgentArgs(r, hub) },
		raw:       func(ctx context.Context, r *runner) (float64, string, error) { return r.rawBroker(ctx, "") },
	},
	"mosquitto": {
		name: "mqtt (Mosquitto)",
		setup: func(ctx context.Context, r *runner) ([]string, error) {
			port, err := benchproc.FreePort()
			if err != nil {
				return nil, err
			}
			addr := fmt.Sprintf("127.0.0.1:%d", port)
			dir := filepath.Join(r.o.work, "mosquitto")
			args := []string{"mqtt", "mosquitto-config", "--kubeconfig", r.kubeconfig, "--dir", dir, "--listen", addr, "--hosts", "127.0.0.1", "--prefix", "drover," + rawPrefix}
			if os.Geteuid() == 0 {
				args = append(args, "--user", "root") // the files are ours
			}
			if out, err := exec.CommandContext(ctx, r.drover, args...).CombinedOutput(); err != nil {
				return nil, fmt.Errorf("drover mqtt mosquitto-config: %v\n%s", err, out)
			}
			bin, err := exec.LookPath("mosquitto")
			if err != nil {
				bin = "/usr/sbin/mosquitto"
			}
			if _, err := r.start("mosquitto", bin, "-c", filepath.Join(dir, "mosquitto.conf")); err != nil {
				return nil, fmt.Errorf("start mosquitto (apt-get install mosquitto): %w", err)
			}
			r.brokerURL = "ssl://" + addr
			return []string{"--mqtt-listen", "", "--mqtt-broker", r.brokerURL}, nil
		},
		agentArgs: func(r *runner, hub string) []string { return r.mqttAgentArgs(r, hub) },
		raw:       func(ctx context.Context, r *runner) (float64, string, error) { return r.rawBroker(ctx, rawPrefix) },
	},
	"grpc": {
		name:      "grpc",
		setup:     func(context.Context, *runner) ([]string, error) { return nil, nil },
		agentArgs: func(*runner, string) []string { return nil },
		raw: func(ctx context.Context, r *runner) (float64, string, error) {
			v, err := rawGRPC(ctx, r.o.rawN)
			return v, "gRPC stream", err
		},
	},
}

func (r *runner) runMode(ctx context.Context, m mode) (result, error) {
	res := result{transport: m.name, tasks: r.o.tasks, agents: r.o.agents}
	logf("%s: raw baseline", m.name)
	hubArgs, err := m.setup(ctx, r)
	if err != nil {
		return res, err
	}
	hub, err := r.start("hub-"+m.key, r.drover, append([]string{"hub", "--kubeconfig", r.kubeconfig, "--hub-name", "bench-" + m.key,
		"--hub-listen", "127.0.0.1:0", "--mqtt-listen", "", "--metrics-bind-address", "0", "--log-level", r.o.logLevel}, hubArgs...)...)
	if err != nil {
		return res, err
	}
	hubAddr, err := hub.WaitLine(ctx, "ready hub=", 2*time.Minute)
	if err != nil {
		return res, err
	}
	hubAddr = strings.Fields(hubAddr)[0]
	defer hub.Stop(10 * time.Second)
	if err := r.writeCA(ctx); err != nil {
		return res, err
	}
	if res.rawPerSec, res.rawWhat, err = m.raw(ctx, r); err != nil {
		return res, fmt.Errorf("raw baseline: %w", err)
	}
	logf("%s: raw %s %.0f msgs/s", m.name, res.rawWhat, res.rawPerSec)

	label := "bench-" + m.key
	for i := range r.o.agents {
		node := fmt.Sprintf("%s-%d", label, i)
		args := append([]string{"--node", node, "--state-dir", filepath.Join(r.o.work, node), "--ca-file", r.caFile,
			"--hub", hubAddr, "--token", r.token, "--labels", "bench=" + m.key, "--log-level", r.o.logLevel}, m.agentArgs(r, hubAddr)...)
		p, err := r.start(node, r.agent, args...)
		if err != nil {
			return res, err
		}
		defer p.Stop(10 * time.Second)
	}
	if err := r.waitOnline(ctx, m.key, r.o.agents, 2*time.Minute); err != nil {
		return res, err
	}
	if r.o.latencyTasks > 0 {
		logf("%s: %d agents Online; %d tasks one at a time", m.name, r.o.agents, r.o.latencyTasks)
		if res.idle50, res.idle99, err = r.runIdle(ctx, m.key); err != nil {
			return res, err
		}
	}
	if r.o.tasks == 0 {
		return res, nil
	}
	logf("%s: creating %d tasks at once", m.name, r.o.tasks)
	return r.runTasks(ctx, m.key, res)
}

func (r *runner) waitOnline(ctx context.Context, label string, n int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		var list fleetv1.FleetNodeList
		if err := r.c.List(ctx, &list, client.MatchingLabels{"bench": label}); err != nil {
			return err
		}
		online := 0
		for _, x := range list.Items {
			if x.Status.Phase == fleetv1.FleetNodeOnline {
				online++
			}
		}
		if online >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d agents Online after %v", online, n, within)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// runIdle creates latencyTasks tasks one after the other (after a few
// uncounted warm-up ones), each once the last has started, and returns p50
// and p99 of create → started.
func (r *runner) runIdle(ctx context.Context, label string) (p50, p99 time.Duration, err error) {
	ns := "bench-idle-" + label
	_ = r.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	w, err := r.c.Watch(ctx, &batchv1.TaskList{}, client.InNamespace(ns))
	if err != nil {
		return 0, 0, err
	}
	defer func() { w.Stop() }()
	var lat []time.Duration
	// The first tasks warm up what starts lazily (the agents' first
	// sessions after the hub's caches load, the exec driver, connection
	// pools); they are run but not counted.
	const warmup = 5
	for i := range warmup + r.o.latencyTasks {
		name := fmt.Sprintf("idle-%04d", i)
		tk := &batchv1.Task{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: batchv1.TaskSpec{
			Command: []string{"true"}, NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"bench": label}}}}
		at := time.Now()
		if err := r.c.Create(ctx, tk); err != nil {
			return 0, 0, err
		}
		deadline := time.After(time.Minute)
	wait:
		for {
			select {
			case <-deadline:
				return 0, 0, fmt.Errorf("task %s did not start within a minute", name)
			case ev, ok := <-w.ResultChan():
				if !ok {
					// The apiserver may end a watch; a new one starts with
					// every task as Added.
					if w, err = r.c.Watch(ctx, &batchv1.TaskList{}, client.InNamespace(ns)); err != nil {
						return 0, 0, fmt.Errorf("task watch closed, and again: %w", err)
					}
					continue
				}
				t, ok := ev.Object.(*batchv1.Task)
				if !ok || t.Name != name {
					continue
				}
				switch t.Status.State {
				case batchv1.TaskRunning, batchv1.TaskCompleted, batchv1.TaskFailed:
					if i >= warmup {
						lat = append(lat, time.Since(at))
					}
					break wait
				}
			}
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	if len(lat) == 0 {
		return 0, 0, nil
	}
	logf("%s: one at a time: p90 %s, slowest %v", label, lat[len(lat)*90/100].Round(time.Millisecond), roundAll(lat[max(0, len(lat)-5):]))
	return lat[len(lat)*50/100], lat[min(len(lat)-1, len(lat)*99/100)], nil
}

// runTasks creates the tasks and follows them with a watch until all end.
func (r *runner) runTasks(ctx context.Context, label string, res result) (result, error) {
	ns := "bench-" + label
	_ = r.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	w, err := r.c.Watch(ctx, &batchv1.TaskList{}, client.InNamespace(ns))
	if err != nil {
		return res, err
	}
	defer func() { w.Stop() }()
	var mu sync.Mutex
	created := map[string]time.Time{}
	started := map[string]time.Time{}
	ended := map[string]time.Time{}
	failed := 0
	began := time.Now()
	jobs := make(chan int)
	errs := make(chan error, r.o.workers)
	var wg sync.WaitGroup
	for range r.o.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				name := fmt.Sprintf("t-%05d", i)
				tk := &batchv1.Task{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: batchv1.TaskSpec{
					Command: []string{"true"}, NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"bench": label}}}}
				at := time.Now()
				if err := r.c.Create(ctx, tk); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				created[name] = at
				mu.Unlock()
			}
		}()
	}
	go func() {
		defer close(jobs)
		for i := range r.o.tasks {
			select {
			case jobs <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	timeout := time.After(time.Duration(r.o.tasks)*100*time.Millisecond + 2*time.Minute)
	var last time.Time
	for len(ended) < r.o.tasks {
		select {
		case err := <-errs:
			return res, fmt.Errorf("create task: %w", err)
		case <-timeout:
			return res, fmt.Errorf("only %d of %d tasks ended in time (%d started)", len(ended), r.o.tasks, len(started))
		case ev, ok := <-w.ResultChan():
			if !ok {
				// The apiserver may end a watch; a new one starts with
				// every task as Added.
				if w, err = r.c.Watch(ctx, &batchv1.TaskList{}, client.InNamespace(ns)); err != nil {
					return res, fmt.Errorf("task watch closed, and again: %w", err)
				}
				continue
			}
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue
			}
			tk, ok := ev.Object.(*batchv1.Task)
			if !ok {
				continue
			}
			now := time.Now()
			switch tk.Status.State {
			case batchv1.TaskRunning, batchv1.TaskCompleted, batchv1.TaskFailed:
				if _, seen := started[tk.Name]; !seen {
					started[tk.Name] = now
				}
			}
			if tk.Status.State.Final() {
				if _, seen := ended[tk.Name]; !seen {
					ended[tk.Name] = now
					last = now
					if tk.Status.State == batchv1.TaskFailed {
						failed++
					}
				}
			}
		}
	}
	wg.Wait()
	res.wall = last.Sub(began)
	res.failed = failed
	var lat []time.Duration
	mu.Lock()
	for name, s := range started {
		if c, ok := created[name]; ok {
			lat = append(lat, s.Sub(c))
		}
	}
	mu.Unlock()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	if len(lat) > 0 {
		res.p50 = lat[len(lat)*50/100]
		res.p99 = lat[min(len(lat)-1, len(lat)*99/100)]
	}
	res.dispatchPerSec = float64(r.o.tasks) / res.wall.Seconds()
	logf("%s: %d tasks in %s (%.1f/s), p50 %s p99 %s, %d failed", label, r.o.tasks, res.wall.Round(time.Millisecond),
		res.dispatchPerSec, res.p50.Round(time.Millisecond), res.p99.Round(time.Millisecond), failed)
	return res, nil
}
