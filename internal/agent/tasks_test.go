package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/agent/taskexec"
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/clock/clocktest"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/store"
	taskwire "github.com/drover-fleet/drover/internal/task/taskwire"
	"github.com/drover-fleet/drover/internal/testkit"
)

// taskWait bounds the waits of the task tests (processes run for seconds).
const taskWait = testkit.DefaultTimeout

// taskAgent is an agent on dir's DB with the task runners, its work loop
// running (not connected to any hub: reports stay in the outbox).
type taskAgent struct {
	*Agent
	driver *taskexec.Driver
	stop   func()
}

func startTaskAgent(t *testing.T, dir string) *taskAgent {
	t.Helper()
	return startTaskAgentWith(t, dir, nil)
}

// startTaskAgentWith is startTaskAgent on clk (of task timeouts, ended
// attempts and their retention); nil is the wall clock.
func startTaskAgentWith(t *testing.T, dir string, clk clock.Clock) *taskAgent {
	t.Helper()
	return startTaskAgentOpts(t, dir, clk, nil)
}

// startTaskAgentOpts is startTaskAgentWith with mutate changing the
// agent's options first.
func startTaskAgentOpts(t *testing.T, dir string, clk clock.Clock, mutate func(*Options)) *taskAgent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	opts := Options{Node: "n1", Hubs: []string{"h:1"}, StateDir: dir, Capacity: map[string]string{"cpu": "1"}, Clock: clk}
	if mutate != nil {
		mutate(&opts)
	}
	if err := opts.defaults(); err != nil {
		t.Fatal(err)
	}
	if err := privateStateDir(dir, opts.Logger); err != nil { // as Run does
		t.Fatal(err)
	}
	db, err := store.Open(ctx, filepath.Join(dir, "agent.db"), store.Options{Clock: opts.Clock})
	if err != nil {
		t.Fatal(err)
	}
	a := &Agent{opts: opts, log: opts.Logger, db: db, heartbeat: time.Second, kick: make(chan struct{}, 1), work: make(chan string, 1024)}
	tasks, err := a.taskRunners(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	for typ, r := range tasks.runners {
		a.opts.Runners[typ] = r
	}
	var apps *appSet
	if opts.Apps != nil {
		if apps, err = a.appRunners(ctx, db, tasks.driver); err != nil {
			t.Fatal(err)
		}
		for typ, r := range apps.runners {
			a.opts.Runners[typ] = r
		}
	}
	if err := a.recoverWork(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.runWork(ctx) }()
	var once sync.Once
	ta := &taskAgent{Agent: a, driver: tasks.runners[taskwire.TypeExec].(*taskRunner).d}
	ta.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("runWork: %v", err)
				}
			case <-time.After(taskWait):
				t.Errorf("runWork did not return within %s", taskWait)
			}
			if apps != nil {
				apps.node.Close() // as Run does: before the driver
			}
			tasks.close()
			db.Close()
		})
	}
	t.Cleanup(ta.stop)
	return ta
}

// openDir is a fresh dir every user may use, 1777 as /tmp is: tasks run
// as nobody and share files with the test through it (t.TempDir's parents
// are private to root). Removed at the test's end.
func openDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "drover-agent-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o1777); err != nil {
		t.Fatal(err)
	}
	return dir
}

// stateDir is an agent state dir whose default work dir (beside it) a
// task running as nobody can reach.
func stateDir(t *testing.T) string {
	t.Helper()
	return filepath.Join(openDir(t), "state")
}

// putTask stores a task work item as a dispatch would and schedules it.
func putTask(t *testing.T, db *store.Store, uid string, spec taskwire.Spec) {
	t.Helper()
	b, err := spec.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.PutWork(context.Background(), store.Work{UID: uid, Type: taskwire.TypeExec, Spec: b, Phase: PhasePending}); err != nil {
		t.Fatal(err)
	}
}

// taskStatus is a work status from the outbox with its decoded report.
type taskStatus struct {
	phase, reason string
	report        taskwire.Report
}

// taskStatuses returns the outbox's statuses by uid, oldest first.
func taskStatuses(t *testing.T, a *Agent) map[string][]taskStatus {
	t.Helper()
	out := map[string][]taskStatus{}
	for _, e := range outbox(t, a) {
		w := e.GetStatus().GetWork()
		if w == nil {
			continue
		}
		rep, err := taskwire.DecodeReport(w.GetMessage())
		if err != nil {
			t.Fatalf("status of %s: message %q is not a report: %v", w.GetUid(), w.GetMessage(), err)
		}
		out[w.GetUid()] = append(out[w.GetUid()], taskStatus{w.GetPhase(), w.GetReason(), rep})
	}
	return out
}

// waitStatuses waits until every uid has a status in a phase other than
// Running, and returns all statuses.
func waitStatuses(t *testing.T, a *Agent, uids ...string) map[string][]taskStatus {
	t.Helper()
	var all map[string][]taskStatus
	testkit.Eventually(t, taskWait, func() string {
		all = taskStatuses(t, a)
		for _, uid := range uids {
			if ss := all[uid]; len(ss) == 0 || ss[len(ss)-1].phase == PhaseRunning {
				return fmt.Sprintf("%s has not ended: statuses %+v", uid, all)
			}
		}
		return ""
	})
	return all
}

// waitRunning waits for uid's Running report and returns it.
func waitRunning(t *testing.T, a *Agent, uid string) taskwire.Report {
	t.Helper()
	var rep taskwire.Report
	testkit.Eventually(t, taskWait, func() string {
		for _, s := range taskStatuses(t, a)[uid] {
			if s.phase == PhaseRunning {
				rep = s.report
				return ""
			}
		}
		return "no Running report of " + uid
	})
	return rep
}

func code(r taskwire.Report) string {
	if r.ExitCode == nil {
		return "none"
	}
	return strconv.Itoa(int(*r.ExitCode))
}

// alive reports whether pid runs (not gone, not a zombie).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// TestTasksRunConcurrentlyThroughTheAgent: dispatched task items run at
// once (two of them finish only if both run together), each reports
// Running with its pid, then its end.
func TestTasksRunConcurrentlyThroughTheAgent(t *testing.T) {
	dir := stateDir(t)
	meetDir := openDir(t)
	// Each waits for the other's file (at most 20 s): both end 0 only if
	// they ran at the same time.
	meet := func(me, other string) []string {
		return []string{"sh", "-c", `touch "$D/` + me + `"; i=0; while [ ! -e "$D/` + other + `" ]; do sleep 0.05; i=$((i+1)); [ $i -gt 400 ] && exit 1; done; exit 0`}
	}
	a := startTaskAgent(t, dir)
	tasks := map[string]taskwire.Spec{
		"task-ok-1":      {Name: "ok", Attempt: 1, Command: []string{"echo", "hi"}},
		"task-fail-1":    {Name: "fail", Attempt: 1, Command: []string{"sh", "-c", "exit 3"}},
		"task-timeout-1": {Name: "slow", Attempt: 1, Command: []string{"sleep", "60"}, TimeoutSeconds: 1, KillTimeoutSeconds: 1},
		"task-meet-1":    {Name: "m1", Attempt: 1, Command: meet("1", "2"), Env: []string{"D=" + meetDir}},
		"task-meet-2":    {Name: "m2", Attempt: 1, Command: meet("2", "1"), Env: []string{"D=" + meetDir}},
		"task-bad-1":     {Name: "bad", Attempt: 1, Command: []string{"no-such-program"}},
	}
	var uids []string
	for uid, spec := range tasks {
		putTask(t, a.db, uid, spec)
		a.schedule(uid)
		uids = append(uids, uid)
	}
	all := waitStatuses(t, a.Agent, uids...)
	want := map[string]struct{ phase, reason, code, tail string }{
		"task-ok-1":      {PhaseSucceeded, "", "0", "hi\n"},
		"task-fail-1":    {PhaseFailed, taskwire.ReasonExitCode, "3", ""},
		"task-timeout-1": {PhaseFailed, taskwire.ReasonTimeout, "143", ""},
		"task-meet-1":    {PhaseSucceeded, "", "0", ""},
		"task-meet-2":    {PhaseSucceeded, "", "0", ""},
		"task-bad-1":     {PhaseFailed, taskwire.ReasonStartError, "none", ""},
	}
	for uid, w := range want {
		ss := all[uid]
		end := ss[len(ss)-1]
		if end.phase != w.phase || end.reason != w.reason || code(end.report) != w.code || end.report.OutputTail != w.tail {
			t.Errorf("%s ended %s/%s code %s tail %q (%s), want %s/%s code %s tail %q", uid, end.phase, end.reason, code(end.report), end.report.OutputTail, end.report.Message, w.phase, w.reason, w.code, w.tail)
		}
		if uid == "task-bad-1" {
			if len(ss) != 1 {
				t.Errorf("%s never started but reported %+v", uid, ss)
			}
			continue
		}
		if len(ss) != 2 || ss[0].phase != PhaseRunning || ss[0].report.PID == 0 || ss[0].report.StartTime == "" {
			t.Errorf("%s: statuses %+v, want Running with a pid and start time, then its end", uid, ss)
		} else if end.report.PID != ss[0].report.PID || end.report.FinishTime == "" {
			t.Errorf("%s: end report %+v, want pid %d and a finish time", uid, end.report, ss[0].report.PID)
		}
	}
}

// TestCancelledTaskIsReportedOnceItsProcessIsGone: a hub cancel stops the
// process (SIGTERM, then SIGKILL for one that ignores it) before the agent
// confirms Cancelled.
func TestCancelledTaskIsReportedOnceItsProcessIsGone(t *testing.T) {
	a := startTaskAgent(t, stateDir(t))
	ready := filepath.Join(openDir(t), "ready")
	putTask(t, a.db, "task-c-1", taskwire.Spec{Command: []string{"sh", "-c", `trap "" TERM; touch "$R"; sleep 60`}, Env: []string{"R=" + ready}, KillTimeoutSeconds: 1})
	a.schedule("task-c-1")
	pid := waitRunning(t, a.Agent, "task-c-1").PID
	testkit.Eventually(t, taskWait, func() string {
		if _, err := os.Stat(ready); err != nil {
			return "the task has not set its trap"
		}
		return ""
	})
	if err := a.cancel(context.Background(), "task-c-1", "cancelled by the hub"); err != nil {
		t.Fatal(err)
	}
	if acts, err := a.db.Actions(context.Background(), "task-c-1"); err != nil || !slices.ContainsFunc(acts, func(x store.Action) bool { return x.Action == cancelAction }) {
		t.Errorf("actions %+v (%v): the cancel is not recorded for a restart", acts, err)
	}
	end := waitStatuses(t, a.Agent, "task-c-1")["task-c-1"]
	if alive(pid) {
		t.Errorf("Cancelled was reported while process %d still ran", pid)
	}
	last := end[len(end)-1]
	if last.phase != PhaseCancelled || last.reason != taskwire.ReasonCancelled || code(last.report) != "137" {
		t.Errorf("end %s/%s code %s (%s), want Cancelled/Cancelled code 137 (it ignored SIGTERM)", last.phase, last.reason, code(last.report), last.report.Message)
	}
}

// TestTaskOutlivesAnAgentRestart: the agent stops (as an upgrade's re-exec
// does: the process stays its child) and a new one on the same DB takes the
// task over, with its exit code, without running it again.
func TestTaskOutlivesAnAgentRestart(t *testing.T) {
	dir, flag := stateDir(t), filepath.Join(openDir(t), "go")
	a := startTaskAgent(t, dir)
	putTask(t, a.db, "task-r-1", taskwire.Spec{Command: []string{"sh", "-c", `echo started; while [ ! -e "$F" ]; do sleep 0.05; done; echo done; exit 4`}, Env: []string{"F=" + flag}})
	a.schedule("task-r-1")
	pid := waitRunning(t, a.Agent, "task-r-1").PID
	a.stop()
	if !alive(pid) {
		t.Fatalf("stopping the agent ended task process %d", pid)
	}
	b := startTaskAgent(t, dir)
	testkit.Eventually(t, taskWait, func() string {
		if n := b.driver.Watching(); n != 1 {
			return fmt.Sprintf("the new agent watches %d processes, want the task's", n)
		}
		return ""
	})
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ss := waitStatuses(t, b.Agent, "task-r-1")["task-r-1"]
	if len(ss) != 2 || ss[0].phase != PhaseRunning {
		t.Fatalf("statuses %+v, want one Running and the end", ss)
	}
	if end := ss[1]; end.phase != PhaseFailed || end.reason != taskwire.ReasonExitCode || code(end.report) != "4" || end.report.OutputTail != "started\ndone\n" {
		t.Errorf("end %+v, want Failed/ExitCode 4 with the output of one run", end)
	}
}

// TestStopTasksOnExit: an agent run with StopTasksOnExit (drover up's
// local agents) stops its task processes as it stops, SIGKILLing one that
// ignores SIGTERM after the grace, and records them Failed, AgentStopped; a
// restart reports that, and starts nothing again.
func TestStopTasksOnExit(t *testing.T) {
	dir := stateDir(t)
	stopping := func(o *Options) { o.StopTasksOnExit, o.StopTasksGrace = true, 300*time.Millisecond }
	a := startTaskAgentOpts(t, dir, nil, stopping)
	putTask(t, a.db, "polite", taskwire.Spec{Command: []string{"sleep", "60"}})
	putTask(t, a.db, "stubborn", taskwire.Spec{Command: []string{"sh", "-c", `trap "" TERM; echo up; while :; do sleep 0.05; done`}})
	a.schedule("polite")
	a.schedule("stubborn")
	polite := waitRunning(t, a.Agent, "polite").PID
	stubborn := waitRunning(t, a.Agent, "stubborn").PID
	// Running is reported once the shell is exec'd, not once it has run
	// its trap: stopped before that (a busy machine), it dies of SIGTERM
	// (143). "up" is printed after the trap.
	out := filepath.Join(a.driver.TaskDir("stubborn"), taskexec.StdoutFile)
	testkit.Eventually(t, taskWait, func() string {
		if b, _ := os.ReadFile(out); !strings.Contains(string(b), "up") {
			return fmt.Sprintf("stubborn has not printed up (stdout %q): its SIGTERM trap may not be set", b)
		}
		return ""
	})
	began := time.Now()
	a.stop()
	if took := time.Since(began); took > taskWait {
		t.Errorf("stopping took %v", took)
	}
	for _, pid := range []int{polite, stubborn} {
		if alive(pid) {
			t.Errorf("task process %d still runs after the agent stopped", pid)
		}
	}
	b := startTaskAgentOpts(t, dir, nil, stopping)
	ss := waitStatuses(t, b.Agent, "polite", "stubborn")
	for uid, want := range map[string]string{"polite": "143", "stubborn": "137"} {
		end := ss[uid][len(ss[uid])-1]
		if end.phase != PhaseFailed || end.reason != taskwire.ReasonAgentStopped || code(end.report) != want ||
			!strings.Contains(end.report.Message, "--stop-tasks-on-exit") {
			t.Errorf("%s ended %+v, want Failed/AgentStopped with exit code %s", uid, end, want)
		}
	}
	if n := b.driver.Watching(); n != 0 {
		t.Errorf("the restarted agent watches %d processes, want none", n)
	}
}

// TestTasksAfterAnAgentCrash: an agent process is killed (SIGKILL) while it
// runs tasks; their processes, in their own groups, go on as orphans. A new
// agent process on the same DB reports the one that ended meanwhile as
// lost, re-attaches the others, still enforces a timeout, and says the exit
// code of a re-attached process is unknown.
func TestTasksAfterAnAgentCrash(t *testing.T) {
	dir, flag := stateDir(t), filepath.Join(openDir(t), "go")
	db, err := store.Open(context.Background(), filepath.Join(dir, "agent.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	putTask(t, db, "task-gone-1", taskwire.Spec{Command: []string{"sleep", "1"}})
	putTask(t, db, "task-late-1", taskwire.Spec{Command: []string{"sleep", "60"}, TimeoutSeconds: 3, KillTimeoutSeconds: 1})
	putTask(t, db, "task-watch-1", taskwire.Spec{Command: []string{"sh", "-c", `while [ ! -e "$F" ]; do sleep 0.05; done; echo after the crash`}, Env: []string{"F=" + flag}})
	db.Close()

	helper := exec.Command(os.Args[0], "-test.run=^TestTaskCrashHelper$", "-test.count=1", "-test.v")
	helper.Env = append(os.Environ(), "DROVER_TASK_HELPER_DIR="+dir)
	helper.Stderr = os.Stderr
	out, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	defer helper.Process.Kill()
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "helper: ready" {
				ready <- true
				return
			}
		}
		ready <- false
	}()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatal("the helper agent ended without starting its tasks")
		}
	case <-time.After(taskWait):
		t.Fatal("the helper agent did not start its tasks")
	}
	// The agent dies; its tasks do not.
	if err := helper.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	helper.Wait()

	// The pids the dead agent reported.
	db, err = store.Open(context.Background(), filepath.Join(dir, "agent.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pids := map[string]int{}
	for uid, ss := range taskStatuses(t, &Agent{db: db}) {
		pids[uid] = ss[0].report.PID
	}
	db.Close()
	testkit.Eventually(t, taskWait, func() string {
		if alive(pids["task-gone-1"]) {
			return "sleep 1 still runs"
		}
		return ""
	})
	if !alive(pids["task-watch-1"]) {
		t.Fatal("the agent's death killed its task")
	}
	b := startTaskAgent(t, dir)
	testkit.Eventually(t, taskWait, func() string {
		if n := b.driver.Watching(); n < 2 {
			return fmt.Sprintf("the new agent re-attached %d of the 2 tasks that still run", n)
		}
		return ""
	})
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	all := waitStatuses(t, b.Agent, "task-gone-1", "task-late-1", "task-watch-1")
	end := func(uid string) taskStatus { ss := all[uid]; return ss[len(ss)-1] }
	for _, uid := range []string{"task-gone-1", "task-watch-1"} {
		if e := end(uid); e.phase != PhaseFailed || e.reason != taskwire.ReasonLost || e.report.ExitCode != nil || !strings.Contains(e.report.Message, "unknown") {
			t.Errorf("%s ended %+v, want Failed/%s without an exit code, saying the result is unknown", uid, e, taskwire.ReasonLost)
		}
	}
	// Its log shim outlived the dead agent: what it wrote after is logged.
	if e := end("task-watch-1"); e.report.OutputTail != "after the crash\n" {
		t.Errorf("task-watch-1's output %q, want what it wrote after the agent died", e.report.OutputTail)
	}
	if e := end("task-late-1"); e.phase != PhaseFailed || e.reason != taskwire.ReasonTimeout || code(e.report) != "143" {
		t.Errorf("task-late-1 ended %+v, want Failed/timeout 143", e)
	}
	if alive(pids["task-late-1"]) {
		t.Errorf("the timed-out task %d still runs", pids["task-late-1"])
	}
	for uid, ss := range all {
		if n := len(ss); n != 2 {
			t.Errorf("%s: %d statuses %+v, want Running once and its end", uid, n, ss)
		}
	}
}

// TestTaskCrashHelper is the agent process TestTasksAfterAnAgentCrash kills.
func TestTaskCrashHelper(t *testing.T) {
	dir := os.Getenv("DROVER_TASK_HELPER_DIR")
	if dir == "" {
		t.Skip("runs only as TestTasksAfterAnAgentCrash's helper process")
	}
	a := startTaskAgent(t, dir)
	for _, uid := range []string{"task-gone-1", "task-late-1", "task-watch-1"} {
		waitRunning(t, a.Agent, uid)
	}
	os.Stdout.WriteString("helper: ready\n")
	<-time.After(taskWait) // not a synchronisation: the parent test kills this process first
	t.Error("the helper was not killed")
}

// TestTaskGoroutines: through the agent, 100 running tasks cost at most a
// goroutine each (the one waiting for its end) plus a constant.
func TestTaskGoroutines(t *testing.T) {
	const n, constant = 100, 4
	a := startTaskAgent(t, stateDir(t))
	before := runtime.NumGoroutine()
	var uids []string
	for i := range n {
		uid := "task-many-" + strconv.Itoa(i+1)
		putTask(t, a.db, uid, taskwire.Spec{Command: []string{"sleep", "60"}})
		a.schedule(uid)
		uids = append(uids, uid)
	}
	testkit.Eventually(t, taskWait, func() string {
		if w := a.driver.Watching(); w < n {
			return fmt.Sprintf("%d of %d tasks running", w, n)
		}
		return ""
	})
	during := runtime.NumGoroutine()
	t.Logf("goroutines: %d before, %d with %d tasks running", before, during, n)
	if during-before > n+constant {
		t.Errorf("goroutines grew by %d with %d tasks, want at most %d + %d", during-before, n, n, constant)
	}
	for _, uid := range uids {
		if err := a.cancel(context.Background(), uid, "cancelled by the hub"); err != nil {
			t.Fatal(err)
		}
	}
	for uid, ss := range waitStatuses(t, a.Agent, uids...) {
		if end := ss[len(ss)-1]; end.phase != PhaseCancelled || code(end.report) != "143" {
			t.Errorf("%s ended %+v, want Cancelled 143", uid, end)
		}
	}
}

// TestStartStopsTheProcessOfDroppedWork: a task process still running for
// work the DB no longer holds (the hub dropped it around a restart) is
// stopped at the next start, and its record forgotten: nobody would ever
// report it.
func TestStartStopsTheProcessOfDroppedWork(t *testing.T) {
	dir := stateDir(t)
	a := startTaskAgent(t, dir)
	putTask(t, a.db, "task-d-1", taskwire.Spec{Command: []string{"sleep", "60"}})
	a.schedule("task-d-1")
	pid := waitRunning(t, a.Agent, "task-d-1").PID
	a.stop()
	db, err := store.Open(context.Background(), filepath.Join(dir, "agent.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.DeleteWork(context.Background(), "task-d-1"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if !alive(pid) {
		t.Fatal("the task ended with the agent")
	}
	b := startTaskAgent(t, dir)
	testkit.Eventually(t, taskWait, func() string {
		if alive(pid) {
			return fmt.Sprintf("process %d of dropped work still runs", pid)
		}
		return ""
	})
	if acts, err := b.db.Actions(context.Background(), "task-d-1"); err != nil || len(acts) != 0 {
		t.Errorf("records of dropped work: %+v %v, want none", acts, err)
	}
	// Its logs stay, for the retention period from now.
	waitFor(t, func() bool {
		_, err := os.Stat(filepath.Join(b.driver.TaskDir("task-d-1"), taskexec.EndedFile))
		return err == nil
	})
	if removed, err := b.driver.GC(context.Background()); err != nil || len(removed) != 0 {
		t.Errorf("GC = %v, %v; want the stopped attempt's dir kept", removed, err)
	}
}

// TestCancelSurvivesAnAgentRestart: a cancel the agent recorded but had not
// carried out when it stopped (the hub will not send it again: it was
// acked) stops the task after the restart.
func TestCancelSurvivesAnAgentRestart(t *testing.T) {
	dir := stateDir(t)
	a := startTaskAgent(t, dir)
	putTask(t, a.db, "task-k-1", taskwire.Spec{Command: []string{"sleep", "60"}})
	a.schedule("task-k-1")
	pid := waitRunning(t, a.Agent, "task-k-1").PID
	// What cancel records before it interrupts the runner, as if the agent
	// died right after.
	a.reportMu.Lock()
	err := a.db.SetAction(context.Background(), store.Action{UID: "task-k-1", Action: cancelAction, State: store.ActionRunning, Reason: "cancelled by the hub"})
	a.reportMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	a.stop()
	if !alive(pid) {
		t.Fatal("the task ended with the agent")
	}
	b := startTaskAgent(t, dir)
	ss := waitStatuses(t, b.Agent, "task-k-1")["task-k-1"]
	if end := ss[len(ss)-1]; end.phase != PhaseCancelled || code(end.report) != "143" {
		t.Errorf("end %+v, want Cancelled 143", end)
	}
	if alive(pid) {
		t.Errorf("process %d still runs", pid)
	}
}

// TestDroppedTasksKeepTheirDirs: the snapshot a hub sends after a
// reconnect lists neither finished attempts nor one it gave up on while
// the node was away (NodeLost, run again elsewhere). The agent forgets
// both and stops the running one, but each keeps its task dir (logs, for
// drover logs) until --task-retention has passed since it ended: the
// finished one since it finished, the stopped one since it was stopped.
func TestDroppedTasksKeepTheirDirs(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	clk := clocktest.New(t0)
	// The collector of the exec driver may run beside the test's own GC
	// calls (stepping the clock fires its timer): every check is of what
	// is on disk after the test's call, which a pass at the same time or
	// earlier cannot change.
	gc := func(t *testing.T, a *taskAgent, at time.Time, want map[string]bool) {
		t.Helper()
		clk.Step(at.Sub(clk.Now()))
		if _, err := a.driver.GC(context.Background()); err != nil {
			t.Fatalf("GC at %s: %v", at, err)
		}
		for uid, kept := range want {
			if _, err := os.Stat(a.driver.TaskDir(uid)); (err == nil) != kept {
				t.Errorf("GC at t0+%s: the dir of %s: %v, want kept=%v", at.Sub(t0), uid, err, kept)
			}
		}
	}
	log := func(t *testing.T, a *taskAgent, uid string) (string, error) {
		t.Helper()
		var c collect
		err := a.streamLog(context.Background(), &agentv1.LogRequest{Uid: uid, Stream: "stdout"}, c.send)
		return c.data(), err
	}
	ctx := context.Background()
	a := startTaskAgentWith(t, stateDir(t), clk)
	const finished, lost = "task-done-1", "task-lost-1"
	putTask(t, a.db, finished, taskwire.Spec{Command: []string{"echo", "finished output"}})
	a.schedule(finished)
	waitStatuses(t, a.Agent, finished)
	putTask(t, a.db, lost, taskwire.Spec{Command: []string{"sh", "-c", "echo partial output; exec sleep 60"}})
	a.schedule(lost)
	pid := waitRunning(t, a.Agent, lost).PID
	waitFor(t, func() bool {
		b, _ := os.ReadFile(filepath.Join(a.driver.TaskDir(lost), taskexec.StdoutFile))
		return string(b) == "partial output\n"
	})

	// Two hours later the hub is back in touch; its snapshot holds neither.
	clk.Step(2 * time.Hour)
	if err := a.handleBatch(ctx, &fakeHub{}, protocol.NewTracker(0), []*agentv1.Envelope{protocol.NewSnapshot("n1", 1, nil)}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, taskWait, func() string {
		if alive(pid) {
			return fmt.Sprintf("process %d of the dropped attempt still runs", pid)
		}
		return ""
	})
	waitFor(t, func() bool {
		_, err := os.Stat(filepath.Join(a.driver.TaskDir(lost), taskexec.EndedFile))
		return err == nil
	})
	for _, uid := range []string{finished, lost} {
		if _, ok, err := a.db.Work(ctx, uid); err != nil || ok {
			t.Errorf("the DB holds %s after the snapshot dropped it (%v)", uid, err)
		}
	}

	gc(t, a, t0.Add(2*time.Hour), map[string]bool{finished: true, lost: true})
	for uid, want := range map[string]string{finished: "finished output\n", lost: "partial output\n"} {
		if got, err := log(t, a, uid); err != nil || got != want {
			t.Errorf("log of dropped %s = %q, %v; want %q", uid, got, err, want)
		}
	}
	// The finished attempt ended at t0, the lost one was stopped at t0+2h.
	gc(t, a, t0.Add(24*time.Hour-time.Second), map[string]bool{finished: true, lost: true})
	gc(t, a, t0.Add(24*time.Hour), map[string]bool{finished: false, lost: true})
	gc(t, a, t0.Add(26*time.Hour-time.Second), map[string]bool{lost: true})
	gc(t, a, t0.Add(26*time.Hour), map[string]bool{lost: false})
	for _, uid := range []string{finished, lost} {
		var le *logError
		if _, err := log(t, a, uid); !errors.As(err, &le) || !strings.Contains(le.msg, "--task-retention (24h) had passed since it ended") {
			t.Errorf("log of %s after its retention: %v, want an error naming the retention", uid, err)
		}
	}
}

// TestTaskCannotReadTheAgentsState: issue #15's first attack through the
// agent. A task (as the task user) cannot read agent.db, the registration
// key or another task's log; the agent narrows a state dir left readable
// by others to 0700 as it starts.
func TestTaskCannotReadTheAgentsState(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("switching to the task user needs root")
	}
	dir := stateDir(t)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "registration.key"), []byte("secret key"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := startTaskAgent(t, dir)
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("state dir %v (%v), want 0700", fi.Mode(), err)
	}
	putTask(t, a.db, "task-log-1", taskwire.Spec{Command: []string{"echo", "a tenant's output"}})
	a.schedule("task-log-1")
	waitStatuses(t, a.Agent, "task-log-1")
	tries := map[string]string{
		"task-peek-1": filepath.Join(dir, "agent.db"),
		"task-peek-2": filepath.Join(dir, "registration.key"),
		"task-peek-3": filepath.Join(a.driver.TaskDir("task-log-1"), taskexec.StdoutFile),
	}
	for uid, name := range tries {
		putTask(t, a.db, uid, taskwire.Spec{Command: []string{"cat", name}})
		a.schedule(uid)
	}
	all := waitStatuses(t, a.Agent, "task-peek-1", "task-peek-2", "task-peek-3")
	for uid := range tries {
		end := all[uid][len(all[uid])-1]
		if end.phase != PhaseFailed || code(end.report) == "0" || !strings.Contains(end.report.OutputTail, "Permission denied") {
			t.Errorf("%s: cat %s ended %s code %s output %q; want a non-zero exit, permission denied", uid, tries[uid], end.phase, code(end.report), end.report.OutputTail)
		}
	}
}
