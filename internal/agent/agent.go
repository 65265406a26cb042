package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/drover-fleet/drover/internal/agent/cgroup"
	"github.com/drover-fleet/drover/internal/agent/taskexec"
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/store"
)

// Options configure an agent. Zero values take the documented defaults.
type Options struct {
	// Node is this machine's name in the fleet (a DNS-1123 subdomain). Required.
	Node string
	// Hubs are host:port addresses; the agent tries them in turn. Required.
	Hubs []string
	// BootstrapToken ("id.secret") is needed only until the node has its certificate.
	BootstrapToken string
	// CAFile holds Drover's CA (PEM), to trust hubs before the node has
	// registered. After registration the CA saved in the DB is used.
	CAFile string
	// StateDir holds agent.db, the node's keys and the tasks' logs: the
	// agent's alone, 0700 (Run narrows a wider mode). Required.
	StateDir string
	// WorkDir holds one dir per task attempt, owned by the attempt's user
	// (taskexec.Options.WorkDir). Default: StateDir + "-work".
	WorkDir string
	// TaskUser is who a task runs as when its spec names no runAsUser.
	// Default: nobody (taskexec.LookupUser(taskexec.DefaultTaskUser)).
	// Only a root agent switches users: otherwise tasks run as the agent.
	TaskUser *taskexec.User
	// AllowRootTasks lets a task run as uid or gid 0. Default false: such
	// an attempt fails with reason taskwire.ReasonRunAs.
	AllowRootTasks bool
	// Labels are reported at registration and on connect.
	Labels map[string]string
	// Capacity is reported to the hub; default: detected cpu and memory
	// (DetectCapacity). drover-agent's --capacity adds to those (e.g. gpu).
	Capacity map[string]string
	// Version is the agent version reported to the hub.
	Version string
	// HeartbeatInterval overrides the interval the hub asks for (tests, benchmarks).
	HeartbeatInterval time.Duration
	// TaskRetention is how long the dir of an ended task attempt (logs,
	// default working dir) stays on the node; negative keeps them for
	// ever. Default taskexec.DefaultRetention.
	TaskRetention time.Duration
	// MaxArtifactBytes bounds one task artifact. Default
	// taskexec.DefaultMaxArtifactBytes.
	MaxArtifactBytes int64
	// StopTasksOnExit stops running task processes when the agent stops
	// (SIGTERM, SIGKILL after at most StopTasksGrace) and reports them
	// Failed, AgentStopped. Default false: they run on, and the agent
	// takes them over when it starts again (a service manager restarting
	// or upgrading it must not stop the fleet's work).
	StopTasksOnExit bool
	// StopTasksGrace bounds the wait between SIGTERM and SIGKILL with
	// StopTasksOnExit. Default 5s.
	StopTasksGrace time.Duration
	// Cgroups, when set, runs each task attempt in a cgroup of its own
	// (taskexec.Options.Cgroups). Default nil: process groups only.
	Cgroups *cgroup.Manager
	// Containerd runs the tasks whose driver is containerd
	// (taskexec.Options.Containerd). Default nil: they fail, DriverUnavailable.
	Containerd *taskexec.Containerd
	// Apps, when set, runs serverless instances and sessions (work types
	// app-instance and app-session) and tells hubs so (protocol.FeatureApps).
	// Default nil: none.
	Apps *AppOptions
	// Runners run work items by type. "noop" is always available.
	Runners map[string]Runner
	// Connect opens the agent protocol to a hub (hub is an entry of Hubs;
	// cfg holds the node's certificate and trusted CAs). Default: gRPC to
	// hub. An MQTT agent sets mqttclient's (see cmd).
	Connect Connector
	// Register sends one registration to hub (an entry of Hubs), trusting
	// roots. Default: the hub's gRPC Register. An agent that reaches only
	// MQTT brokers sets mqttclient.Registrar (its Hubs are brokers' URLs).
	Register Registrar
	// RenewOverSession renews the certificate with the open session's
	// client (an MQTT connection: a second one with the node's client id
	// would replace the session's) instead of a gRPC call to a hub.
	RenewOverSession bool
	// Clock times heartbeats, reconnect and registration backoff, the
	// hub's hello, log polls, task timeouts and the retention of task
	// dirs, and stamps the agent DB. Default clock.Real().
	Clock clock.Clock
	// Logger for operators. Default: discard.
	Logger *slog.Logger
	// Metrics, when set, counts sessions, work items and node job
	// actions (drover-agent --metrics-addr serves them). Default nil: none.
	Metrics *Metrics
}

// Connector opens the agent protocol to a hub. Closing the Closer ends the
// connection.
type Connector func(ctx context.Context, hub string, cfg *tls.Config) (agentv1.AgentHubClient, io.Closer, error)

// Registrar sends one registration request to hub.
type Registrar func(ctx context.Context, hub string, roots *x509.CertPool, req *agentv1.RegisterRequest) (*agentv1.RegisterResponse, error)

// Runner runs one work item to an end: the phase it returns is
// PhaseSucceeded, PhaseFailed or PhaseCancelled (anything else is recorded
// as Failed). It should return soon after ctx ends (the item was cancelled
// or the agent is stopping). The agent runs an item at most once: an item
// that was running when the agent died is reported Failed, not run again.
type Runner interface {
	Run(ctx context.Context, w store.Work) (phase, reason string)
}

// Env is what the agent offers a runner besides the item.
type Env struct {
	// Report sends a progress report of the running item: phase Running, a
	// reason and a message (for node jobs, an action report). It goes
	// through the durable outbox, in order with the item's end.
	Report func(ctx context.Context, reason, message string) error
	// RecordAndReport records act (as the store's SetAction) and sends a
	// progress report as Report does, in one transaction: one disk sync.
	RecordAndReport func(ctx context.Context, act store.Action, reason, message string) error
	// Connected waits until the agent has a stream open to a hub (an
	// upgraded agent proves it works this way), or ctx ends.
	Connected func(ctx context.Context) error
}

// ReportingRunner is a Runner that reports progress, and a message with its end.
type ReportingRunner interface {
	RunReporting(ctx context.Context, w store.Work, env Env) (phase, reason, message string)
}

// Resumer is a runner whose items may outlive the agent process (an agent
// upgrade re-executes the agent). An item found Running after a start is
// given to Resume instead of being reported Failed.
type Resumer interface {
	Resume(ctx context.Context, w store.Work, env Env) (phase, reason, message string)
}

// ConcurrentRunner is a runner whose items run beside each other and
// beside the work loop (tasks: many processes at once). The loop claims an
// item and runs RunReporting (or, after a start, Resume) on a goroutine of
// its own.
//
// The item's context ends with cause ErrCancelled when the hub cancels it:
// the runner stops the item and returns its end, and the agent reports
// Cancelled only then (a task's process is gone when its Cancelled is
// reported). It ends with another cause when the agent is stopping: a
// runner whose item goes on outside the agent returns PhaseRunning, and the
// item stays Running in the DB for Resume after the next start.
type ConcurrentRunner interface {
	ReportingRunner
	Resumer
	// RunsConcurrently marks the runner; it does nothing.
	RunsConcurrently()
}

// ErrCancelled is the cause of a running item's context when the hub
// cancelled the item (see ConcurrentRunner).
var ErrCancelled = errors.New("the hub cancelled the work item")

// RunnerFunc adapts a function to Runner.
type RunnerFunc func(ctx context.Context, w store.Work) (phase, reason string)

// Run implements Runner.
func (f RunnerFunc) Run(ctx context.Context, w store.Work) (string, string) { return f(ctx, w) }

var _ Runner = RunnerFunc(nil)

// Work phases the agent reports.
const (
	PhasePending   = "Pending"
	PhaseRunning   = "Running"
	PhaseSucceeded = "Succeeded"
	PhaseFailed    = "Failed"
	PhaseCancelled = "Cancelled"
)

func (o *Options) defaults() error {
	if err := protocol.ValidNodeName(o.Node); err != nil {
		return fmt.Errorf("agent options: node %q: %w", o.Node, err)
	}
	if len(o.Hubs) == 0 {
		return errors.New("agent options: at least one hub address is required (--hub host:port)")
	}
	if o.StateDir == "" {
		return errors.New("agent options: a state directory is required (--state-dir)")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	o.Clock = clock.Or(o.Clock)
	if o.Capacity == nil {
		o.Capacity = detectCapacity()
	}
	if o.Connect == nil {
		o.Connect = connectGRPC
	}
	if o.Register == nil {
		o.Register = registerGRPC
	}
	if o.Version == "" {
		o.Version = "dev"
	}
	done := RunnerFunc(func(context.Context, store.Work) (string, string) { return PhaseSucceeded, "" })
	runners := map[string]Runner{
		"noop": done,
		// A confirmation's effect is its presence in the DB, where the
		// upgrade runner waiting for it looks.
		nodejobwire.TypeConfirm: done,
	}
	maps.Copy(runners, o.Runners)
	o.Runners = runners
	return nil
}

// FatalError is an error retrying cannot fix (bad token, revoked node): the
// agent stops and says why.
type FatalError struct{ Err error }

func (e *FatalError) Error() string { return e.Err.Error() }
func (e *FatalError) Unwrap() error { return e.Err }

// Agent is a running drover-agent.
type Agent struct {
	opts Options
	log  *slog.Logger
	db   *store.Store

	// mu guards heartbeat, hub and client.
	mu        sync.Mutex
	heartbeat time.Duration
	hub       string
	client    agentv1.AgentHubClient // the open session's (RenewOverSession)

	// reportMu makes taking an agent revision and queuing the report that
	// carries it one step, so the outbox is in revision order (the hub
	// drops a report older than one it applied) and a NodeState includes
	// every work change reported at a lower revision.
	reportMu sync.Mutex
	// running holds the items being run now, by uid: the one the work
	// loop runs and those of ConcurrentRunners. reportMu guards it.
	running map[string]runningItem
	// async counts the goroutines of ConcurrentRunners' items.
	async sync.WaitGroup

	kick     chan struct{} // wakes the outbox flusher
	work     chan string   // uids to run
	overflow atomic.Bool   // schedule dropped a uid: work has Pending items not in the queue
	resume   []store.Work  // Running items a Resumer takes over after a start

	// linger is how the flusher waits for more reports while work is
	// queued (tests set it); nil waits reportLinger.
	linger func(context.Context) error
	// ident is the identity in use (renew.go).
	ident identity
	// held keeps the credentials of work specs in memory, never in the DB
	// (secrets.go).
	held heldSpecs
	// connMu guards conn, closed while a stream is open.
	connMu sync.Mutex
	conn   chan struct{}
}

func (a *Agent) setConnected(up bool) {
	a.connMu.Lock()
	defer a.connMu.Unlock()
	select {
	case <-a.conn:
		if !up {
			a.conn = make(chan struct{})
		}
	default:
		if up {
			close(a.conn)
		}
	}
}

// waitConnected waits until a stream is open or ctx ends.
func (a *Agent) waitConnected(ctx context.Context) error {
	a.connMu.Lock()
	ch := a.conn
	a.connMu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Run runs the agent until ctx ends or a FatalError.
func Run(ctx context.Context, opts Options) error {
	if err := opts.defaults(); err != nil {
		return err
	}
	if err := privateStateDir(opts.StateDir, opts.Logger); err != nil {
		return err
	}
	db, err := store.Open(ctx, filepath.Join(opts.StateDir, "agent.db"), store.Options{Logger: opts.Logger, Clock: opts.Clock})
	if err != nil {
		return err
	}
	defer db.Close()
	a := &Agent{
		opts:      opts,
		log:       opts.Logger.With("node", opts.Node),
		db:        db,
		heartbeat: 30 * time.Second,
		kick:      make(chan struct{}, 1),
		work:      make(chan string, 1024),
		conn:      make(chan struct{}),
	}
	if opts.HeartbeatInterval > 0 {
		a.heartbeat = opts.HeartbeatInterval
	}
	// Node job runners need the DB; the caller's runners win.
	for typ, r := range a.nodeJobRunners(db) {
		if _, set := opts.Runners[typ]; !set {
			a.opts.Runners[typ] = r
		}
	}
	tasks, err := a.taskRunners(ctx, db)
	if err != nil {
		return err
	}
	defer tasks.close() // after runWork has returned: processes go on, unwatched
	for typ, r := range tasks.runners {
		if _, set := opts.Runners[typ]; !set {
			a.opts.Runners[typ] = r
		}
	}
	if opts.Apps != nil {
		as, err := a.appRunners(ctx, db, tasks.driver)
		if err != nil {
			return err
		}
		// Before tasks.close (defers run last first): the instances'
		// processes go on, and the next start's Resume stops them.
		defer as.node.Close()
		for typ, r := range as.runners {
			if _, set := opts.Runners[typ]; !set {
				a.opts.Runners[typ] = r
			}
		}
	}
	a.opts.Metrics.known(a.opts.Hubs, slices.Collect(maps.Keys(a.opts.Runners)))
	if err := a.scrubStoredCredentials(ctx); err != nil {
		return err
	}
	id, err := a.ensureIdentity(ctx)
	if err != nil {
		return err
	}
	if err := a.useIdentity(id); err != nil {
		return err
	}
	if err := a.recoverWork(ctx); err != nil {
		return err
	}
	// Work runs beside the connection, not inside it: a stream that breaks
	// (hub restart, network blip) must neither interrupt a running item nor
	// leave it Running for ever; its status waits in the outbox.
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		// Once connected, start-up is over: let the kernel have back the
		// pages of the binary only start-up used.
		if a.waitConnected(ctx) == nil {
			if n := trimBinaryPages(); n > 0 {
				a.log.Debug("released start-up pages of the binary", "advisedBytes", n)
			}
		}
		return nil
	})
	g.Go(func() error { return a.runWork(ctx) })
	g.Go(func() error { return a.connectLoop(ctx, id) })
	g.Go(func() error { return a.renewLoop(ctx) })
	return g.Wait()
}

// connectLoop keeps one stream open, moving to the next hub on failure with
// a capped, jittered backoff that resets after a stream that lasted.
func (a *Agent) connectLoop(ctx context.Context, id store.Identity) error {
	hubs := a.opts.Hubs
	start := 0
	for i, h := range hubs {
		if h == id.Hub {
			start = i // resume with the hub that worked last
		}
	}
	backoff := 500 * time.Millisecond
	for attempt := 0; ; attempt++ {
		hub := hubs[(start+attempt)%len(hubs)]
		began := a.opts.Clock.Now()
		err := a.session(ctx, hub)
		if ctx.Err() != nil {
			return nil
		}
		var fatal *FatalError
		if errors.As(err, &fatal) {
			a.log.Error("agent stopped", "hub", hub, "err", err)
			return err
		}
		if a.opts.Clock.Since(began) > 30*time.Second {
			backoff = 500 * time.Millisecond
		}
		a.opts.Metrics.sessionError(hub)
		a.log.Warn("hub connection lost; reconnecting", "hub", hub, "err", err, "retryIn", backoff)
		if a.sleep(ctx, backoff+rand.N(backoff/2+1)) != nil {
			return nil
		}
		backoff = min(backoff*2, 30*time.Second)
	}
}

func (a *Agent) info() *agentv1.NodeInfo {
	host, _ := os.Hostname()
	return &agentv1.NodeInfo{
		Labels:       a.opts.Labels,
		Capacity:     a.opts.Capacity,
		AgentVersion: a.opts.Version,
		Os:           runtime.GOOS,
		Arch:         runtime.GOARCH,
		Hostname:     strings.ToLower(host),
	}
}

// privateStateDir creates dir 0700, or narrows it to 0700: it holds the
// node's private key, the registration key, the DB and every task's logs,
// none of which a task (running as another user) may read.
func privateStateDir(dir string, log *slog.Logger) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create state dir %s: %w", dir, err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("state dir %s: %w", dir, err)
	}
	if perm := fi.Mode().Perm(); perm != 0o700 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("state dir %s has mode %o, readable by others; narrowing it to 0700 failed: %w", dir, perm, err)
		}
		log.Warn("narrowed the state dir's mode to 0700: it holds the node's keys and the tasks' logs", "dir", dir, "was", fmt.Sprintf("%o", perm))
	}
	return nil
}

// detectCapacity reports cpu and (on Linux) memory as resource quantities.
func detectCapacity() map[string]string {
	c := map[string]string{"cpu": fmt.Sprint(runtime.NumCPU())}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			var kb uint64
			if _, err := fmt.Sscanf(line, "MemTotal: %d kB", &kb); err == nil {
				c["memory"] = fmt.Sprintf("%dKi", kb)
				break
			}
		}
	}
	return c
}
