package taskexec

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/drover-fleet/drover/internal/ctrd/ctrdwire"
	"github.com/drover-fleet/drover/internal/task/taskwire"
)

// Containerd configures the containerd driver (see the package doc,
// "Containers").
type Containerd struct {
	// Companion is the path of drover-containerd. Required.
	Companion string
	// Address is containerd's socket. Default ctrdwire.DefaultAddress.
	Address string
	// Namespace is the containerd namespace of the containers and their
	// images. Default ctrdwire.DefaultNamespace.
	Namespace string
}

// ResultFile is the name, in an attempt's task dir, of the file in which
// its companion says how its container ended.
const ResultFile = "container-result.json"

// available says why the containerd driver cannot run a task now; nil
// when it can.
func (c *Containerd) available() error {
	if c == nil {
		return errors.New("this agent runs no containerd tasks: start drover-agent with --containerd-address (docs/containers.md)")
	}
	if fi, err := os.Stat(c.Address); err != nil || fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("containerd's socket %s is missing on this node: install and start containerd (docs/containers.md), or set drover-agent --containerd-address", c.Address)
	}
	if err := executable(c.Companion); err != nil {
		return fmt.Errorf("the containerd companion %s is missing: install drover-containerd next to drover-agent, or set --containerd-companion: %w", c.Companion, err)
	}
	return nil
}

// Available says why containerd cannot be used on this node now (its
// socket or the companion is missing); nil when it can.
func (c *Containerd) Available() error { return c.available() }

// base is the companion's argv up to its flags of one container.
func (c *Containerd) base(cmd, id string) []string {
	return []string{filepath.Base(c.Companion), cmd, "--address", c.Address, "--namespace", c.Namespace, "--id", id}
}

// prepareContainer fills p for a containerd attempt: the process the
// driver starts is the companion, as the agent's user; the container runs
// as p.user.
func (d *Driver) prepareContainer(p *Prepared) error {
	c := d.opts.Containerd
	spec := p.spec
	if err := os.Remove(filepath.Join(p.logDir, ResultFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("clear the result file: %w", err)
	}
	args := append(c.base("run", p.id), "--image", spec.Image, "--result", filepath.Join(p.logDir, ResultFile),
		"--user", strconv.FormatUint(uint64(p.user.UID), 10)+":"+strconv.FormatUint(uint64(p.user.GID), 10))
	if spec.MemoryBytes > 0 {
		args = append(args, "--memory", strconv.FormatInt(spec.MemoryBytes, 10))
	}
	if spec.CPUMillis > 0 {
		args = append(args, "--cpu-millis", strconv.FormatInt(spec.CPUMillis, 10))
	}
	if spec.WorkingDir != "" {
		args = append(args, "--cwd", spec.WorkingDir)
	}
	// The image's PATH and HOME stay; the task's names and its env are added.
	for _, kv := range append([]string{
		"DROVER_TASK_NAME=" + spec.Name,
		"DROVER_TASK_NAMESPACE=" + spec.Namespace,
		"DROVER_TASK_ATTEMPT=" + strconv.Itoa(int(spec.Attempt)),
	}, spec.Env...) {
		args = append(args, "--env", kv)
	}
	args = append(args, "--")
	p.args = append(args, spec.Command...)
	p.path = c.Companion
	p.dir = "/"
	p.env = []string{"PATH=" + defaultPath}
	p.container = true
	return nil
}

// killContainer asks the companion to send sig to p's container, through
// containerd: the companion's own signals are never the way to stop a
// container (a companion killed with SIGKILL would leave it running). The
// kill command is reaped by the monitor, as a log shim. d.mu is held.
func (d *Driver) killContainer(p *Proc, sig syscall.Signal) {
	c := d.opts.Containerd
	if c == nil {
		d.log.Warn("cannot stop a container: this agent runs without containerd (--containerd-address)", "id", p.id, "container", p.info.Container)
		return
	}
	name := "TERM"
	if sig == syscall.SIGKILL {
		name = "KILL"
	}
	d.companion(c.base("kill", p.info.Container), "--signal", name)
}

// removeContainer kills and deletes p's container: its companion ended
// without saying how it ended, and no one else would. d.mu is held.
func (d *Driver) removeContainer(p *Proc) {
	if c := d.opts.Containerd; c != nil {
		d.companion(c.base("rm", p.info.Container))
	}
}

// companion starts the companion with args, reaped by the monitor. d.mu
// is held.
func (d *Driver) companion(args []string, more ...string) {
	args = append(args, more...)
	cmd := &exec.Cmd{Path: d.opts.Containerd.Companion, Args: args, Dir: "/", Env: []string{"PATH=" + defaultPath},
		Stderr: os.Stderr, SysProcAttr: &syscall.SysProcAttr{Setpgid: true}}
	if err := cmd.Start(); err != nil {
		d.log.Warn("cannot run the containerd companion", "args", args, "err", err)
		return
	}
	d.shims[cmd.Process.Pid] = struct{}{}
	cmd.Process.Release()
	d.kick()
}

// containerResult is how a container attempt ended, from its companion's
// result file. d.mu is held.
func (p *Proc) containerResult() Result {
	r, ok, err := ctrdwire.ReadResult(filepath.Join(p.info.LogDir, ResultFile))
	if err != nil || !ok {
		// The companion died before its container ended: whatever runs
		// there now has no one to report it.
		p.d.removeContainer(p)
		msg := "drover-containerd ended without saying how the container ended (was it killed?); the container was removed"
		if err != nil {
			msg += ": " + err.Error()
		}
		return Result{Phase: taskwire.PhaseFailed, Reason: taskwire.ReasonLost, Report: p.report(msg, nil)}
	}
	if !r.Ran {
		reason := taskwire.ReasonStartError
		switch r.Reason {
		case ctrdwire.ReasonImageNotFound:
			reason = taskwire.ReasonImageNotFound
		case ctrdwire.ReasonUnavailable:
			reason = taskwire.ReasonDriverUnavailable
		case ctrdwire.ReasonGone:
			reason = taskwire.ReasonLost
		}
		if p.cause != "" {
			phase := taskwire.PhaseFailed
			if p.cause == taskwire.ReasonCancelled {
				phase = taskwire.PhaseCancelled
			}
			return Result{Phase: phase, Reason: p.cause, Report: p.report("stopped before its container ran: "+r.Message, nil)}
		}
		return Result{Phase: taskwire.PhaseFailed, Reason: reason, Report: p.report(r.Message, nil)}
	}
	p.oom = r.OOMKilled
	// As a wait status, so that the exec rules apply (timeout and cancel
	// 143/137, OOM 137, signal n 128+n).
	var ws syscall.WaitStatus
	if r.ExitCode > 128 && r.ExitCode < 128+65 {
		ws = syscall.WaitStatus(r.ExitCode - 128) // signalled
	} else {
		ws = syscall.WaitStatus((r.ExitCode & 0xff) << 8) // exited
	}
	return p.result(&ws)
}

// reattach starts a new companion that waits for info's container when
// the one that started it is gone without writing how the container
// ended (it was killed, say with the agent's whole unit): the container
// lives in containerd, and the new companion (drover-containerd wait)
// takes over its output, its end and its removal. It returns nil when
// Adopt watches as for any process: the companion still runs, or it
// ended and said how.
func (d *Driver) reattach(id string, spec *taskwire.Spec, info Info) *Proc {
	c := d.opts.Containerd
	if c == nil {
		return nil
	}
	if st, err := readStat(info.PID); err == nil && info.PID > 0 && st.startTicks == info.StartTicks && st.state != 'Z' {
		return nil
	}
	result := filepath.Join(info.LogDir, ResultFile)
	if _, err := os.Stat(result); err == nil {
		return nil
	}
	shim, stdout, stderr, err := d.startLogShim(info.LogDir)
	if err != nil {
		d.log.Warn("cannot re-attach to a container", "id", id, "container", info.Container, "err", err)
		return nil
	}
	// The new companion holds them once started; the shim ends when it does.
	defer stdout.Close()
	defer stderr.Close()
	shimPID := shim.Process.Pid
	shim.Process.Release() // the monitor reaps it by pid
	cmd := &exec.Cmd{Path: c.Companion, Args: append(c.base("wait", info.Container), "--result", result), Dir: "/",
		Env: []string{"PATH=" + defaultPath}, Stdout: stdout, Stderr: stderr, SysProcAttr: &syscall.SysProcAttr{Setpgid: true}}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.shims[shimPID] = struct{}{}
	d.kick()
	if d.closed {
		return nil
	}
	if err := cmd.Start(); err != nil {
		d.log.Warn("cannot re-attach to a container", "id", id, "container", info.Container, "err", err)
		return nil
	}
	pid := cmd.Process.Pid
	cmd.Process.Release()
	st, _ := readStat(pid)
	shimSt, _ := readStat(shimPID)
	info.PID, info.StartTicks = pid, st.startTicks
	info.LogShimPID, info.LogShimStartTicks = shimPID, shimSt.startTicks
	proc := d.newProc(id, spec, info, true)
	proc.shimChild = true
	d.procs[proc] = struct{}{}
	d.log.Info("task re-attached to its container with a new companion (the one that started it is gone)",
		"id", id, "container", info.Container, "pid", pid)
	return proc
}
