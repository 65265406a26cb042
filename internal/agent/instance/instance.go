package instance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/drover-fleet/drover/internal/agent/cgroup"
	"github.com/drover-fleet/drover/internal/agent/taskexec"
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/task/taskwire"
)

// Environment the runtime gives every instance (besides taskexec's minimal
// one and the spec's env).
const (
	// EnvPort is the host port assigned to the instance: it listens there.
	EnvPort = "DROVER_PORT"
	// EnvInstance is the instance's name.
	EnvInstance = "DROVER_INSTANCE"
	// EnvApplication is "namespace/name" of its Application.
	EnvApplication = "DROVER_APPLICATION"
	// EnvSessionFile is the path of the session metadata file.
	EnvSessionFile = "DROVER_SESSION_FILE"
	// EnvSessionSocket is the unix socket of the instance's session
	// service (set when Spec.SessionSocket is).
	EnvSessionSocket = "DROVER_SESSION_SOCKET"
)

// SessionFileName is the session metadata file, in the instance's dir.
const SessionFileName = "drover-session.json"

// Options configure a Runtime.
type Options struct {
	// Driver runs the instances' processes (users, dirs, artifacts, logs,
	// cgroups). It needs Cgroups for standby instances (the freezer).
	Driver *taskexec.Driver
	// Ports assigns the instances' ports. Default: kernel-chosen.
	Ports *Ports
	// Clock measures freeze and thaw. Default: the wall clock.
	Clock  clock.Clock
	Logger *slog.Logger
}

// Runtime is the process runtime of serverless instances.
type Runtime struct {
	opts Options
	log  *slog.Logger
	http *http.Client
}

// New returns a Runtime.
func New(opts Options) (*Runtime, error) {
	if opts.Driver == nil {
		return nil, errors.New("instance runtime: no task driver")
	}
	if opts.Ports == nil {
		opts.Ports, _ = NewPorts(0, 0)
	}
	opts.Clock = clock.Or(opts.Clock)
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// Probes never follow a redirect off the instance, nor use a proxy.
	tr := &http.Transport{Proxy: nil, DisableKeepAlives: true}
	hc := &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return &Runtime{opts: opts, log: log, http: hc}, nil
}

// Spec is how an instance runs (from its Application).
type Spec struct {
	// Name of the instance: a directory-safe id, unique on the node.
	Name string
	// Namespace and Application name its Application.
	Namespace, Application string
	Command                []string
	Env                    []string
	Artifacts              []taskwire.Artifact
	RunAsUser, RunAsGroup  *int64
	MemoryBytes, CPUMillis int64
	// SessionSocket is the path of its session service's socket, given to
	// the instance in EnvSessionSocket.
	SessionSocket string
}

// Instance is one running instance.
type Instance struct {
	rt    *Runtime
	name  string
	port  int
	proc  *taskexec.Proc
	group *cgroup.Group // nil without cgroups
	dir   string
	env   []string
	cred  *syscall.Credential // the instance's user, for exec probes; nil: the agent's

	mu     sync.Mutex
	frozen bool
}

// Start starts an instance: its port is assigned, its process started in
// its own dir and cgroup, as its user.
func (r *Runtime) Start(ctx context.Context, spec Spec) (*Instance, error) {
	port, err := r.opts.Ports.Allocate(spec.Name)
	if err != nil {
		return nil, fmt.Errorf("instance %s: %w", spec.Name, err)
	}
	ok := false
	defer func() {
		if !ok {
			r.opts.Ports.Release(spec.Name)
		}
	}()
	dir := r.opts.Driver.WorkDir(spec.Name)
	env := []string{
		EnvPort + "=" + strconv.Itoa(port),
		EnvInstance + "=" + spec.Name,
		EnvApplication + "=" + spec.Namespace + "/" + spec.Application,
		EnvSessionFile + "=" + filepath.Join(dir, SessionFileName),
	}
	if spec.SessionSocket != "" {
		env = append(env, EnvSessionSocket+"="+spec.SessionSocket)
	}
	ts := &taskwire.Spec{
		Namespace: spec.Namespace, Name: spec.Name,
		Command: spec.Command, Env: append(append([]string{}, spec.Env...), env...),
		Artifacts: spec.Artifacts, RunAsUser: spec.RunAsUser, RunAsGroup: spec.RunAsGroup,
		MemoryBytes: spec.MemoryBytes, CPUMillis: spec.CPUMillis,
	}
	prep, err := r.opts.Driver.Prepare(ctx, spec.Name, ts)
	if err != nil {
		return nil, fmt.Errorf("instance %s: %w", spec.Name, err)
	}
	proc, err := prep.Start()
	if err != nil {
		return nil, fmt.Errorf("instance %s: %w", spec.Name, err)
	}
	i := &Instance{rt: r, name: spec.Name, port: port, proc: proc, dir: dir, env: env}
	if st, err := os.Stat(dir); err == nil && os.Geteuid() == 0 {
		// The driver made the dir its user's: probes run as the same user
		// (never as root: execProbe refuses to, see there).
		if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Uid != 0 {
			i.cred = &syscall.Credential{Uid: sys.Uid, Gid: sys.Gid, NoSetGroups: false, Groups: []uint32{}}
		}
	}
	if dirs := proc.Info().Cgroup; len(dirs) > 0 {
		if i.group, err = cgroup.Open(dirs, r.log); err != nil {
			proc.Stop(0)
			return nil, fmt.Errorf("instance %s: its cgroup: %w", spec.Name, err)
		}
	}
	ok = true
	r.log.Info("instance started", "instance", spec.Name, "pid", proc.Info().PID, "port", port)
	return i, nil
}

// Name, Port, Dir and PID of the instance.
func (i *Instance) Name() string { return i.name }
func (i *Instance) Port() int    { return i.port }
func (i *Instance) Dir() string  { return i.dir }
func (i *Instance) PID() int     { return i.proc.Info().PID }

// Info is what to persist to find the process again after a restart.
func (i *Instance) Info() taskexec.Info { return i.proc.Info() }

// Done is closed when the instance's process has ended (crashed, or
// stopped); Result then tells how.
func (i *Instance) Done() <-chan struct{} { return i.proc.Done() }

// Result is how the process ended; valid once Done is closed.
func (i *Instance) Result() taskexec.Result { return i.proc.Result() }

// Frozen reports whether the instance is standby (frozen).
func (i *Instance) Frozen() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.frozen
}

// WaitLive probes the instance every period until liveness and then
// readiness (either may be nil) pass, the process ends, or ctx ends: the
// pod actor's LivenessChecking (its timeout is ctx's).
func (i *Instance) WaitLive(ctx context.Context, liveness, readiness *Probe, period time.Duration) error {
	if period <= 0 {
		period = 100 * time.Millisecond
	}
	var last error
	for _, p := range []*Probe{liveness, readiness} {
		if p == nil {
			continue
		}
		for {
			if last = i.Probe(ctx, *p); last == nil {
				break
			}
			select {
			case <-i.Done():
				return fmt.Errorf("instance %s ended while probed: %s", i.name, i.Result().Report.Message)
			case <-ctx.Done():
				return fmt.Errorf("instance %s not live: %w (last probe: %w)", i.name, ctx.Err(), last)
			case <-i.rt.opts.Clock.After(period):
			}
		}
	}
	return i.Alive()
}

// Freeze makes the instance standby: every process of its cgroup frozen.
// It returns how long the kernel took.
func (i *Instance) Freeze(ctx context.Context) (time.Duration, error) {
	return i.freezer(ctx, true)
}

// Thaw activates a standby instance; it returns how long it took.
func (i *Instance) Thaw(ctx context.Context) (time.Duration, error) {
	return i.freezer(ctx, false)
}

func (i *Instance) freezer(ctx context.Context, freeze bool) (time.Duration, error) {
	if i.group == nil {
		return 0, fmt.Errorf("instance %s: standby needs cgroups (drover-agent runs tasks in cgroups as root)", i.name)
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	start := i.rt.opts.Clock.Now()
	var err error
	if freeze {
		err = i.group.Freeze(ctx)
	} else {
		err = i.group.Thaw(ctx)
	}
	took := i.rt.opts.Clock.Since(start)
	if err != nil {
		return took, fmt.Errorf("instance %s: %w", i.name, err)
	}
	i.frozen = freeze
	return took, nil
}

// Alive is the liveness of a frozen instance (and the least of any): its
// process has not ended and its cgroup exists.
func (i *Instance) Alive() error {
	select {
	case <-i.Done():
		return fmt.Errorf("instance %s ended: %s", i.name, i.Result().Report.Message)
	default:
	}
	if err := syscall.Kill(i.PID(), 0); errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("instance %s: process %d is gone", i.name, i.PID())
	}
	if i.group != nil && !i.group.Exists() {
		return fmt.Errorf("instance %s: its cgroup is gone", i.name)
	}
	return nil
}

// Status is what the runtime knows of an instance.
type Status struct {
	Name   string       `json:"name"`
	PID    int          `json:"pid"`
	Port   int          `json:"port"`
	Frozen bool         `json:"frozen"`
	Ended  bool         `json:"ended"`
	Stats  cgroup.Stats `json:"stats"`
	// Result, once Ended.
	Result *taskexec.Result `json:"result,omitempty"`
}

// Status of the instance now.
func (i *Instance) Status() Status {
	s := Status{Name: i.name, PID: i.PID(), Port: i.port, Frozen: i.Frozen()}
	if i.group != nil {
		s.Stats = i.group.Stats()
	}
	select {
	case <-i.Done():
		r := i.Result()
		s.Ended, s.Result = true, &r
	default:
	}
	return s
}

// Stop stops the instance, crashed or not (thawed first: a frozen process does not take
// SIGTERM, nor on v1 SIGKILL): SIGTERM, SIGKILL after grace, its whole
// cgroup killed and removed, its port released. It returns once the
// process has ended, or ctx ends.
func (i *Instance) Stop(ctx context.Context, grace time.Duration) error {
	if i.Frozen() {
		if _, err := i.Thaw(ctx); err != nil {
			i.rt.log.Warn("cannot thaw the instance to stop it; killing its cgroup", "instance", i.name, "err", err)
			if i.group != nil {
				_ = i.group.Kill()
			}
		}
	}
	i.proc.Stop(grace)
	select {
	case <-i.Done():
		// Its port is free once nothing of it can listen there.
		i.rt.opts.Ports.Release(i.name)
		return nil
	case <-ctx.Done():
		// The process was told to stop and is killed after grace: its
		// port goes back when it has ended, not never.
		go func() {
			<-i.Done()
			i.rt.opts.Ports.Release(i.name)
		}()
		return fmt.Errorf("instance %s: not stopped: %w", i.name, ctx.Err())
	}
}

// SessionMetadata is the content of the session metadata file: the
// Application's and the sessions' customer data, for the instance to read.
type SessionMetadata struct {
	Instance    string            `json:"instance"`
	Application string            `json:"application"`
	AppData     map[string]string `json:"appData,omitempty"`
	Sessions    []SessionData     `json:"sessions"`
}

// SessionData is one session's entry in the metadata file.
type SessionData struct {
	Name string            `json:"name"`
	Data map[string]string `json:"data,omitempty"`
}

// WriteSessionFile (re)writes the session metadata file in the instance's
// dir: owned by the agent, read-only (0444), replaced atomically so that
// the instance never reads half of it. The dir is the instance's own
// (0700): no other instance reads it.
func (i *Instance) WriteSessionFile(m SessionMetadata) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(i.dir, ".drover-session-*")
	if err != nil {
		return fmt.Errorf("session file of %s: %w", i.name, err)
	}
	defer os.Remove(tmp.Name())
	if _, err = tmp.Write(b); err == nil {
		err = tmp.Chmod(0o444)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(i.dir, SessionFileName))
	}
	if err != nil {
		return fmt.Errorf("session file of %s: %w", i.name, err)
	}
	return nil
}

// Member reports whether pid is a process of the instance (in its cgroup,
// or its main process without cgroups): the session service lets only
// those talk on the instance's socket.
func (i *Instance) Member(pid int) bool {
	if i.group == nil {
		return pid == i.PID()
	}
	pids, err := i.group.Pids()
	return err == nil && slices.Contains(pids, pid)
}
