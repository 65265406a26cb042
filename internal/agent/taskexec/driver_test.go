package taskexec

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/task/taskwire"
	"github.com/drover-fleet/drover/internal/testkit"
)

// testTimeout bounds every wait in this package's tests.
const testTimeout = testkit.DefaultTimeout

func newDriver(t *testing.T, opts Options) *Driver {
	t.Helper()
	if opts.StateDir == "" {
		opts.StateDir = t.TempDir()
	}
	if opts.WorkDir == "" {
		opts.WorkDir = filepath.Join(sharedDir(t), "work")
	}
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d
}

// sharedDir is a fresh dir every user reaches: a task runs as nobody, and
// t.TempDir's parents are private to root. The work root must be in one.
func sharedDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "taskexec-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// start prepares and starts id.
func start(t *testing.T, d *Driver, id string, spec *taskwire.Spec) *Proc {
	t.Helper()
	prep, err := d.Prepare(context.Background(), id, spec)
	if err != nil {
		t.Fatalf("Prepare(%s): %v", id, err)
	}
	p, err := prep.Start()
	if err != nil {
		t.Fatalf("Start(%s): %v", id, err)
	}
	return p
}

// wait waits for p to end and returns its result.
func wait(t *testing.T, p *Proc) Result {
	t.Helper()
	select {
	case <-p.Done():
		return p.Result()
	case <-time.After(testTimeout):
		t.Fatalf("task %s (pid %d) did not end within %s", p.id, p.info.PID, testTimeout)
		return Result{}
	}
}

func run(t *testing.T, d *Driver, id string, spec *taskwire.Spec) Result {
	t.Helper()
	return wait(t, start(t, d, id, spec))
}

func exitCode(r Result) string {
	if r.Report.ExitCode == nil {
		return "none"
	}
	return strconv.Itoa(int(*r.Report.ExitCode))
}

func TestArgvIsLiteral(t *testing.T) {
	d := newDriver(t, Options{})
	args := []string{"$(id)", "a;b", "`x`", "*", "$HOME", "'q'"}
	r := run(t, d, "task-u-1", &taskwire.Spec{Command: append([]string{"echo"}, args...)})
	if r.Phase != taskwire.PhaseSucceeded || exitCode(r) != "0" {
		t.Fatalf("result %+v, want Succeeded with exit code 0", r)
	}
	want := strings.Join(args, " ") + "\n"
	b, err := os.ReadFile(filepath.Join(d.TaskDir("task-u-1"), StdoutFile))
	if err != nil || string(b) != want {
		t.Fatalf("stdout.log = %q (%v), want %q: no shell may interpret the arguments", b, err, want)
	}
	if r.Report.OutputTail != want {
		t.Errorf("output tail %q, want %q", r.Report.OutputTail, want)
	}
	if r.Report.PID == 0 || r.Report.StartTime == "" || r.Report.FinishTime == "" {
		t.Errorf("report %+v lacks pid or times", r.Report)
	}
}

func TestEnvAndWorkingDir(t *testing.T) {
	t.Setenv("DROVER_AGENT_SECRET", "must-not-leak")
	d := newDriver(t, Options{})
	spec := &taskwire.Spec{Namespace: "ns1", Name: "t1", Attempt: 3,
		Command: []string{"sh", "-c", "pwd; env"}, Env: []string{"FOO=bar baz", "DROVER_TASK_NAME=override"}}
	r := run(t, d, "task-env-3", spec)
	if r.Phase != taskwire.PhaseSucceeded {
		t.Fatalf("result %+v", r)
	}
	lines := strings.Split(strings.TrimSpace(r.Report.OutputTail), "\n")
	if want := d.WorkDir("task-env-3"); lines[0] != want {
		t.Errorf("working dir %q, want the fresh %q", lines[0], want)
	}
	env := lines[1:]
	for _, kv := range []string{"FOO=bar baz", "DROVER_TASK_NAME=override", "DROVER_TASK_NAMESPACE=ns1", "DROVER_TASK_ATTEMPT=3", "HOME=" + d.WorkDir("task-env-3")} {
		if !slices.Contains(env, kv) {
			t.Errorf("env lacks %q: %q", kv, env)
		}
	}
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "PATH", "HOME", "FOO", "PWD", "SHLVL", "_", "DROVER_TASK_NAME", "DROVER_TASK_NAMESPACE", "DROVER_TASK_ATTEMPT":
		default:
			t.Errorf("env has %q, which is neither minimal nor from the spec", kv)
		}
	}

	dir := sharedDir(t)
	spec = &taskwire.Spec{Command: []string{"pwd"}, WorkingDir: dir}
	if r := run(t, d, "task-dir-1", spec); r.Report.OutputTail != dir+"\n" {
		t.Errorf("working dir %q, want the spec's %q", r.Report.OutputTail, dir)
	}
}

func TestEnds(t *testing.T) {
	d := newDriver(t, Options{})
	tests := []struct {
		name                string
		cmd                 []string
		phase, reason, code string
		message             string
	}{
		{"success", []string{"true"}, taskwire.PhaseSucceeded, "", "0", ""},
		{"exit code", []string{"sh", "-c", "echo oops >&2; exit 3"}, taskwire.PhaseFailed, taskwire.ReasonExitCode, "3", "exited with code 3"},
		{"signal", []string{"sh", "-c", "kill -USR1 $$"}, taskwire.PhaseFailed, taskwire.ReasonSignal, "138", "SIGUSR1"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(t, d, "task-end-"+strconv.Itoa(i+1), &taskwire.Spec{Command: tt.cmd})
			if r.Phase != tt.phase || r.Reason != tt.reason || exitCode(r) != tt.code || !strings.Contains(r.Report.Message, tt.message) {
				t.Errorf("result %s/%s code %s %q, want %s/%s code %s %q", r.Phase, r.Reason, exitCode(r), r.Report.Message, tt.phase, tt.reason, tt.code, tt.message)
			}
		})
	}
	t.Run("stderr is in the tail", func(t *testing.T) {
		r := run(t, d, "task-tail-1", &taskwire.Spec{Command: []string{"sh", "-c", "echo out; echo err >&2"}})
		if r.Report.OutputTail != "out\nerr\n" {
			t.Errorf("tail %q, want stdout then stderr", r.Report.OutputTail)
		}
	})
	t.Run("unknown command", func(t *testing.T) {
		_, err := d.Prepare(context.Background(), "task-nope-1", &taskwire.Spec{Command: []string{"no-such-command-here"}})
		var e *Error
		if !errors.As(err, &e) || e.Reason != taskwire.ReasonStartError || !strings.Contains(err.Error(), "not found") {
			t.Errorf("Prepare = %v, want a StartError saying not found", err)
		}
	})
	t.Run("leftovers in the group are killed", func(t *testing.T) {
		r := run(t, d, "task-left-1", &taskwire.Spec{Command: []string{"sh", "-c", "sleep 60 & echo $!"}})
		pid, err := strconv.Atoi(strings.TrimSpace(r.Report.OutputTail))
		if err != nil {
			t.Fatalf("tail %q: %v", r.Report.OutputTail, err)
		}
		waitGone(t, pid)
	})
}

// waitGone waits until pid has exited (gone, or a zombie nobody reaps).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	testkit.Eventually(t, testTimeout, func() string {
		st, err := readStat(pid)
		if err != nil || st.state == 'Z' || st.state == 'X' {
			return ""
		}
		return fmt.Sprintf("process %d still running (%c)", pid, st.state)
	})
}

func TestTimeout(t *testing.T) {
	d := newDriver(t, Options{})
	tests := []struct {
		name string
		cmd  []string
		code string
	}{
		{"ends on SIGTERM", []string{"sleep", "60"}, "143"},
		{"ignores SIGTERM", []string{"sh", "-c", `trap "" TERM; sleep 60`}, "137"},
	}
	procs := make([]*Proc, len(tests))
	for i, tt := range tests {
		procs[i] = start(t, d, "task-timeout-"+strconv.Itoa(i+1), &taskwire.Spec{Command: tt.cmd, TimeoutSeconds: 2, KillTimeoutSeconds: 1})
	}
	for i, tt := range tests {
		r := wait(t, procs[i])
		if r.Phase != taskwire.PhaseFailed || r.Reason != taskwire.ReasonTimeout || exitCode(r) != tt.code {
			t.Errorf("%s: %s/%s code %s (%s), want Failed/timeout code %s", tt.name, r.Phase, r.Reason, exitCode(r), r.Report.Message, tt.code)
		}
	}
}

func TestCancel(t *testing.T) {
	d := newDriver(t, Options{})
	p := start(t, d, "task-cancel-1", &taskwire.Spec{Command: []string{"sleep", "60"}})
	p.Cancel()
	r := wait(t, p)
	if r.Phase != taskwire.PhaseCancelled || r.Reason != taskwire.ReasonCancelled || exitCode(r) != "143" {
		t.Errorf("result %s/%s code %s, want Cancelled/Cancelled code 143", r.Phase, r.Reason, exitCode(r))
	}
}

// TestOneGoroutineForAllProcesses: 100 running tasks cost the driver no
// goroutine each; it has its monitor, plus os/signal's delivery goroutine
// if nothing in the program started it before.
func TestOneGoroutineForAllProcesses(t *testing.T) {
	const n, constant = 100, 2
	before := runtime.NumGoroutine()
	d := newDriver(t, Options{})
	procs := make([]*Proc, n)
	for i := range procs {
		procs[i] = start(t, d, "task-many-"+strconv.Itoa(i+1), &taskwire.Spec{Command: []string{"sleep", "3"}})
	}
	during := runtime.NumGoroutine()
	running := 0
	for _, p := range procs {
		select {
		case <-p.Done():
		default:
			running++
		}
	}
	t.Logf("goroutines: %d before, %d with %d tasks started (%d still running)", before, during, n, running)
	if during-before > constant {
		t.Errorf("goroutines grew by %d with %d tasks, want at most %d", during-before, n, constant)
	}
	for _, p := range procs {
		if r := wait(t, p); r.Phase != taskwire.PhaseSucceeded {
			t.Errorf("task %s: %+v", p.id, r)
		}
	}
}

func TestRotation(t *testing.T) {
	const limit = 64 << 10
	d := newDriver(t, Options{MaxLogBytes: limit})
	log := filepath.Join(d.TaskDir("task-rot-1"), StdoutFile)
	// Write 100 KiB, see the log rotated, then write the end. The task
	// cannot see its logs (they are the agent's), so the test tells it to
	// go on with a file in its dir. The loop's bound (testTimeout) only
	// keeps a failing test from leaving it running.
	script := `head -c 102400 /dev/zero | tr '\0' a; i=0; ` +
		`while [ ! -e go ] && [ $i -lt 6000 ]; do sleep 0.01; i=$((i+1)); done; echo END`
	p := start(t, d, "task-rot-1", &taskwire.Spec{Command: []string{"sh", "-c", script}})
	testkit.Eventually(t, testTimeout, func() string {
		fi, err := os.Stat(log)
		if _, err1 := os.Stat(log + ".1"); err1 != nil || err != nil || fi.Size() != 102400-limit {
			return "stdout.log has not been rotated, or not all written"
		}
		return ""
	})
	if err := os.WriteFile(filepath.Join(d.WorkDir("task-rot-1"), "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := wait(t, p)
	if r.Phase != taskwire.PhaseSucceeded {
		t.Fatalf("result %+v", r)
	}
	old, err := os.ReadFile(log + ".1")
	if err != nil {
		t.Fatalf("no rotated file: %v", err)
	}
	cur, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	// The log shim filled the first file to the bound, then rotated it.
	if len(old) != limit || strings.Trim(string(old), "a") != "" {
		t.Errorf("stdout.log.1 has %d bytes, want %d, all of the first output", len(old), limit)
	}
	if n := len(old) + strings.Count(string(cur), "a"); n > 102400 {
		t.Errorf("the two files hold %d bytes of the first output, more than the 102400 written", n)
	}
	// The rest of the output, and no hole of zeros.
	if !strings.HasSuffix(string(cur), "END\n") || len(cur) >= limit || strings.ContainsRune(string(cur), 0) {
		t.Errorf("stdout.log has %d bytes ending %q, want the end of the output, under %d bytes, no zeros", len(cur), cur[max(0, len(cur)-8):], limit)
	}
	if !strings.HasSuffix(r.Report.OutputTail, "END\n") || len(r.Report.OutputTail) != taskwire.MaxTailBytes {
		t.Errorf("tail of %d bytes ending %q, want %d ending END", len(r.Report.OutputTail), r.Report.OutputTail[max(0, len(r.Report.OutputTail)-8):], taskwire.MaxTailBytes)
	}
}

func TestRotateKeepsTheWholeOldFile(t *testing.T) {
	name := filepath.Join(t.TempDir(), "stdout.log")
	f, err := openLog(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.WriteString("0123456789")
	if err := rotate(name, 4); err != nil {
		t.Fatal(err)
	}
	f.WriteString("ab")
	old, _ := os.ReadFile(name + ".1")
	cur, _ := os.ReadFile(name)
	if string(old) != "0123456789" || string(cur) != "ab" {
		t.Errorf("after rotation: .1 %q, current %q; want %q and %q", old, cur, "0123456789", "ab")
	}
	if got := readTail(name, 5); string(got) != "789ab" {
		t.Errorf("readTail across the rotation = %q, want %q", got, "789ab")
	}
	if err := rotate(name, 4); err != nil { // under the limit: nothing happens
		t.Fatal(err)
	}
	if cur, _ := os.ReadFile(name); string(cur) != "ab" {
		t.Errorf("a file under the limit was rotated: %q", cur)
	}
}

func TestArtifacts(t *testing.T) {
	tool := []byte("#!/bin/sh\necho tool ran with \"$1\"\n")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/tool" {
			http.NotFound(w, r)
			return
		}
		w.Write(tool)
	}))
	defer srv.Close()
	sum := sha256.Sum256(tool)
	good := hex.EncodeToString(sum[:])
	bad := strings.Repeat("0", 64)
	d := newDriver(t, Options{})

	t.Run("fetched, checked and executable", func(t *testing.T) {
		spec := &taskwire.Spec{Command: []string{"./bin/tool", "x y"}, Artifacts: []taskwire.Artifact{{URL: srv.URL + "/tool", SHA256: good, Path: "bin/tool", Executable: true}}}
		r := run(t, d, "task-art-1", spec)
		if r.Phase != taskwire.PhaseSucceeded || r.Report.OutputTail != "tool ran with x y\n" {
			t.Fatalf("result %+v", r)
		}
		fi, err := os.Stat(filepath.Join(d.WorkDir("task-art-1"), "bin", "tool"))
		if err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("artifact %v, %v; want mode 0755", fi, err)
		}
	})
	failing := []struct {
		name, id string
		art      taskwire.Artifact
		reason   string
		say      string
	}{
		{"wrong digest", "task-art-2", taskwire.Artifact{URL: srv.URL + "/tool", SHA256: bad, Path: "tool"}, taskwire.ReasonArtifact, "sha256"},
		{"not found", "task-art-3", taskwire.Artifact{URL: srv.URL + "/nope", SHA256: good, Path: "tool"}, taskwire.ReasonArtifact, "404"},
		{"climbing path", "task-art-4", taskwire.Artifact{URL: srv.URL + "/tool", SHA256: good, Path: "../tool"}, taskwire.ReasonStartError, "path"},
	}
	for _, tt := range failing {
		t.Run(tt.name, func(t *testing.T) {
			_, err := d.Prepare(context.Background(), tt.id, &taskwire.Spec{Command: []string{"true"}, Artifacts: []taskwire.Artifact{tt.art}})
			var e *Error
			if !errors.As(err, &e) || e.Reason != tt.reason || !strings.Contains(err.Error(), tt.say) {
				t.Fatalf("Prepare = %v, want a %s error saying %q", err, tt.reason, tt.say)
			}
			if _, err := os.Stat(filepath.Join(d.WorkDir(tt.id), "tool")); err == nil {
				t.Error("the refused artifact was written")
			}
		})
	}
	t.Run("symlink out of the working dir", func(t *testing.T) {
		work, outside := t.TempDir(), t.TempDir()
		if err := os.Symlink(outside, filepath.Join(work, "out")); err != nil {
			t.Fatal(err)
		}
		spec := &taskwire.Spec{Command: []string{"true"}, WorkingDir: work, Artifacts: []taskwire.Artifact{{URL: srv.URL + "/tool", SHA256: good, Path: "out/tool"}}}
		_, err := d.Prepare(context.Background(), "task-art-5", spec)
		var e *Error
		if !errors.As(err, &e) || e.Reason != taskwire.ReasonArtifact {
			t.Fatalf("Prepare = %v, want an ArtifactError", err)
		}
		if entries, _ := os.ReadDir(outside); len(entries) != 0 {
			t.Errorf("wrote %v outside the working dir", entries)
		}
	})
}

// orphan starts argv as a process that is not this one's child (its parent
// shell exits at once) and leads its own group, as a task left by an agent
// that died does; it returns its Info.
func orphan(t *testing.T, argv ...string) Info {
	t.Helper()
	out, err := exec.Command("sh", append([]string{"-c", `setsid "$@" >/dev/null 2>&1 & echo $!`, "sh"}, argv...)...).Output()
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = killGroup(pid) })
	// The shell has forked; setsid may not have run yet.
	var st stat
	testkit.Eventually(t, testTimeout, func() string {
		st, err = readStat(pid)
		if err != nil || st.pgid != pid {
			return fmt.Sprintf("orphan %d: group %d (%v), want its own", pid, st.pgid, err)
		}
		return ""
	})
	return Info{PID: pid, StartTicks: st.startTicks, StartTime: time.Now(), LogDir: t.TempDir()}
}

func waitFile(t *testing.T, name string) {
	t.Helper()
	testkit.Eventually(t, testTimeout, func() string {
		if _, err := os.Stat(name); err != nil {
			return fmt.Sprintf("%s has not appeared: %v", name, err)
		}
		return ""
	})
}

func killGroup(pid int) error {
	return exec.Command("kill", "-KILL", "--", "-"+strconv.Itoa(pid)).Run()
}

func TestAdopt(t *testing.T) {
	d := newDriver(t, Options{PollInterval: 20 * time.Millisecond})
	spec := &taskwire.Spec{Command: []string{"sleep"}, KillTimeoutSeconds: 1}

	t.Run("a process that is not a child ends: its exit code is unknown", func(t *testing.T) {
		info := orphan(t, "sleep", "1")
		p := d.Adopt("task-adopt-1", spec, info)
		if p.child {
			t.Fatal("the orphan was taken for a child")
		}
		r := wait(t, p)
		if r.Phase != taskwire.PhaseFailed || r.Reason != taskwire.ReasonLost || r.Report.ExitCode != nil || !strings.Contains(r.Report.Message, "exit code is unknown") {
			t.Errorf("result %+v, want Failed/%s without an exit code, saying it is unknown", r, taskwire.ReasonLost)
		}
	})
	t.Run("a timeout still applies", func(t *testing.T) {
		info := orphan(t, "sleep", "60")
		info.Deadline = time.Now()
		r := wait(t, d.Adopt("task-adopt-2", spec, info))
		if r.Phase != taskwire.PhaseFailed || r.Reason != taskwire.ReasonTimeout || exitCode(r) != "143" {
			t.Errorf("result %s/%s code %s, want Failed/timeout 143", r.Phase, r.Reason, exitCode(r))
		}
		waitGone(t, info.PID)
	})
	t.Run("a cancel still applies", func(t *testing.T) {
		ready := filepath.Join(t.TempDir(), "ready")
		info := orphan(t, "sh", "-c", `trap "" TERM; touch "$0"; sleep 60`, ready)
		waitFile(t, ready) // a TERM before the trap would end it
		p := d.Adopt("task-adopt-3", spec, info)
		p.Cancel()
		r := wait(t, p)
		if r.Phase != taskwire.PhaseCancelled || exitCode(r) != "137" {
			t.Errorf("result %s/%s code %s, want Cancelled 137", r.Phase, r.Reason, exitCode(r))
		}
		waitGone(t, info.PID)
	})
	t.Run("a reused pid is not the task", func(t *testing.T) {
		info := orphan(t, "sleep", "60")
		info.StartTicks--
		p := d.Adopt("task-adopt-4", spec, info)
		r := wait(t, p)
		if r.Phase != taskwire.PhaseFailed || r.Reason != taskwire.ReasonLost || !strings.Contains(r.Report.Message, "result is unknown") {
			t.Errorf("result %+v, want Failed/%s", r, taskwire.ReasonLost)
		}
		if st, err := readStat(info.PID); err != nil || st.state == 'Z' {
			t.Errorf("the other process with the pid was killed: %v %v", st, err)
		}
	})
	t.Run("a child detached and adopted again keeps its exit code", func(t *testing.T) {
		p := start(t, d, "task-adopt-5", &taskwire.Spec{Command: []string{"sh", "-c", "sleep 0.5; echo bye; exit 7"}})
		if !p.Detach() {
			t.Fatal("Detach: the task already ended")
		}
		d2 := newDriver(t, Options{StateDir: d.opts.StateDir, WorkDir: d.opts.WorkDir})
		r := wait(t, d2.Adopt("task-adopt-5", &taskwire.Spec{Command: []string{"sh"}}, p.Info()))
		if r.Phase != taskwire.PhaseFailed || r.Reason != taskwire.ReasonExitCode || exitCode(r) != "7" || r.Report.OutputTail != "bye\n" {
			t.Errorf("result %+v, want Failed/ExitCode 7 with its output", r)
		}
	})
}
