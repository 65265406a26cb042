package taskexec

import (
	"errors"
	"fmt"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/task/taskwire"
)

// monitor is the driver's one goroutine: it wakes on SIGCHLD, on a new or
// cancelled process, and at the nearest deadline or poll time, and checks
// every watched process.
func (d *Driver) monitor() {
	defer close(d.done)
	clk := d.opts.Clock
	// Made only once a process needs it: a driver that watches none waits
	// on nothing but its channels (see Options.Clock).
	var timer clock.Timer
	for {
		next := d.scan(clk.Now())
		var tick <-chan time.Time
		if !next.IsZero() {
			if timer == nil {
				timer = clk.NewTimer(next.Sub(clk.Now()))
			} else {
				timer.Reset(next.Sub(clk.Now()))
			}
			tick = timer.Chan()
		}
		select {
		case <-d.stop:
			if timer != nil {
				timer.Stop()
			}
			return
		case <-d.wake:
		case <-d.sig:
		case <-tick:
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// scan checks every watched process and returns when to look again (zero:
// when something wakes the monitor).
func (d *Driver) scan(now time.Time) time.Time {
	d.mu.Lock()
	// Before the checks: a shim reaped here has written all it will.
	d.reapShims()
	procs := make([]*Proc, 0, len(d.procs))
	for p := range d.procs {
		procs = append(procs, p)
	}
	d.mu.Unlock()
	var next time.Time
	earliest := func(t time.Time) {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	for _, p := range procs {
		earliest(d.check(p, now))
	}
	return next
}

// check moves p on: reaps it if it ended, signals it if its time is up,
// rotates its logs when due. It returns when p needs looking at again.
func (d *Driver) check(p *Proc, now time.Time) time.Time {
	d.mu.Lock()
	if p.detached {
		d.mu.Unlock()
		return time.Time{}
	}
	if p.exit == nil {
		if res, ended := p.ended(); ended {
			p.exit = &res
			p.drainBy = now.Add(logDrainTimeout)
		}
	}
	if p.exit != nil {
		// The process has ended; its end waits for its log shim to have
		// written what it wrote, so that the report's tail holds its last
		// output (a leftover process that keeps its stdout bounds the wait).
		written := p.logsWritten()
		if !written && now.Before(p.drainBy) {
			d.mu.Unlock()
			if p.shimChild {
				return p.drainBy // or SIGCHLD, when the shim ends
			}
			if poll := now.Add(d.opts.PollInterval); poll.Before(p.drainBy) {
				return poll
			}
			return p.drainBy
		}
		if !written {
			d.log.Warn("a task ended while its output is still being written (a process it started holds its stdout or stderr); reporting its end without waiting longer",
				"id", p.id, "pid", p.info.PID, "logShim", p.info.LogShimPID, "waited", logDrainTimeout)
		}
		res := *p.exit
		res.Report.OutputTail = outputTail(p.info.LogDir, taskwire.MaxTailBytes)
		// Marked before Done closes: whoever sees the end sees the mark.
		d.markEnded(p.id)
		p.finish(res)
		d.mu.Unlock()
		d.log.Debug("task ended", "id", p.id, "pid", p.info.PID, "phase", res.Phase, "reason", res.Reason)
		return time.Time{}
	}
	var next time.Time
	if p.termAt.IsZero() {
		switch {
		case p.cancel:
			p.cause = taskwire.ReasonCancelled
		case !p.info.Deadline.IsZero() && !now.Before(p.info.Deadline):
			p.cause = taskwire.ReasonTimeout
		}
		if p.cause != "" {
			d.log.Info("stopping task", "id", p.id, "pid", p.info.PID, "why", p.cause)
			p.signal(syscall.SIGTERM)
			p.termAt = now
		} else {
			next = p.info.Deadline
		}
	}
	if !p.termAt.IsZero() && !p.killed {
		if killAt := p.termAt.Add(p.killTimeout); now.Before(killAt) {
			next = killAt
		} else {
			d.log.Info("task still running after SIGTERM; killing it", "id", p.id, "pid", p.info.PID, "killTimeout", p.killTimeout)
			p.signal(syscall.SIGKILL)
			p.killCgroup()
			p.killed = true
		}
	}
	d.mu.Unlock()
	if !now.Before(p.nextCheck) && p.info.LogShimPID == 0 {
		// An attempt an older agent started writes its log files itself:
		// they are rotated here, by copy-truncate (see rotate). Out of the
		// lock: a copy may take a while.
		for _, name := range []string{StdoutFile, StderrFile} {
			if err := rotate(filepath.Join(p.info.LogDir, name), d.opts.MaxLogBytes); err != nil {
				d.log.Warn("cannot rotate a task log", "id", p.id, "file", name, "err", err)
			}
		}
	}
	if !now.Before(p.nextCheck) {
		p.nextCheck = now.Add(d.opts.PollInterval)
	}
	if next.IsZero() || p.nextCheck.Before(next) {
		next = p.nextCheck
	}
	return next
}

// logDrainTimeout bounds how long the end of an attempt waits for its log
// shim once its process has ended.
const logDrainTimeout = 5 * time.Second

// logsWritten reports whether p's log shim has ended (or p has none): all
// of p's output is in its log files. d.mu is held.
func (p *Proc) logsWritten() bool {
	pid := p.info.LogShimPID
	if pid <= 0 {
		return true
	}
	if p.shimChild {
		_, running := p.d.shims[pid]
		return !running
	}
	st, err := readStat(pid)
	return err != nil || st.startTicks != p.info.LogShimStartTicks || st.state == 'Z' || st.state == 'X'
}

// reapShims reaps the log shims (children) that have ended. d.mu is held.
func (d *Driver) reapShims() {
	for pid := range d.shims {
		for {
			var si unix.Siginfo
			err := unix.Waitid(unix.P_PID, pid, &si, unix.WEXITED|unix.WNOHANG, nil)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if err != nil || si.Signo != 0 {
				delete(d.shims, pid) // reaped, or not ours to reap (ECHILD)
			}
			break
		}
	}
}

// signal sends sig to p's group (to p alone if it leads none). An error
// (the process is gone) is left to the next check to notice.
func (p *Proc) signal(sig syscall.Signal) {
	if p.info.Container != "" {
		p.d.killContainer(p, sig)
		return
	}
	target := p.info.PID
	if p.pgid == p.info.PID {
		target = -p.pgid
	}
	if err := syscall.Kill(target, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		p.d.log.Warn("cannot signal a task", "id", p.id, "pid", p.info.PID, "signal", sig.String(), "err", err)
	}
}

// ended reports whether p's process has ended, and reaps it if it is a
// child. d.mu is held.
func (p *Proc) ended() (Result, bool) {
	pid := p.info.PID
	if !p.child {
		st, err := readStat(pid)
		if err == nil && st.startTicks == p.info.StartTicks && st.state != 'Z' && st.state != 'X' {
			return Result{}, false
		}
		if err == nil && st.startTicks == p.info.StartTicks {
			// A zombie still holds its pid and group id: its group may be killed.
			p.killLeftovers()
		}
		p.endCgroup()
		if p.info.Container != "" {
			return p.containerResult(), true
		}
		return p.result(nil), true
	}
	var si unix.Siginfo
	for {
		// WNOWAIT: the zombie keeps the pid, so the group id cannot be
		// reused while the leftovers are killed.
		err := unix.Waitid(unix.P_PID, pid, &si, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			p.d.log.Error("cannot wait for a task process", "id", p.id, "pid", pid, "err", err)
			return Result{Phase: taskwire.PhaseFailed, Reason: taskwire.ReasonLost,
				Report: p.report(fmt.Sprintf("the agent lost track of the process: %v", err), nil)}, true
		}
		break
	}
	if si.Signo == 0 {
		return Result{}, false // still running
	}
	p.killLeftovers()
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(pid, &ws, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			p.d.log.Error("cannot reap a task process", "id", p.id, "pid", pid, "err", err)
		}
		break
	}
	p.endCgroup()
	if p.info.Container != "" {
		return p.containerResult(), true
	}
	return p.result(&ws), true
}

// killLeftovers kills what the command left in its group and cgroup.
func (p *Proc) killLeftovers() {
	if p.pgid == p.info.PID {
		_ = syscall.Kill(-p.pgid, syscall.SIGKILL) // ESRCH: nothing left
	}
	p.killCgroup()
}

// killCgroup kills every process in p's cgroup: those that left its
// process group (setsid, double forks) too.
func (p *Proc) killCgroup() {
	if p.cg == nil {
		return
	}
	if err := p.cg.Kill(); err != nil {
		p.d.log.Warn("cannot kill everything in a task's cgroup", "id", p.id, "err", err)
	}
}

// endCgroup, once p's process has ended, kills what is left in its cgroup,
// learns whether the kernel OOM-killed in it, and removes it.
func (p *Proc) endCgroup() {
	if p.cg == nil {
		return
	}
	p.killCgroup()
	p.oom = p.cg.OOMKilled()
	st := p.cg.Stats()
	p.d.log.Debug("task cgroup usage", "id", p.id, "cpu", st.CPU, "memoryPeak", st.MemoryPeak, "oomKilled", p.oom)
	if err := p.cg.Remove(); err != nil {
		p.d.log.Warn("cannot remove a task's cgroup", "id", p.id, "err", err)
	}
	p.cg = nil
}

// result is how p ended; ws is nil when p is not a child (its status is
// unknown).
func (p *Proc) result(ws *syscall.WaitStatus) Result {
	code := func(c int32) *int32 { return &c }
	switch p.cause {
	case taskwire.ReasonTimeout, taskwire.ReasonCancelled:
		phase, what := taskwire.PhaseFailed, fmt.Sprintf("timeout %s", p.timeout)
		if p.cause == taskwire.ReasonCancelled {
			phase, what = taskwire.PhaseCancelled, "cancel"
		}
		if p.killed {
			return Result{Phase: phase, Reason: p.cause, Report: p.report(
				fmt.Sprintf("killed (SIGKILL) after %s: still running %s after SIGTERM", what, p.killTimeout), code(taskwire.ExitSIGKILL))}
		}
		return Result{Phase: phase, Reason: p.cause, Report: p.report(
			fmt.Sprintf("terminated (SIGTERM) after %s", what), code(taskwire.ExitSIGTERM))}
	}
	if p.oom && (ws == nil || !ws.Exited() || ws.ExitStatus() != 0) {
		limit := "its memory limit"
		if p.memory > 0 {
			limit = fmt.Sprintf("its memory limit of %d bytes", p.memory)
		}
		return Result{Phase: taskwire.PhaseFailed, Reason: taskwire.ReasonOOMKilled, Report: p.report(
			fmt.Sprintf("killed by the kernel (OOM): it went over %s", limit), code(taskwire.ExitSIGKILL))}
	}
	switch {
	case ws == nil:
		return Result{Phase: taskwire.PhaseFailed, Reason: taskwire.ReasonLost, Report: p.report(
			"the agent restarted while the task ran; the process has ended since, but its exit code is unknown "+
				"(only its parent could learn it, and the new agent process is not its parent)", nil)}
	case ws.Exited() && ws.ExitStatus() == 0:
		return Result{Phase: taskwire.PhaseSucceeded, Report: p.report("", code(0))}
	case ws.Exited():
		c := int32(ws.ExitStatus())
		return Result{Phase: taskwire.PhaseFailed, Reason: taskwire.ReasonExitCode, Report: p.report(fmt.Sprintf("exited with code %d", c), &c)}
	case ws.Signaled():
		s := ws.Signal()
		return Result{Phase: taskwire.PhaseFailed, Reason: taskwire.ReasonSignal, Report: p.report(
			fmt.Sprintf("killed by signal %d (%s)", int(s), unix.SignalName(s)), code(128+int32(s)))}
	}
	return Result{Phase: taskwire.PhaseFailed, Reason: taskwire.ReasonLost, Report: p.report(fmt.Sprintf("unexpected wait status %#x", uint32(*ws)), nil)}
}
