package containertest

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/agent/taskexec"
	"github.com/drover-fleet/drover/internal/ctrd"
	"github.com/drover-fleet/drover/internal/ctrdtest"
	"github.com/drover-fleet/drover/internal/task/taskwire"
	"github.com/drover-fleet/drover/internal/testkit"
)

// daemon is this test binary's containerd, started by TestMain.
var daemon *ctrdtest.Daemon

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == taskexec.LogShimArg {
		os.Exit(taskexec.RunLogShim(os.Args[2:]))
	}
	if len(os.Args) > 1 && ctrd.IsCommand(os.Args[1]) {
		os.Exit(ctrd.Main(os.Args[1:]))
	}
	os.Exit(ctrdtest.RunTests(m, &daemon))
}

const testTimeout = testkit.DefaultTimeout

func containerd() *taskexec.Containerd {
	return &taskexec.Containerd{Companion: os.Args[0], Address: daemon.Address, Namespace: ctrdtest.Namespace}
}

func newDriver(t *testing.T, c *taskexec.Containerd) *taskexec.Driver {
	t.Helper()
	work, err := os.MkdirTemp("", "ctrtest-work-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(work) })
	os.Chmod(work, 0o755)
	d, err := taskexec.New(taskexec.Options{StateDir: t.TempDir(), WorkDir: filepath.Join(work, "w"), Containerd: c, Retention: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d
}

func spec(args ...string) *taskwire.Spec {
	return &taskwire.Spec{Namespace: "ns", Name: "t", Attempt: 1, Driver: taskwire.DriverContainerd, Image: ctrdtest.ImageRef,
		Command: append([]string{"/testprog"}, args...)}
}

// id is a work id (and container id) for t.
// (containerd ids are at most 76 bytes of letters, digits and single
// separators: a hash of the name).
func id(t *testing.T) string {
	return fmt.Sprintf("task-%x-1", sha256.Sum256([]byte(t.Name())))[:5+16] + "-1"
}

func start(t *testing.T, d *taskexec.Driver, id string, s *taskwire.Spec) *taskexec.Proc {
	t.Helper()
	prep, err := d.Prepare(context.Background(), id, s)
	if err != nil {
		t.Fatalf("Prepare(%s): %v", id, err)
	}
	p, err := prep.Start()
	if err != nil {
		t.Fatalf("Start(%s): %v", id, err)
	}
	return p
}

func wait(t *testing.T, p *taskexec.Proc) taskexec.Result {
	t.Helper()
	select {
	case <-p.Done():
		return p.Result()
	case <-time.After(testTimeout):
		t.Fatalf("task (companion pid %d) did not end within %s; containerd: %s", p.Info().PID, testTimeout, daemon.Log())
	}
	return taskexec.Result{}
}

func code(r taskexec.Result) string {
	if r.Report.ExitCode == nil {
		return "none"
	}
	return fmt.Sprint(*r.Report.ExitCode)
}

func readLog(t *testing.T, d *taskexec.Driver, id, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(d.TaskDir(id), name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestContainerEnds(t *testing.T) {
	uid := int64(1234)
	for _, tc := range []struct {
		name         string
		spec         *taskwire.Spec
		phase        string
		reason, code string
		stdout       string
		message      string
	}{
		{name: "succeeds as its user with its env, logs through the shim",
			spec: func() *taskwire.Spec {
				s := spec("echo", "hello", "err", "oops", "id", "env", "FOO", "env", "DROVER_TASK_NAME")
				s.RunAsUser, s.Env = &uid, []string{"FOO=bar"}
				return s
			}(),
			phase: taskwire.PhaseSucceeded, code: "0", stdout: "hello\nuid=1234 gid=1234 groups=[1234]\nFOO=bar\nDROVER_TASK_NAME=t\n"},
		{name: "fails with its exit code", spec: spec("exit", "3"), phase: taskwire.PhaseFailed, reason: taskwire.ReasonExitCode, code: "3"},
		{name: "over its memory limit ends OOMKilled 137",
			spec:  func() *taskwire.Spec { s := spec("alloc", "256", "sleep", "30s"); s.MemoryBytes = 32 << 20; return s }(),
			phase: taskwire.PhaseFailed, reason: taskwire.ReasonOOMKilled, code: "137"},
		{name: "a missing image says which and how to get it",
			spec:  func() *taskwire.Spec { s := spec(); s.Image = "drover.test/missing:1"; return s }(),
			phase: taskwire.PhaseFailed, reason: taskwire.ReasonImageNotFound, code: "none", message: "drover.test/missing:1 is not in containerd's namespace"},
		{name: "timeout, ended after SIGTERM: 143",
			spec:  func() *taskwire.Spec { s := spec("trap-term", "sleep", "60s"); s.TimeoutSeconds = 1; return s }(),
			phase: taskwire.PhaseFailed, reason: taskwire.ReasonTimeout, code: "143", stdout: "got SIGTERM\n"},
		{name: "timeout, SIGTERM ignored: SIGKILL after the kill timeout, 137",
			spec: func() *taskwire.Spec {
				s := spec("ignore-term", "sleep", "60s")
				s.TimeoutSeconds, s.KillTimeoutSeconds = 1, 1
				return s
			}(),
			phase: taskwire.PhaseFailed, reason: taskwire.ReasonTimeout, code: "137"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDriver(t, containerd())
			wid := id(t)
			p := start(t, d, wid, tc.spec)
			if p.Info().Container != wid {
				t.Errorf("Info().Container = %q, want %q", p.Info().Container, wid)
			}
			r := wait(t, p)
			if r.Phase != tc.phase || r.Reason != tc.reason || code(r) != tc.code {
				t.Fatalf("Result = %s %s exit %s (%s), want %s %s exit %s; stderr: %s", r.Phase, r.Reason, code(r), r.Report.Message,
					tc.phase, tc.reason, tc.code, readLog(t, d, wid, taskexec.StderrFile))
			}
			if tc.stdout != "" {
				if got := readLog(t, d, wid, taskexec.StdoutFile); got != tc.stdout {
					t.Errorf("stdout.log = %q, want %q", got, tc.stdout)
				}
			}
			if !strings.Contains(r.Report.Message, tc.message) {
				t.Errorf("message = %q, want it to contain %q", r.Report.Message, tc.message)
			}
			if tc.phase == taskwire.PhaseSucceeded && !strings.Contains(readLog(t, d, wid, taskexec.StderrFile), "oops") {
				t.Errorf("stderr.log = %q, want oops", readLog(t, d, wid, taskexec.StderrFile))
			}
			requireNoContainer(t, wid)
		})
	}
}

// requireNoContainer waits until containerd holds no container id.
func requireNoContainer(t *testing.T, id string) {
	t.Helper()
	c, err := daemon.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	deadline := time.Now().Add(testTimeout)
	for {
		if _, err := c.LoadContainer(context.Background(), id); err != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %s is still in containerd %s after its attempt ended", id, testTimeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestContainerCancel(t *testing.T) {
	d := newDriver(t, containerd())
	wid := id(t)
	p := start(t, d, wid, spec("echo", "up", "sleep", "60s"))
	waitFor(t, func() bool { return strings.Contains(readLog(t, d, wid, taskexec.StdoutFile), "up") })
	p.Cancel()
	r := wait(t, p)
	if r.Phase != taskwire.PhaseCancelled || r.Reason != taskwire.ReasonCancelled || code(r) != "143" {
		t.Fatalf("Result = %s %s exit %s (%s), want Cancelled 143", r.Phase, r.Reason, code(r), r.Report.Message)
	}
	requireNoContainer(t, wid)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s", testTimeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestContainerReattach: the agent stops (Detach), its companion is
// killed, the container keeps running; a new driver (the restarted agent)
// adopts the attempt, re-attaches with a new companion and learns its
// exit and its output.
func TestContainerReattach(t *testing.T) {
	d := newDriver(t, containerd())
	wid := id(t)
	s := spec("echo", "before", "sleep", "3s", "echo", "after", "exit", "7")
	p := start(t, d, wid, s)
	waitFor(t, func() bool { return strings.Contains(readLog(t, d, wid, taskexec.StdoutFile), "before") })
	if !p.Detach() {
		t.Fatal("Detach: the attempt already ended")
	}
	info := p.Info()
	if err := syscall.Kill(info.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var ws syscall.WaitStatus
	if _, err := syscall.Wait4(info.PID, &ws, 0, nil); err != nil { // the test is its parent
		t.Fatal(err)
	}
	d.Close()
	// Its container runs on without it.
	c, err := daemon.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctr, err := c.LoadContainer(context.Background(), wid)
	if err != nil {
		t.Fatalf("the container is gone with its companion: %v", err)
	}
	task, err := ctr.Task(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := task.Status(context.Background()); err != nil || st.Status != "running" {
		t.Fatalf("container status = %v (%v), want running", st.Status, err)
	}

	d2, err := taskexec.New(taskexec.Options{StateDir: filepath.Dir(filepath.Dir(info.LogDir)), WorkDir: filepath.Join(t.TempDir(), "w"),
		Containerd: containerd(), Retention: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	p2 := d2.Adopt(wid, s, info)
	if p2.Info().PID == info.PID {
		t.Fatal("Adopt did not start a new companion")
	}
	r := wait(t, p2)
	if r.Phase != taskwire.PhaseFailed || r.Reason != taskwire.ReasonExitCode || code(r) != "7" {
		t.Fatalf("Result = %s %s exit %s (%s), want Failed ExitCode 7", r.Phase, r.Reason, code(r), r.Report.Message)
	}
	if got := readLog(t, d2, wid, taskexec.StdoutFile); got != "before\nafter\n" {
		t.Errorf("stdout.log = %q, want before and after", got)
	}
	requireNoContainer(t, wid)
}

// TestContainerCompanionKilledWhileWatched: a companion killed under a
// running agent leaves no container behind.
func TestContainerCompanionKilledWhileWatched(t *testing.T) {
	d := newDriver(t, containerd())
	wid := id(t)
	p := start(t, d, wid, spec("echo", "up", "sleep", "60s"))
	waitFor(t, func() bool { return strings.Contains(readLog(t, d, wid, taskexec.StdoutFile), "up") })
	if err := syscall.Kill(p.Info().PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	r := wait(t, p)
	if r.Phase != taskwire.PhaseFailed || r.Reason != taskwire.ReasonLost {
		t.Fatalf("Result = %s %s (%s), want Failed %s", r.Phase, r.Reason, r.Report.Message, taskwire.ReasonLost)
	}
	requireNoContainer(t, wid)
}

func TestContainerDriverUnavailable(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    *taskexec.Containerd
		want string
	}{
		{name: "agent without containerd", want: "--containerd-address"},
		{name: "no socket", c: &taskexec.Containerd{Companion: os.Args[0], Address: filepath.Join(t.TempDir(), "none.sock")}, want: "socket"},
		{name: "no companion", c: &taskexec.Containerd{Companion: "/nonexistent/drover-containerd", Address: daemon.Address}, want: "companion"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDriver(t, tc.c)
			_, err := d.Prepare(context.Background(), id(t), spec())
			var e *taskexec.Error
			if !errorsAs(err, &e) || e.Reason != taskwire.ReasonDriverUnavailable || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Prepare = %v, want a %s error naming %q", err, taskwire.ReasonDriverUnavailable, tc.want)
			}
		})
	}
}
