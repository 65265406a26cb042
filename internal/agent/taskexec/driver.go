package taskexec

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/drover-fleet/drover/internal/agent/cgroup"
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/ctrd/ctrdwire"
	"github.com/drover-fleet/drover/internal/task/taskwire"
)

// Defaults of Options.
const (
	DefaultMaxLogBytes  = 10 << 20
	DefaultPollInterval = time.Second
	DefaultKillTimeout  = 10 * time.Second
	// DefaultMaxArtifactBytes bounds one artifact: a model or a binary
	// fits, a URL that serves without end does not fill the disk.
	DefaultMaxArtifactBytes = 1 << 30
)

// Names of the files in an attempt's log dir.
const (
	StdoutFile = "stdout.log"
	StderrFile = "stderr.log"
)

// Options configure a Driver. Zero values take the documented defaults.
type Options struct {
	// StateDir is the agent's state dir; attempts' logs live in
	// StateDir/tasks/<work id>, where only the agent reads them. Required.
	StateDir string
	// WorkDir holds one dir per attempt, <WorkDir>/<work id>, the
	// attempt's own (0700, its user's) and its default working dir and
	// HOME. WorkDir itself is 0711: a task reaches its own dir by name but
	// lists nothing. Default: StateDir + "-work".
	WorkDir string
	// TaskUser is who an attempt runs as when its spec names no
	// runAsUser. Default: LookupUser(DefaultTaskUser). An agent that is
	// not root switches no user: every attempt runs as the agent's own
	// uid and gid, and one asking for another fails.
	TaskUser *User
	// AllowRoot lets an attempt run as uid 0 or gid 0 (its spec asks for
	// it, or TaskUser is root). Default false: such an attempt fails with
	// reason taskwire.ReasonRunAs.
	AllowRoot bool
	// MaxLogBytes bounds stdout.log and stderr.log, and their <name>.1:
	// the log shim rotates a file to <name>.1 before a write would take
	// it past the bound. Default DefaultMaxLogBytes.
	MaxLogBytes int64
	// PollInterval is how often the monitor checks the processes it did
	// not start (and the logs of attempts an older agent started).
	// Default DefaultPollInterval.
	PollInterval time.Duration
	// MaxArtifactBytes is the largest artifact the driver downloads; a
	// larger one fails the attempt before it starts (taskwire.ReasonArtifact),
	// checked while downloading, and its partial file is removed. Default
	// DefaultMaxArtifactBytes.
	MaxArtifactBytes int64
	// Retention is how long the task dir of an ended attempt (its logs,
	// and its working dir when the spec names none) is kept after it
	// ended, for `drover logs` and for people to look at; then the driver
	// removes it, whether or not the caller still holds the attempt.
	// Negative keeps them for ever. Default DefaultRetention.
	Retention time.Duration
	// GCInterval is how often the driver looks for task dirs to remove.
	// Default DefaultGCInterval.
	GCInterval time.Duration
	// Clock is the clock of timeouts, kill timeouts, polls, ended marks,
	// the retention period and the collector's passes. Default clock.Real().
	// The collector's first pass runs at New on its own goroutine; it waits
	// on Clock for the next one only once that pass is over, and the
	// monitor waits on Clock only while it watches a process. So a test
	// with a fake clock that calls GC itself waits for one waiter
	// (clocktest.Fake.BlockUntilWaiters) before it starts any process or
	// moves time on.
	Clock clock.Clock
	// HTTPClient fetches artifacts. Default: a client with a 10 minute timeout.
	HTTPClient *http.Client
	// Cgroups, when set, contains each attempt in a cgroup of its own
	// (see the package doc); nil keeps attempts in process groups only.
	Cgroups *cgroup.Manager
	// Containerd, when set, runs the attempts whose spec names driver
	// containerd (see the package doc, "Containers"); nil fails them with
	// reason taskwire.ReasonDriverUnavailable.
	Containerd *Containerd
	// Logger for operators. Default: discard.
	Logger *slog.Logger
}

// Info is what a caller persists about a started attempt to find its
// process again after a restart (Adopt).
type Info struct {
	PID int `json:"pid"`
	// StartTicks is the process start time in clock ticks after boot
	// (/proc/<pid>/stat field 22): a pid with other ticks is another process.
	StartTicks uint64    `json:"startTicks"`
	StartTime  time.Time `json:"startTime"`
	// Deadline is when the timeout fires; zero for none.
	Deadline time.Time `json:"deadline,omitzero"`
	// LogDir holds stdout.log and stderr.log.
	LogDir string `json:"logDir"`
	// Cgroup are the dirs of the attempt's cgroup (cgroup.Group.Dirs);
	// none when the driver runs without cgroups.
	Cgroup []string `json:"cgroup,omitempty"`
	// LogShimPID and LogShimStartTicks are the attempt's log shim (see
	// the package doc, "Logs"); zero for an attempt an older agent
	// started, which writes its log files itself.
	LogShimPID        int    `json:"logShimPid,omitempty"`
	LogShimStartTicks uint64 `json:"logShimStartTicks,omitempty"`
	// Container is the containerd container id of a containerd attempt
	// (PID is then its drover-containerd companion's); empty for exec.
	Container string `json:"container,omitempty"`
}

// Result is how an attempt ended: Phase one of taskwire.PhaseSucceeded,
// PhaseFailed or PhaseCancelled, Reason a taskwire.Reason* (empty on success),
// and the Report to send with it.
type Result struct {
	Phase  string          `json:"phase"`
	Reason string          `json:"reason,omitempty"`
	Report taskwire.Report `json:"report"`
}

// Error is why an attempt could not start; Reason is taskwire.ReasonArtifact,
// taskwire.ReasonRunAs or taskwire.ReasonStartError.
type Error struct {
	Reason string
	Err    error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Driver runs attempts. It is safe for concurrent use.
type Driver struct {
	opts Options
	log  *slog.Logger
	// switching: the agent is root and runs attempts as other users;
	// otherwise taskUser is the agent's own uid and gid.
	switching bool
	taskUser  User

	mu        sync.Mutex
	procs     map[*Proc]struct{} // watched by the monitor
	shims     map[int]struct{}   // log shims that are children, reaped by the monitor
	preparing map[string]int     // ids between Prepare and Start (or Close)
	closed    bool

	wake chan struct{} // a proc was added or asked to stop
	sig  chan os.Signal
	stop chan struct{}
	done chan struct{} // the monitor returned

	gcStop context.CancelFunc
	gcDone chan struct{} // the collector returned
}

// New starts a driver and its monitor goroutine. Close stops it.
func New(opts Options) (*Driver, error) {
	if opts.StateDir == "" {
		return nil, errors.New("taskexec: a state dir is required")
	}
	if opts.WorkDir == "" {
		opts.WorkDir = filepath.Clean(opts.StateDir) + "-work"
	}
	if opts.MaxLogBytes <= 0 {
		opts.MaxLogBytes = DefaultMaxLogBytes
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = DefaultPollInterval
	}
	if opts.MaxArtifactBytes <= 0 {
		opts.MaxArtifactBytes = DefaultMaxArtifactBytes
	}
	if opts.Retention == 0 {
		opts.Retention = DefaultRetention
	}
	if opts.GCInterval <= 0 {
		opts.GCInterval = DefaultGCInterval
	}
	opts.Clock = clock.Or(opts.Clock)
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{Timeout: 10 * time.Minute}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if c := opts.Containerd; c != nil {
		cc := *c
		cc.Address = cmp.Or(cc.Address, ctrdwire.DefaultAddress)
		cc.Namespace = cmp.Or(cc.Namespace, ctrdwire.DefaultNamespace)
		opts.Containerd = &cc
	}
	d := &Driver{
		opts:      opts,
		log:       opts.Logger,
		procs:     map[*Proc]struct{}{},
		shims:     map[int]struct{}{},
		preparing: map[string]int{},
		wake:      make(chan struct{}, 1),
		sig:       make(chan os.Signal, 1),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
		gcDone:    make(chan struct{}),
	}
	if err := d.setupUsers(); err != nil {
		return nil, err
	}
	if err := d.setupDirs(); err != nil {
		return nil, err
	}
	// SIGCHLD tells the monitor a child changed state; a full channel
	// coalesces signals, which is fine: the monitor checks every process.
	if opts.Cgroups != nil {
		d.log.Info("task containment: each attempt in its own cgroup, killed whole when it stops",
			"cgroups", opts.Cgroups.Mode(), "parent", strings.Join(opts.Cgroups.Parents(), ","))
	} else {
		d.log.Info("task containment: process groups only (no cgroups): a task process that leaves its group outlives its attempt, and resources are not enforced")
	}
	signal.Notify(d.sig, syscall.SIGCHLD)
	go d.monitor()
	var gcCtx context.Context
	gcCtx, d.gcStop = context.WithCancel(context.Background())
	if opts.Retention < 0 {
		close(d.gcDone)
	} else {
		go d.collect(gcCtx)
	}
	return d, nil
}

// Close stops the monitor. Running processes are left running, unwatched:
// their Done channels never close. A caller that stops persists Info to
// Adopt them after its restart.
func (d *Driver) Close() {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return
	}
	d.closed = true
	for p := range d.procs {
		p.detached = true
	}
	clear(d.procs)
	d.mu.Unlock()
	signal.Stop(d.sig)
	close(d.stop)
	d.gcStop()
	<-d.done
	<-d.gcDone
}

// Watching is the number of processes the monitor watches now.
func (d *Driver) Watching() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.procs)
}

// TaskDir is the directory of attempt id's logs, inside the state dir.
func (d *Driver) TaskDir(id string) string {
	return filepath.Join(d.opts.StateDir, "tasks", id)
}

// WorkDir is attempt id's own dir: its HOME, and its working dir when the
// spec names none (a relative one is inside it).
func (d *Driver) WorkDir(id string) string {
	return filepath.Join(d.opts.WorkDir, id)
}

// setupUsers settles who attempts run as.
func (d *Driver) setupUsers() error {
	d.switching = os.Geteuid() == 0
	if !d.switching {
		d.taskUser = User{UID: uint32(os.Geteuid()), GID: uint32(os.Getegid())}
		if d.opts.TaskUser != nil && *d.opts.TaskUser != d.taskUser {
			d.log.Warn("the agent is not root and cannot switch users: tasks run as the agent's own user, not the task user",
				"uid", d.taskUser.UID, "gid", d.taskUser.GID, "taskUser", d.opts.TaskUser.String())
		} else {
			d.log.Info("the agent is not root: tasks run as the agent's own user, and a task asking for another fails",
				"uid", d.taskUser.UID, "gid", d.taskUser.GID)
		}
		return nil
	}
	if d.opts.TaskUser != nil {
		d.taskUser = *d.opts.TaskUser
	} else {
		u, err := LookupUser(DefaultTaskUser)
		if err != nil {
			return fmt.Errorf("taskexec: %w", err)
		}
		d.taskUser = u
	}
	if d.taskUser.root() && !d.opts.AllowRoot {
		return fmt.Errorf("taskexec: the task user %s is root, and root tasks are not allowed (drover-agent --allow-root-tasks)", d.taskUser)
	}
	d.log.Info("tasks run as their securityContext's user, else as the task user", "taskUser", d.taskUser.String(), "allowRoot", d.opts.AllowRoot)
	return nil
}

// setupDirs creates the logs' root (0700, inside the state dir) and the
// work root (0711: traversable to reach one's own attempt dir by name, not
// listable), and narrows modes found wider.
func (d *Driver) setupDirs() error {
	for _, dir := range []struct {
		path string
		mode os.FileMode
	}{{filepath.Join(d.opts.StateDir, "tasks"), 0o700}, {d.opts.WorkDir, 0o711}} {
		if err := os.MkdirAll(dir.path, dir.mode); err != nil {
			return fmt.Errorf("taskexec: create %s: %w", dir.path, err)
		}
		fi, err := os.Lstat(dir.path)
		if err != nil {
			return fmt.Errorf("taskexec: %w", err)
		}
		// A root someone else owns (or a symlink to one, say in /tmp)
		// would let them swap or read what the agent hands its tasks.
		if st, ok := fi.Sys().(*syscall.Stat_t); !fi.IsDir() || (ok && int(st.Uid) != os.Geteuid()) {
			return fmt.Errorf("taskexec: %s must be a directory the agent's user owns (uid %d), not a symlink or another user's: choose another --work-dir or --state-dir", dir.path, os.Geteuid())
		}
		if fi.Mode().Perm() != dir.mode {
			if err := os.Chmod(dir.path, dir.mode); err != nil {
				return fmt.Errorf("taskexec: narrow the mode of %s to %o: %w", dir.path, dir.mode, err)
			}
			d.log.Warn("narrowed the mode of a task directory", "dir", dir.path, "was", fmt.Sprintf("%o", fi.Mode().Perm()),
				"now", fmt.Sprintf("%o", dir.mode))
		}
	}
	return nil
}

// Adopt watches again an attempt started before a restart (its Info was
// persisted). A process that is gone, or whose pid now belongs to another
// process, gives a Proc already done, Failed with reason taskwire.ReasonLost.
func (d *Driver) Adopt(id string, spec *taskwire.Spec, info Info) *Proc {
	if info.Container != "" {
		if proc := d.reattach(id, spec, info); proc != nil {
			return proc
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	proc := d.newProc(id, spec, info, false)
	if pid := info.LogShimPID; pid > 0 {
		// Its log shim, still this process's child (the agent re-executed
		// itself), is reaped by the monitor; any other is only watched.
		if st, err := readStat(pid); err == nil && st.startTicks == info.LogShimStartTicks && isChild(pid) {
			proc.shimChild = true
			d.shims[pid] = struct{}{}
		}
	}
	if len(info.Cgroup) > 0 {
		// Found from the dirs, not from the driver's manager: an agent
		// restarted without cgroups still kills what the attempt left.
		cg, err := cgroup.Open(info.Cgroup, d.log)
		if err != nil {
			d.log.Warn("cannot find the cgroup of a task again; its leftovers may outlive it", "id", id, "cgroup", info.Cgroup, "err", err)
		}
		proc.cg = cg
	}
	st, err := readStat(info.PID)
	if err != nil || st.startTicks != info.StartTicks || info.PID <= 0 {
		proc.endCgroup()
		d.markEnded(id)
		proc.finish(Result{Phase: taskwire.PhaseFailed, Reason: taskwire.ReasonLost, Report: proc.report(
			"the agent restarted while the task ran; its result is unknown (its process is gone)", nil)})
		return proc
	}
	// A child of this process (the agent re-executed itself, keeping its
	// pid) can be reaped, with its exit code; any other cannot.
	proc.child = isChild(info.PID)
	proc.pgid = st.pgid
	if d.closed {
		proc.finish(Result{Phase: taskwire.PhaseFailed, Reason: taskwire.ReasonLost, Report: proc.report("the driver is closed", nil)})
		return proc
	}
	d.procs[proc] = struct{}{}
	d.kick()
	d.log.Info("task re-attached after a restart", "id", id, "pid", info.PID, "child", proc.child)
	return proc
}

func (d *Driver) newProc(id string, spec *taskwire.Spec, info Info, child bool) *Proc {
	kt := DefaultKillTimeout
	if spec.KillTimeoutSeconds > 0 {
		kt = time.Duration(spec.KillTimeoutSeconds) * time.Second
	}
	return &Proc{d: d, id: id, info: info, child: child, pgid: info.PID, killTimeout: kt, memory: spec.MemoryBytes,
		timeout: time.Duration(spec.TimeoutSeconds) * time.Second, done: make(chan struct{})}
}

func (d *Driver) kick() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Proc is a running attempt.
type Proc struct {
	d           *Driver
	id          string
	info        Info
	child       bool // this process's child: reaped with its exit code
	pgid        int  // its group, which the signals go to
	killTimeout time.Duration
	timeout     time.Duration
	cg          *cgroup.Group // the attempt's cgroup; nil without
	memory      int64         // its memory limit, for the OOM message
	shimChild   bool          // its log shim is this process's child, in d.shims

	// Owned by the monitor.
	oom       bool      // the kernel OOM-killed a process of the cgroup
	termAt    time.Time // SIGTERM sent
	killed    bool      // SIGKILL sent
	cause     string    // why it is being stopped: taskwire.ReasonTimeout or taskwire.ReasonCancelled
	nextCheck time.Time // of the logs, and of a non-child's liveness
	exit      *Result   // its process ended so; waiting for its log shim
	drainBy   time.Time // when to stop waiting for the log shim

	// Guarded by d.mu.
	cancel   bool
	detached bool
	res      Result
	done     chan struct{}
}

// Info is what to persist to Adopt p after a restart.
func (p *Proc) Info() Info { return p.info }

// Done is closed when the attempt has ended; Result then tells how.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Result is how the attempt ended; valid once Done is closed.
func (p *Proc) Result() Result {
	p.d.mu.Lock()
	defer p.d.mu.Unlock()
	return p.res
}

// Cancel stops the attempt: SIGTERM to its group, SIGKILL after the kill
// timeout. It ends Cancelled, unless it ended first.
func (p *Proc) Cancel() {
	p.d.mu.Lock()
	p.cancel = true
	p.d.mu.Unlock()
	p.d.kick()
}

// Stop stops the attempt as Cancel does, but with at most killAfter
// between SIGTERM and SIGKILL: for an agent that stops its tasks as it
// exits, and must be done before whoever stops it gives up waiting.
func (p *Proc) Stop(killAfter time.Duration) {
	p.d.mu.Lock()
	p.cancel = true
	p.killTimeout = min(p.killTimeout, killAfter)
	p.d.mu.Unlock()
	p.d.kick()
}

// Detach stops watching p and leaves its process running (the agent is
// stopping; Adopt finds it again). It reports false when p has already
// ended: Result tells how.
func (p *Proc) Detach() bool {
	p.d.mu.Lock()
	defer p.d.mu.Unlock()
	select {
	case <-p.done:
		return false
	default:
	}
	p.detached = true
	delete(p.d.procs, p)
	if p.shimChild {
		// Left to whoever adopts p (an agent that re-executed itself).
		delete(p.d.shims, p.info.LogShimPID)
	}
	return true
}

// finish records the result and closes done; d.mu is held.
func (p *Proc) finish(r Result) {
	p.res = r
	delete(p.d.procs, p)
	close(p.done)
}

// report is the end report of p with message and exit code.
func (p *Proc) report(msg string, code *int32) taskwire.Report {
	return taskwire.Report{
		PID:        p.info.PID,
		ExitCode:   code,
		StartTime:  p.info.StartTime.UTC().Format(time.RFC3339Nano),
		FinishTime: p.d.opts.Clock.Now().UTC().Format(time.RFC3339Nano),
		Message:    msg,
		OutputTail: outputTail(p.info.LogDir, taskwire.MaxTailBytes),
	}
}
