package taskexec

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/drover-fleet/drover/internal/task/taskwire"
	"github.com/drover-fleet/drover/internal/testkit"
)

// attackEnv makes the test binary try to kill and to ptrace the pid it
// holds, and print what each attempt returned (see TestMain).
const attackEnv = "TASKEXEC_TEST_ATTACK_PID"

func attack() {
	pid, _ := strconv.Atoi(os.Getenv(attackEnv))
	fmt.Printf("kill: %v\n", syscall.Kill(pid, syscall.SIGKILL))
	err := unix.PtraceAttach(pid)
	fmt.Printf("ptrace: %v\n", err)
	if err == nil {
		unix.PtraceDetach(pid)
	}
	os.Exit(0)
}

// checkSizes looks at the sizes of log and log.1 and fails t if one is over max.
func checkSizes(t *testing.T, log string, max int64) {
	t.Helper()
	for _, name := range []string{log, log + ".1"} {
		if fi, err := os.Stat(name); err == nil && fi.Size() > max {
			t.Errorf("%s has %d bytes, over the bound of %d", filepath.Base(name), fi.Size(), max)
		}
	}
}

// shimGone fails unless the log shim in info has ended and been reaped.
func shimGone(t *testing.T, info Info) {
	t.Helper()
	if info.LogShimPID <= 0 {
		t.Fatal("the attempt's Info names no log shim")
	}
	if st, err := readStat(info.LogShimPID); err == nil && st.startTicks == info.LogShimStartTicks {
		t.Errorf("the log shim %d is still there (state %c) after its task ended", info.LogShimPID, st.state)
	}
}

func TestLogBoundAtWriteTime(t *testing.T) {
	const limit = 1 << 20
	d := newDriver(t, Options{MaxLogBytes: limit})
	id := "task-bound-1"
	log := filepath.Join(d.TaskDir(id), StdoutFile)
	// 50 MiB as fast as head writes it, then a line after the last
	// rotation, and an exit code of its own.
	p := start(t, d, id, &taskwire.Spec{Command: []string{"sh", "-c",
		`head -c 52428800 /dev/zero; echo END; echo on stderr >&2; exit 3`}})
	samples := 0
	for running := true; running; samples++ {
		select {
		case <-p.Done():
			running = false
		default:
		}
		checkSizes(t, log, limit)
		if t.Failed() {
			break
		}
	}
	r := wait(t, p)
	t.Logf("%d samples of the log sizes while the task ran", samples)
	checkSizes(t, log, limit)
	if r.Phase != taskwire.PhaseFailed || r.Reason != taskwire.ReasonExitCode || exitCode(r) != "3" {
		t.Errorf("result %s/%s code %s, want Failed/%s 3", r.Phase, r.Reason, exitCode(r), taskwire.ReasonExitCode)
	}
	old, err := os.ReadFile(log + ".1")
	if err != nil {
		t.Fatalf("no rotated file: %v", err)
	}
	cur, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	// Filled to the bound, then rotated: the last MiB of zeros is .1, and
	// what came after is the new file.
	if len(old) != limit || bytes.Count(old, []byte{0}) != limit {
		t.Errorf("stdout.log.1 has %d bytes, want the %d last zeros", len(old), limit)
	}
	if string(cur) != "END\n" {
		t.Errorf("stdout.log = %q, want the output written after the last rotation", cur[:min(len(cur), 32)])
	}
	if !strings.HasSuffix(r.Report.OutputTail, "END\non stderr\n") {
		t.Errorf("the report's tail ends %q, want END and the stderr line", r.Report.OutputTail[max(0, len(r.Report.OutputTail)-32):])
	}
	shimGone(t, p.Info())
}

// TestLogsFlowWhileNoAgent: the log shim does not depend on the agent.
// With no driver running, the task goes on writing and its logs go on
// rotating, within the bound; the next driver adopts it with its exit code.
func TestLogsFlowWhileNoAgent(t *testing.T) {
	const limit = 64 << 10
	d := newDriver(t, Options{MaxLogBytes: limit})
	id := "task-flow-1"
	log := filepath.Join(d.TaskDir(id), StdoutFile)
	// Lines of 4 KiB until told to stop (the bound on the loop only keeps
	// a failing test from leaving it running).
	p := start(t, d, id, &taskwire.Spec{Command: []string{"sh", "-c",
		`i=0; while [ ! -e stop ] && [ $i -lt 1000000 ]; do head -c 4095 /dev/zero | tr '\0' a; echo; i=$((i+1)); done; echo END; exit 5`}})
	testkit.Eventually(t, testTimeout, func() string {
		if _, err := os.Stat(log + ".1"); err != nil {
			return "stdout.log has not been rotated yet"
		}
		return ""
	})
	if !p.Detach() {
		t.Fatal("Detach: the task already ended")
	}
	d.Close()
	before, err := os.Stat(log + ".1")
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, testTimeout, func() string {
		checkSizes(t, log, limit)
		if fi, err := os.Stat(log + ".1"); err != nil || os.SameFile(fi, before) {
			return "no rotation since the driver closed"
		}
		return ""
	})
	d2 := newDriver(t, Options{StateDir: d.opts.StateDir, WorkDir: d.opts.WorkDir, MaxLogBytes: limit})
	p2 := d2.Adopt(id, &taskwire.Spec{Command: []string{"sh"}}, p.Info())
	if err := os.WriteFile(filepath.Join(d.WorkDir(id), "stop"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := wait(t, p2)
	checkSizes(t, log, limit)
	if r.Phase != taskwire.PhaseFailed || exitCode(r) != "5" || !strings.HasSuffix(r.Report.OutputTail, "END\n") {
		t.Errorf("result %s/%s code %s tail ending %q, want Failed 5 ending END", r.Phase, r.Reason, exitCode(r),
			r.Report.OutputTail[max(0, len(r.Report.OutputTail)-8):])
	}
	shimGone(t, p.Info())
}

// TestTaskCannotTouchItsLogShim: the shim runs as the agent's user, so a
// task (nobody) can neither kill nor trace it.
func TestTaskCannotTouchItsLogShim(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the task must run as another user than the shim")
	}
	d := newDriver(t, Options{})
	victim := start(t, d, "task-victim-1", &taskwire.Spec{Command: []string{"sh", "-c",
		`i=0; while [ ! -e stop ] && [ $i -lt 6000 ]; do sleep 0.01; i=$((i+1)); done; echo still logging`}})
	shim := victim.Info().LogShimPID
	// The test binary, where the task user may run it.
	bin := filepath.Join(sharedDir(t), "attack")
	if err := copyFile(bin); err != nil {
		t.Fatal(err)
	}
	r := run(t, d, "task-attack-1", &taskwire.Spec{Command: []string{bin}, Env: []string{attackEnv + "=" + strconv.Itoa(shim)}})
	if r.Phase != taskwire.PhaseSucceeded ||
		!strings.Contains(r.Report.OutputTail, "kill: operation not permitted") ||
		!strings.Contains(r.Report.OutputTail, "ptrace: operation not permitted") {
		t.Errorf("result %s, output %q: want kill and ptrace refused (EPERM)", r.Phase, r.Report.OutputTail)
	}
	if err := os.WriteFile(filepath.Join(d.WorkDir("task-victim-1"), "stop"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if r := wait(t, victim); r.Phase != taskwire.PhaseSucceeded || r.Report.OutputTail != "still logging\n" {
		t.Errorf("the victim ended %s with output %q, want Succeeded and its line logged", r.Phase, r.Report.OutputTail)
	}
}

func TestLogWriter(t *testing.T) {
	name := filepath.Join(t.TempDir(), StdoutFile)
	w := &logWriter{name: name, max: 4}
	defer w.close()
	for _, s := range []string{"ab", "cdef", "0123456789", "x"} {
		if err := w.write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	old, _ := os.ReadFile(name + ".1")
	cur, _ := os.ReadFile(name)
	// abcd | ef01 | 2345 | 6789 | x: full files, nothing lost between them.
	if string(old) != "6789" || string(cur) != "x" {
		t.Errorf("after the writes: .1 %q, current %q; want %q and %q", old, cur, "6789", "x")
	}
	if got := readTail(name, 3); string(got) != "89x" {
		t.Errorf("readTail across the rotation = %q, want %q", got, "89x")
	}
}
