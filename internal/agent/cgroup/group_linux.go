package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Group is one attempt's cgroup: one dir on v2, one per controller on v1.
type Group struct {
	log *slog.Logger
	v2  string
	v1  map[string]string // controller → dir
}

// Dirs are the group's dirs, to persist for Open.
func (g *Group) Dirs() []string {
	if g.v2 != "" {
		return []string{g.v2}
	}
	var out []string
	for _, c := range v1Controllers {
		if d, ok := g.v1[c]; ok && !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

// track is the dir whose cgroup.procs lists the group's processes.
func (g *Group) track() string {
	if g.v2 != "" {
		return g.v2
	}
	for _, c := range []string{"freezer", "memory", "pids", "cpu", "cpuacct"} {
		if d, ok := g.v1[c]; ok {
			return d
		}
	}
	return ""
}

func (g *Group) limit(lim Limits) error {
	var errs []error
	set := func(dir, file, value string) {
		if dir != "" {
			errs = append(errs, writeFile(filepath.Join(dir, file), value))
		}
	}
	if g.v2 != "" {
		if lim.MemoryBytes > 0 {
			set(g.v2, "memory.max", strconv.FormatInt(lim.MemoryBytes, 10))
			// No swap in place of memory: over its limit the attempt is
			// OOM-killed, as its resources promised the scheduler.
			if _, err := os.Stat(filepath.Join(g.v2, "memory.swap.max")); err == nil {
				set(g.v2, "memory.swap.max", "0")
			}
		}
		if lim.CPUMillis > 0 {
			set(g.v2, "cpu.max", fmt.Sprintf("%d %d", quota(lim.CPUMillis), cpuPeriod))
		}
		if lim.Pids > 0 {
			set(g.v2, "pids.max", strconv.FormatInt(lim.Pids, 10))
		}
		return errors.Join(errs...)
	}
	if lim.MemoryBytes > 0 {
		mem := g.v1["memory"]
		set(mem, "memory.limit_in_bytes", strconv.FormatInt(lim.MemoryBytes, 10))
		if _, err := os.Stat(filepath.Join(mem, "memory.memsw.limit_in_bytes")); err == nil {
			set(mem, "memory.memsw.limit_in_bytes", strconv.FormatInt(lim.MemoryBytes, 10))
		}
	}
	if lim.CPUMillis > 0 {
		set(g.v1["cpu"], "cpu.cfs_period_us", strconv.Itoa(cpuPeriod))
		set(g.v1["cpu"], "cpu.cfs_quota_us", strconv.FormatInt(quota(lim.CPUMillis), 10))
	}
	if lim.Pids > 0 {
		if g.v1["pids"] == "" {
			errs = append(errs, errors.New("a pids limit needs the pids controller, which is not mounted"))
		}
		set(g.v1["pids"], "pids.max", strconv.FormatInt(lim.Pids, 10))
	}
	return errors.Join(errs...)
}

// Prepare makes cmd start inside g, race-free: on v2 the kernel clones the
// process into the cgroup; on v1 cmd runs the shim (see the package doc).
// Call the returned function once cmd.Start returned.
func (g *Group) Prepare(cmd *exec.Cmd) (func(), error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	if g.v2 != "" {
		fd, err := unix.Open(g.v2, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("open cgroup %s: %w", g.v2, err)
		}
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
		return func() { syscall.Close(fd) }, nil
	}
	dirs := g.Dirs()
	args := []string{"drover-agent", ShimArg, strconv.Itoa(len(dirs))}
	args = append(args, dirs...)
	// The shim must enter the cgroups as the agent (cgroup.procs is
	// root's), so it takes the process's user over and drops to it itself.
	user := "-"
	if c := cmd.SysProcAttr.Credential; c != nil {
		user = strconv.FormatUint(uint64(c.Uid), 10) + ":" + strconv.FormatUint(uint64(c.Gid), 10)
		cmd.SysProcAttr.Credential = nil
	}
	args = append(args, user, cmd.Path)
	args = append(args, cmd.Args...)
	// /proc/self/exe in the forked child is the agent's own binary, even if
	// an upgrade replaced the file meanwhile.
	cmd.Path, cmd.Args = "/proc/self/exe", args
	return func() {}, nil
}

// killRounds bounds Kill: each round kills every process the group holds;
// only processes forked during a round survive it.
const killRounds = 100

// Kill kills every process in g and returns once none is left (zombies
// aside: their parents reap them).
func (g *Group) Kill() error {
	dir := g.track()
	if g.v2 != "" {
		if err := writeFile(filepath.Join(g.v2, "cgroup.kill"), "1"); err == nil {
			return g.waitEmpty(dir)
		}
		// Before Linux 5.14: no cgroup.kill; freeze and kill instead.
	}
	freeze, thaw := g.freezer()
	for range killRounds {
		pids, err := live(dir)
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		freeze()
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL) // ESRCH: it ended meanwhile
		}
		thaw()
		_ = g.waitEmpty(dir) // a fork in the round leaves one more: the next round kills it
	}
	pids, _ := live(dir)
	return fmt.Errorf("cgroup %s: %d processes still alive after %d rounds of SIGKILL", dir, len(pids), killRounds)
}

// freezer returns how to freeze and thaw g (no-ops without a freezer): a
// frozen group cannot fork between reading its pids and killing them.
func (g *Group) freezer() (freeze, thaw func()) {
	var file, frozen, thawed string
	switch {
	case g.v2 != "":
		file, frozen, thawed = filepath.Join(g.v2, "cgroup.freeze"), "1", "0"
	case g.v1["freezer"] != "":
		file, frozen, thawed = filepath.Join(g.v1["freezer"], "freezer.state"), "FROZEN", "THAWED"
	default:
		return func() {}, func() {}
	}
	freeze = func() {
		if err := writeFile(file, frozen); err != nil {
			g.log.Warn("cannot freeze a task's cgroup; killing it unfrozen", "err", err)
			return
		}
		// v1 freezes asynchronously (FREEZING); v2 tells in cgroup.events.
		for range 1000 {
			if g.frozen() {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	thaw = func() {
		if err := writeFile(file, thawed); err != nil {
			g.log.Warn("cannot thaw a task's cgroup", "err", err)
		}
	}
	return freeze, thaw
}

func (g *Group) frozen() bool {
	if g.v2 != "" {
		b, _ := os.ReadFile(filepath.Join(g.v2, "cgroup.events"))
		return strings.Contains(string(b), "frozen 1")
	}
	b, _ := os.ReadFile(filepath.Join(g.v1["freezer"], "freezer.state"))
	return strings.TrimSpace(string(b)) == "FROZEN"
}

// waitEmpty waits, briefly, for the killed processes to leave dir.
func (g *Group) waitEmpty(dir string) error {
	for range 2000 {
		pids, err := live(dir)
		if err != nil || len(pids) == 0 {
			return err
		}
		time.Sleep(time.Millisecond)
	}
	return fmt.Errorf("cgroup %s: processes still alive after SIGKILL", dir)
}

// live are the pids in dir that are not zombies (a zombie is killed
// already; its parent, perhaps the agent, reaps it).
func live(dir string) ([]int, error) {
	pids, err := readPids(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := pids[:0]
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue
		}
		if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X') {
			continue
		}
		out = append(out, pid)
	}
	return out, nil
}

// Pids are the live processes in g.
func (g *Group) Pids() ([]int, error) { return live(g.track()) }

// OOMKilled reports whether the kernel OOM-killed a process of g.
func (g *Group) OOMKilled() bool {
	if g.v2 != "" {
		return field(filepath.Join(g.v2, "memory.events"), "oom_kill") > 0
	}
	mem := g.v1["memory"]
	if mem == "" {
		return false
	}
	if n := field(filepath.Join(mem, "memory.oom_control"), "oom_kill"); n >= 0 {
		return n > 0
	}
	// Before Linux 4.13 oom_control has no count: hitting the limit is the
	// best sign left.
	b, _ := os.ReadFile(filepath.Join(mem, "memory.failcnt"))
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n > 0
}

// field reads "key value" lines of file: the value of key, -1 if missing.
func field(file, key string) int64 {
	b, err := os.ReadFile(file)
	if err != nil {
		return -1
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err == nil {
				return n
			}
		}
	}
	return -1
}

func readInt(file string) int64 {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// Stats reads what g has used.
func (g *Group) Stats() Stats {
	if g.v2 != "" {
		return Stats{
			CPU:         time.Duration(max(field(filepath.Join(g.v2, "cpu.stat"), "usage_usec"), 0)) * time.Microsecond,
			MemoryBytes: readInt(filepath.Join(g.v2, "memory.current")),
			MemoryPeak:  readInt(filepath.Join(g.v2, "memory.peak")),
		}
	}
	var s Stats
	if d := g.v1["cpuacct"]; d != "" {
		s.CPU = time.Duration(readInt(filepath.Join(d, "cpuacct.usage")))
	}
	if d := g.v1["memory"]; d != "" {
		s.MemoryBytes = readInt(filepath.Join(d, "memory.usage_in_bytes"))
		s.MemoryPeak = readInt(filepath.Join(d, "memory.max_usage_in_bytes"))
	}
	return s
}

// Remove kills what is left in g and removes its dirs.
func (g *Group) Remove() error {
	err := g.Kill()
	for _, d := range g.Dirs() {
		var rerr error
		// An exiting process may hold a cgroup for a moment after it
		// left cgroup.procs.
		for range 1000 {
			if rerr = syscall.Rmdir(d); !errors.Is(rerr, syscall.EBUSY) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if rerr != nil && !errors.Is(rerr, syscall.ENOENT) {
			err = errors.Join(err, fmt.Errorf("remove cgroup %s: %w", d, rerr))
		}
	}
	return err
}

// ErrNoFreezer is returned by Freeze and Thaw when g has no freezer: a v1
// node without the freezer controller mounted.
var ErrNoFreezer = errors.New("the cgroup has no freezer (cgroup v2 cgroup.freeze or the v1 freezer controller)")

// freezeFile is g's freezer file and its frozen and thawed values.
func (g *Group) freezeFile() (file, frozen, thawed string, err error) {
	switch {
	case g.v2 != "":
		return filepath.Join(g.v2, "cgroup.freeze"), "1", "0", nil
	case g.v1["freezer"] != "":
		return filepath.Join(g.v1["freezer"], "freezer.state"), "FROZEN", "THAWED", nil
	}
	return "", "", "", ErrNoFreezer
}

// Freeze freezes every process in g (a standby instance) and returns once
// the kernel says they all are, or ctx ends: v1 freezes asynchronously
// (FREEZING until done), v2 tells in cgroup.events. A frozen process uses
// no CPU and keeps its memory; it is not killable on v1 until thawed.
func (g *Group) Freeze(ctx context.Context) error {
	file, frozen, _, err := g.freezeFile()
	if err != nil {
		return err
	}
	if err := writeFile(file, frozen); err != nil {
		return fmt.Errorf("freeze: %w", err)
	}
	return g.waitFreezer(ctx, true)
}

// Thaw thaws g and returns once the kernel says it is thawed, or ctx ends.
func (g *Group) Thaw(ctx context.Context) error {
	file, _, thawed, err := g.freezeFile()
	if err != nil {
		return err
	}
	if err := writeFile(file, thawed); err != nil {
		return fmt.Errorf("thaw: %w", err)
	}
	return g.waitFreezer(ctx, false)
}

// Frozen reports whether g is frozen.
func (g *Group) Frozen() bool {
	if _, _, _, err := g.freezeFile(); err != nil {
		return false
	}
	return g.frozen()
}

// Exists reports whether g's cgroup dirs all still exist.
func (g *Group) Exists() bool {
	for _, d := range g.Dirs() {
		if _, err := os.Stat(d); err != nil {
			return false
		}
	}
	return true
}

func (g *Group) waitFreezer(ctx context.Context, want bool) error {
	for {
		if g.frozen() == want {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cgroup %s: still not %s: %w", g.track(), map[bool]string{true: "frozen", false: "thawed"}[want], ctx.Err())
		case <-time.After(200 * time.Microsecond):
		}
	}
}
