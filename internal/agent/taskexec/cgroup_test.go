package taskexec

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/drover-fleet/drover/internal/agent/cgroup"
	"github.com/drover-fleet/drover/internal/task/taskwire"
	"github.com/drover-fleet/drover/internal/testkit"
)

// hogEnv makes the test binary a memory hog (see TestMain).
const hogEnv = "TASKEXEC_TEST_MEMORY_HOG"

// hog allocates and touches memory, 1 MiB at a time, until a memory limit
// kills it; it gives up at 1 GiB, so that without a limit it fails its test
// rather than the machine.
func hog() {
	var keep [][]byte
	for {
		b := make([]byte, 1<<20)
		for i := range b {
			b[i] = 1
		}
		keep = append(keep, b)
		if len(keep) >= 1<<10 {
			os.Exit(3)
		}
	}
}

// cgroupDriver is a driver that contains attempts in cgroups, or a skip
// when this machine cannot.
func cgroupDriver(t *testing.T, opts Options) *Driver {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("cgroup tests need root (to create cgroups); run as root on a node with cgroup v1 or v2 mounted")
	}
	m, err := cgroup.New(cgroup.Options{})
	if err != nil {
		t.Skipf("cgroup tests need a cgroup filesystem: %v", err)
	}
	opts.Cgroups = m
	return newDriver(t, opts)
}

// escape is a shell script that starts a process out of its group and
// session (setsid), which writes its pid to pidFile (in the working dir:
// the task runs as nobody); the script waits for the file and then goes on
// with rest.
const pidFile = "pid"

func escape(pidFile, rest string) []string {
	return []string{"sh", "-c", fmt.Sprintf(
		`setsid sh -c 'echo $$ > %[1]s.tmp; mv %[1]s.tmp %[1]s; exec sleep 600' & while [ ! -s %[1]s ]; do sleep 0.01; done; %[2]s`, pidFile, rest)}
}

// escapee waits for the pid the escaped process of attempt id wrote.
func escapee(t *testing.T, d *Driver, id string) int {
	t.Helper()
	name := filepath.Join(d.WorkDir(id), pidFile)
	var pid int
	testkit.Eventually(t, testTimeout, func() string {
		b, _ := os.ReadFile(name)
		if pid, _ = strconv.Atoi(strings.TrimSpace(string(b))); pid == 0 {
			return "the setsid process has not written its pid to " + name
		}
		return ""
	})
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	return pid
}

// requireGone fails unless pid ends (a zombie has ended).
func requireGone(t *testing.T, pid int, when string) {
	t.Helper()
	testkit.Eventually(t, testTimeout, func() string {
		st, err := readStat(pid)
		if err == nil && st.state != 'Z' && st.state != 'X' {
			return fmt.Sprintf("the setsid process %d is still alive %s: it escaped the attempt's stop", pid, when)
		}
		return ""
	})
}

// requireRemoved fails unless the attempt's cgroup dirs are gone.
func requireRemoved(t *testing.T, dirs []string) {
	t.Helper()
	if len(dirs) == 0 {
		t.Fatal("the attempt's Info names no cgroup")
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("cgroup dir %s still exists after the attempt (%v)", d, err)
		}
	}
}

func TestCgroupEscapeAfterComplete(t *testing.T) {
	d := cgroupDriver(t, Options{})
	p := start(t, d, "cg-complete-1", &taskwire.Spec{Command: escape(pidFile, "exit 0")})
	r := wait(t, p)
	if r.Phase != taskwire.PhaseSucceeded {
		t.Fatalf("result %+v, want Succeeded", r)
	}
	requireGone(t, escapee(t, d, "cg-complete-1"), "after its task completed")
	requireRemoved(t, p.Info().Cgroup)
}

// In cgroups (v1: through the start shim) a task still runs as its user.
func TestCgroupRunsAsItsUser(t *testing.T) {
	d := cgroupDriver(t, Options{})
	if got := ids(t, d, "cg-user-1", taskwire.Spec{RunAsUser: id64(1234), RunAsGroup: id64(4321)}); got != "1234\n4321\n4321\n" {
		t.Errorf("in cgroups (%s): id -u, -g, -G = %q, want 1234, 4321, 4321", d.opts.Cgroups.Mode(), got)
	}
}

func TestCgroupEscapeAfterTimeout(t *testing.T) {
	d := cgroupDriver(t, Options{})
	p := start(t, d, "cg-timeout-1", &taskwire.Spec{Command: escape(pidFile, "exec sleep 600"), TimeoutSeconds: 1, KillTimeoutSeconds: 1})
	pid := escapee(t, d, "cg-timeout-1")
	r := wait(t, p)
	if r.Phase != taskwire.PhaseFailed || r.Reason != taskwire.ReasonTimeout {
		t.Fatalf("result %+v, want Failed, timeout", r)
	}
	requireGone(t, pid, "after its task timed out")
	requireRemoved(t, p.Info().Cgroup)
}

func TestCgroupEscapeAfterCancel(t *testing.T) {
	d := cgroupDriver(t, Options{})
	p := start(t, d, "cg-cancel-1", &taskwire.Spec{Command: escape(pidFile, "exec sleep 600")})
	pid := escapee(t, d, "cg-cancel-1")
	p.Cancel()
	if r := wait(t, p); r.Phase != taskwire.PhaseCancelled {
		t.Fatalf("result %+v, want Cancelled", r)
	}
	requireGone(t, pid, "after its task was cancelled")
	requireRemoved(t, p.Info().Cgroup)
}

func TestCgroupOOMKilled(t *testing.T) {
	d := cgroupDriver(t, Options{})
	// The task runs as nobody, who cannot reach the test binary's build dir.
	self := filepath.Join(sharedDir(t), "hog")
	if err := copyFile(self); err != nil {
		t.Fatal(err)
	}
	r := run(t, d, "cg-oom-1", &taskwire.Spec{Command: []string{self}, Env: []string{hogEnv + "=1"}, MemoryBytes: 64 << 20})
	if r.Phase != taskwire.PhaseFailed || r.Reason != taskwire.ReasonOOMKilled || exitCode(r) != "137" {
		t.Fatalf("result %+v (exit code %s), want Failed, %s, exit code 137", r, exitCode(r), taskwire.ReasonOOMKilled)
	}
}

func TestCgroupCPUQuota(t *testing.T) {
	d := cgroupDriver(t, Options{})
	p := start(t, d, "cg-cpu-1", &taskwire.Spec{Command: []string{"sleep", "600"}, CPUMillis: 500, MemoryBytes: 256 << 20})
	t.Cleanup(func() { p.Cancel(); wait(t, p) })
	found := false
	for _, dir := range p.Info().Cgroup {
		if b, err := os.ReadFile(filepath.Join(dir, "cpu.max")); err == nil {
			found = true
			if got := strings.TrimSpace(string(b)); got != "50000 100000" {
				t.Errorf("cpu.max = %q, want 50000 100000 (500m)", got)
			}
		}
		if b, err := os.ReadFile(filepath.Join(dir, "cpu.cfs_quota_us")); err == nil {
			found = true
			if got := strings.TrimSpace(string(b)); got != "50000" {
				t.Errorf("cpu.cfs_quota_us = %q, want 50000 (500m of a 100ms period)", got)
			}
		}
	}
	if !found {
		t.Fatalf("no CPU quota file in the attempt's cgroup %q", p.Info().Cgroup)
	}
}

// TestCgroupReattach: after a restart the driver finds the attempt's
// cgroup from the persisted Info, and a cancel then kills what escaped.
func TestCgroupReattach(t *testing.T) {
	state, work := t.TempDir(), filepath.Join(sharedDir(t), "work")
	d1 := cgroupDriver(t, Options{StateDir: state, WorkDir: work})
	spec := &taskwire.Spec{Command: escape(pidFile, "exec sleep 600")}
	p1 := start(t, d1, "cg-reattach-1", spec)
	pid := escapee(t, d1, "cg-reattach-1")
	info := p1.Info()
	if !p1.Detach() {
		t.Fatal("the attempt ended before the restart")
	}
	d1.Close()

	d2 := newDriver(t, Options{StateDir: state, WorkDir: work}) // even without cgroups, the persisted dirs are found
	p2 := d2.Adopt("cg-reattach-1", spec, info)
	p2.Cancel()
	if r := wait(t, p2); r.Phase != taskwire.PhaseCancelled {
		t.Fatalf("result %+v, want Cancelled", r)
	}
	requireGone(t, pid, "after its task was cancelled by the restarted agent")
	requireRemoved(t, info.Cgroup)
}

// copyFile copies the test binary to an executable file dst.
func copyFile(dst string) error {
	src, err := os.Executable()
	if err != nil {
		return err
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o755)
}
