package taskexec

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/drover-fleet/drover/internal/agent/cgroup"
	"github.com/drover-fleet/drover/internal/task/taskwire"
)

// workIDRE is what a work id may be to name a directory.
var workIDRE = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._-]{0,252}$`)

// Prepared is an attempt ready to start: its directories and log files
// exist and its artifacts are fetched.
type Prepared struct {
	d         *Driver
	id        string
	spec      *taskwire.Spec
	started   bool // Start took it over; guarded by d.mu
	released  bool // Close or Start ran; guarded by d.mu
	path, dir string
	user      User
	env       []string
	logDir    string
	args      []string // the argv to start: the spec's command, or the companion's
	container bool     // a containerd attempt: the process is its companion
}

// Prepare checks spec, creates the attempt's directories and log files and
// fetches its artifacts. Its error is an *Error. ctx bounds the fetches.
func (d *Driver) Prepare(ctx context.Context, id string, spec *taskwire.Spec) (*Prepared, error) {
	startErr := func(format string, args ...any) error {
		return &Error{Reason: taskwire.ReasonStartError, Err: fmt.Errorf(format, args...)}
	}
	if !workIDRE.MatchString(id) {
		return nil, startErr("work id %q cannot name a directory", id)
	}
	if err := spec.Validate(); err != nil {
		return nil, startErr("%w", err)
	}
	user, err := d.runAs(spec)
	if err != nil {
		return nil, &Error{Reason: taskwire.ReasonRunAs, Err: err}
	}
	container := spec.Driver == taskwire.DriverContainerd
	if container {
		if err := d.opts.Containerd.available(); err != nil {
			return nil, &Error{Reason: taskwire.ReasonDriverUnavailable, Err: err}
		}
	}
	p := &Prepared{d: d, id: id, spec: spec, logDir: d.TaskDir(id), user: user, args: spec.Command}
	attempt := d.WorkDir(id)
	// From here the collector leaves the task dir alone, until Start hands
	// it to the process or Close marks it ended.
	d.mu.Lock()
	d.preparing[id]++
	d.mu.Unlock()
	ok := false
	defer func() {
		if !ok {
			p.Close()
		}
	}()
	// An attempt prepared again (the agent restarted before its start)
	// is no longer ended.
	if err := os.Remove(filepath.Join(p.logDir, EndedFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, startErr("clear the task dir: %w", err)
	}
	if err := os.MkdirAll(p.logDir, 0o700); err != nil {
		return nil, startErr("create the task dir: %w", err)
	}
	if container {
		if err := d.prepareContainer(p); err != nil {
			return nil, startErr("%w", err)
		}
		if err := createLogs(p.logDir); err != nil {
			return nil, startErr("%w", err)
		}
		ok = true
		return p, nil
	}
	if d.switching {
		if err := reachable(attempt, user); err != nil {
			return nil, startErr("%w", err)
		}
	}
	if err := d.makeAttemptDir(attempt, user); err != nil {
		return nil, startErr("%w", err)
	}
	if p.dir, err = d.workingDir(attempt, spec.WorkingDir, user); err != nil {
		return nil, startErr("%w", err)
	}
	if err := d.fetchArtifacts(ctx, p.dir, spec.Artifacts, user); err != nil {
		return nil, &Error{Reason: taskwire.ReasonArtifact, Err: err}
	}
	p.env = taskEnv(spec, attempt)
	if p.path, err = lookPath(spec.Command[0], p.env, p.dir); err != nil {
		return nil, startErr("%w", err)
	}
	if err := createLogs(p.logDir); err != nil {
		return nil, startErr("%w", err)
	}
	ok = true
	return p, nil
}

// createLogs makes the log files, empty, so that a reader finds them from
// the start; the log shim writes them.
func createLogs(dir string) error {
	for _, name := range []string{StdoutFile, StderrFile} {
		f, err := openLog(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		f.Close()
	}
	return nil
}

// Close releases a prepared attempt that will not start: its task dir is
// marked ended, for the collector.
func (p *Prepared) Close() {
	d := p.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if p.released {
		return
	}
	p.released = true
	if d.preparing[p.id]--; d.preparing[p.id] <= 0 {
		delete(d.preparing, p.id)
	}
	if !p.started && !d.busy(p.id) {
		if _, err := os.Stat(p.logDir); err == nil {
			d.markEnded(p.id)
		}
	}
}

// openLog opens a log for appending: O_APPEND keeps a process writing at
// the end after copy-truncate rotation empties the file.
func openLog(name string) (*os.File, error) {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	return f, nil
}

// defaultPath is PATH when the agent has none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// taskEnv is the minimal environment plus the spec's (later entries win).
// HOME is the attempt's own dir: the agent's HOME is not the task user's.
func taskEnv(spec *taskwire.Spec, home string) []string {
	path := os.Getenv("PATH")
	if path == "" {
		path = defaultPath
	}
	env := []string{
		"PATH=" + path,
		"HOME=" + home,
		"DROVER_TASK_NAME=" + spec.Name,
		"DROVER_TASK_NAMESPACE=" + spec.Namespace,
		"DROVER_TASK_ATTEMPT=" + strconv.Itoa(int(spec.Attempt)),
	}
	env = append(env, spec.Env...)
	// Keep the last of each name, as a shell would.
	seen := map[string]int{}
	out := env[:0:0]
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if i, ok := seen[name]; ok {
			out[i] = kv
			continue
		}
		seen[name] = len(out)
		out = append(out, kv)
	}
	return out
}

// lookPath finds a command without a slash in the task's PATH (not the
// agent's); a relative one with a slash is relative to the working dir.
func lookPath(name string, env []string, dir string) (string, error) {
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if err := executable(p); err != nil {
			return "", fmt.Errorf("command %s: %w", name, err)
		}
		return p, nil
	}
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" || !filepath.IsAbs(d) {
			continue // a relative PATH entry would depend on the working dir
		}
		p := filepath.Join(d, name)
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("command %q not found in PATH %s", name, path)
}

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", p)
	}
	return nil
}

// Start starts the prepared attempt. Its error is an *Error.
func (p *Prepared) Start() (*Proc, error) {
	defer p.Close()
	d := p.d
	// The log shim first: it holds the read ends of the task's stdout and
	// stderr, which the task gets as the write ends.
	shim, stdout, stderr, err := d.startLogShim(p.logDir)
	if err != nil {
		return nil, &Error{Reason: taskwire.ReasonStartError, Err: err}
	}
	// Once the task has them (or failed to start), the shim's EOF is the
	// end of the last process holding them.
	defer stdout.Close()
	defer stderr.Close()
	shimPID := shim.Process.Pid
	shim.Process.Release() // the monitor reaps it by pid
	cred := d.credential(p.user)
	if p.container {
		cred = nil // the companion is the agent's; its container runs as p.user
	}
	cmd := &exec.Cmd{
		Path:   p.path,
		Args:   p.args,
		Env:    p.env,
		Dir:    p.dir,
		Stdout: stdout,
		Stderr: stderr,
		// Its own group: signals go to everything it started, and an agent
		// stopped from a terminal (SIGINT to the foreground group) leaves it.
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Credential: cred},
	}
	// From here the monitor reaps the shim whenever it ends: at once when
	// the task does not start (its pipes close with the deferred Closes).
	d.mu.Lock()
	d.shims[shimPID] = struct{}{}
	d.mu.Unlock()
	d.kick()
	var cg *cgroup.Group
	// A container's cgroup is containerd's, with the spec's limits.
	if m := d.opts.Cgroups; m != nil && !p.container {
		var err error
		cg, err = m.Create(p.id, cgroup.Limits{MemoryBytes: p.spec.MemoryBytes, CPUMillis: p.spec.CPUMillis})
		if err != nil {
			return nil, &Error{Reason: taskwire.ReasonStartError, Err: fmt.Errorf("create the attempt's cgroup: %w", err)}
		}
	}
	startErr := func(err error) (*Proc, error) {
		if cg != nil {
			if rerr := cg.Remove(); rerr != nil {
				d.log.Warn("cannot remove the cgroup of a task that did not start", "id", p.id, "err", rerr)
			}
		}
		return nil, &Error{Reason: taskwire.ReasonStartError, Err: err}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return startErr(errors.New("the driver is closed"))
	}
	release := func() {}
	if cg != nil {
		var err error
		if release, err = cg.Prepare(cmd); err != nil {
			return startErr(err)
		}
	}
	err = cmd.Start()
	release()
	if err != nil {
		return startErr(fmt.Errorf("start %s: %w", p.args[0], err))
	}
	now := d.opts.Clock.Now()
	pid := cmd.Process.Pid
	// The monitor reaps by pid; the os.Process handle (a pidfd) is not needed.
	cmd.Process.Release()
	st, err := readStat(pid)
	if err != nil {
		// It cannot have been reaped (only the monitor reaps, and it waits
		// for d.mu), so /proc must have it.
		d.log.Warn("cannot read the start time of a task process", "pid", pid, "err", err)
	}
	shimSt, err := readStat(shimPID)
	if err != nil {
		// It may have ended already (the monitor reaps it under d.mu, so
		// not yet): a zero start time then only means the task's end does
		// not wait for it after a restart.
		d.log.Warn("cannot read the start time of a log shim", "pid", shimPID, "err", err)
	}
	info := Info{PID: pid, StartTicks: st.startTicks, StartTime: now, LogDir: p.logDir,
		LogShimPID: shimPID, LogShimStartTicks: shimSt.startTicks}
	if cg != nil {
		info.Cgroup = cg.Dirs()
	}
	if p.container {
		info.Container = p.id
	}
	if p.spec.TimeoutSeconds > 0 {
		info.Deadline = now.Add(time.Duration(p.spec.TimeoutSeconds) * time.Second)
	}
	proc := d.newProc(p.id, p.spec, info, true)
	proc.shimChild = true
	proc.cg = cg
	d.procs[proc] = struct{}{}
	p.started = true
	d.kick()
	d.log.Debug("task started", "id", p.id, "pid", pid, "logShim", shimPID, "command", p.args[0], "user", p.user.String(), "container", info.Container)
	return proc, nil
}
