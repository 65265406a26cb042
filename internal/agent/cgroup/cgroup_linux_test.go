package cgroup

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/testkit"
)

// TestMain runs the v1 start shim when the tests start a process through
// it (the test binary stands in for drover-agent).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == ShimArg {
		os.Exit(RunShim(os.Args[2:]))
	}
	testkit.VerifyNoLeaks(m)
}

// newManager is a Manager under a parent of its own, or a skip when this
// machine cannot run the test.
func newManager(t *testing.T) *Manager {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("cgroup tests need root (to create cgroups); run as root on a node with cgroup v1 or v2 mounted")
	}
	m, err := New(Options{})
	if err != nil {
		t.Skipf("cgroup tests need a cgroup filesystem: %v", err)
	}
	return m
}

func TestValidName(t *testing.T) {
	for _, ok := range []string{"a", "task-1", "0f6e2d3c-1b2a-4c5d-9e8f-000000000001", "x.y"} {
		if err := ValidName(ok); err != nil {
			t.Errorf("ValidName(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "a/b", "../x", "cgroup.procs", "memory.max", "tasks", strings.Repeat("a", 202), "a b"} {
		if err := ValidName(bad); err == nil {
			t.Errorf("ValidName(%q) = nil, want an error", bad)
		}
	}
}

func TestParentRefusesDotDot(t *testing.T) {
	if _, err := New(Options{Parent: "../../etc"}); err == nil {
		t.Fatal("New accepted a parent with ..")
	}
}

// startIn starts sh -c script inside g and returns its pid.
func startIn(t *testing.T, g *Group, script string) int {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	done, err := g.Prepare(cmd)
	if err != nil {
		t.Fatal(err)
	}
	err = cmd.Start()
	done()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Wait() })
	return cmd.Process.Pid
}

// TestKillTakesEscapees starts a process whose child leaves its group
// and session (setsid): killing the cgroup still ends both.
func TestKillTakesEscapees(t *testing.T) {
	m := newManager(t)
	g, err := m.Create("cgtest-kill-"+strconv.Itoa(os.Getpid()), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Remove() })
	pidFile := filepath.Join(t.TempDir(), "pid")
	startIn(t, g, "setsid sh -c 'echo $$ > "+pidFile+"; exec sleep 600' & exec sleep 600")
	var escapee int
	testkit.Eventually(t, testkit.DefaultTimeout, func() string {
		b, _ := os.ReadFile(pidFile)
		escapee, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		if escapee == 0 {
			return "the setsid child has not written its pid"
		}
		return ""
	})
	t.Cleanup(func() { _ = syscall.Kill(escapee, syscall.SIGKILL) })
	pids, err := g.Pids()
	if err != nil || !slices.Contains(pids, escapee) {
		t.Fatalf("cgroup pids %v (%v) lack the setsid child %d: it started outside the cgroup", pids, err, escapee)
	}
	if err := g.Kill(); err != nil {
		t.Fatal(err)
	}
	if pids, _ := g.Pids(); len(pids) != 0 {
		t.Fatalf("after Kill the cgroup still holds %v", pids)
	}
	testkit.Eventually(t, testkit.DefaultTimeout, func() string {
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(escapee) + "/stat"); err == nil && !strings.Contains(string(b), ") Z") {
			return "the setsid child is alive"
		}
		return ""
	})
	dirs := g.Dirs()
	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("cgroup dir %s still exists after Remove (%v)", d, err)
		}
	}
}

func TestLimitsWritten(t *testing.T) {
	m := newManager(t)
	g, err := m.Create("cgtest-limits-"+strconv.Itoa(os.Getpid()), Limits{MemoryBytes: 64 << 20, CPUMillis: 250})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Remove() })
	read := func(dir, file string) string {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	if g.v2 != "" {
		if got := read(g.v2, "cpu.max"); got != "25000 100000" {
			t.Errorf("cpu.max = %q, want 25000 100000", got)
		}
		if got := read(g.v2, "memory.max"); got != strconv.Itoa(64<<20) {
			t.Errorf("memory.max = %q", got)
		}
		return
	}
	if got := read(g.v1["cpu"], "cpu.cfs_quota_us"); got != "25000" {
		t.Errorf("cpu.cfs_quota_us = %q, want 25000 (250m of a 100000us period)", got)
	}
	if got := read(g.v1["cpu"], "cpu.cfs_period_us"); got != "100000" {
		t.Errorf("cpu.cfs_period_us = %q, want 100000", got)
	}
	if got := read(g.v1["memory"], "memory.limit_in_bytes"); got != strconv.Itoa(64<<20) {
		t.Errorf("memory.limit_in_bytes = %q, want %d", got, 64<<20)
	}
	// Open finds the same group from its dirs.
	o, err := Open(g.Dirs(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.Dirs(), g.Dirs()) {
		t.Errorf("Open(%q).Dirs() = %q", g.Dirs(), o.Dirs())
	}
	if _, err := Open([]string{t.TempDir()}, nil); err == nil {
		t.Error("Open accepted a dir that is not on a cgroup filesystem")
	}
}

// TestV2Unified runs the v2 path (clone into the cgroup, cgroup.kill) on
// a cgroup2 mount even without controllers (a hybrid node's unified mount).
func TestV2Unified(t *testing.T) {
	newManager(t)
	_, v2, err := mounts()
	if err != nil || v2 == nil {
		t.Skip("no cgroup2 mount")
	}
	own, err := ownCgroups()
	if err != nil {
		t.Fatal(err)
	}
	parent := parentDir(*v2, own[""], "")
	if err := os.MkdirAll(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	g := &Group{log: newManagerLog(), v2: filepath.Join(parent, "cgtest-v2-"+strconv.Itoa(os.Getpid()))}
	if err := os.Mkdir(g.v2, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Remove() })
	startIn(t, g, "setsid sleep 600 & exec sleep 600")
	testkit.Eventually(t, testkit.DefaultTimeout, func() string {
		if pids, _ := g.Pids(); len(pids) != 2 {
			return "want 2 processes in the cgroup, have " + strconv.Itoa(len(pids))
		}
		return ""
	})
	if err := g.Kill(); err != nil {
		t.Fatal(err)
	}
	if pids, _ := g.Pids(); len(pids) != 0 {
		t.Fatalf("after Kill the cgroup holds %v", pids)
	}
}

func newManagerLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

// cpuTicks is the CPU time pid used (utime + stime of /proc/<pid>/stat).
func cpuTicks(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	// After the comm: state is field 3 of the file, utime 14, stime 15.
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return u + st
}

// TestFreezeThaw freezes a group (a standby instance), and kills a frozen
// group: Remove must not hang on it.
func TestFreezeThaw(t *testing.T) {
	m := newManager(t)
	g, err := m.Create("freeze-"+strconv.Itoa(os.Getpid()), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Remove()
	pid := startIn(t, g, "while :; do :; done")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 2 {
		start := time.Now()
		if err := g.Freeze(ctx); err != nil {
			t.Fatal(err)
		}
		froze := time.Since(start)
		if !g.Frozen() {
			t.Fatal("not frozen after Freeze")
		}
		// A frozen busy loop uses no CPU (a running one would: no
		// assertion that it does, the machine may be loaded).
		before := cpuTicks(t, pid)
		time.Sleep(200 * time.Millisecond)
		if after := cpuTicks(t, pid); after != before {
			t.Fatalf("a frozen process used CPU: %d ticks, then %d", before, after)
		}
		start = time.Now()
		if err := g.Thaw(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("freeze %v, thaw %v (mode %s)", froze, time.Since(start), m.Mode())
		if g.Frozen() {
			t.Fatal("frozen after Thaw")
		}
	}
	if !g.Exists() {
		t.Fatal("the group does not exist")
	}
	if err := g.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.Remove(); err != nil {
		t.Fatalf("remove a frozen group: %v", err)
	}
	if g.Exists() {
		t.Fatal("the group exists after Remove")
	}
}
