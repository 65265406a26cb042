package runner

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/clock/clocktest"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
	"github.com/drover-fleet/drover/internal/store"
	"github.com/drover-fleet/drover/internal/testkit"
)

func TestMain(m *testing.M) { testkit.VerifyNoLeaks(m) }

// errCrash is how a fake crash point stops a run: the run ends where the
// process would have died, and the test starts a new runner on the DB.
var errCrash = errors.New("crash")

// testTimeout bounds each test: the flows run on a local SQLite file.
const testTimeout = time.Minute

const uid = "job-1"

// testFlow is A → B, and R (a rollback: it fails the flow) when B fails.
func testFlow() *nodejobwire.Flow {
	r := &nodejobwire.Action{Name: "R", FailsTask: true}
	b := &nodejobwire.Action{Name: "B", OnFailure: r}
	return &nodejobwire.Flow{First: &nodejobwire.Action{Name: "A", OnSuccess: b}}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// machine is one node's agent DB across agent restarts.
type machine struct {
	t    *testing.T
	path string
	db   *store.Store
}

func newMachine(t *testing.T) *machine {
	m := &machine{t: t, path: filepath.Join(t.TempDir(), "agent.db")}
	m.open()
	t.Cleanup(func() { m.db.Close() })
	return m
}

func (m *machine) open() {
	m.t.Helper()
	db, err := store.Open(context.Background(), m.path, store.Options{})
	if err != nil {
		m.t.Fatal(err)
	}
	m.db = db
}

// restart closes the DB and opens it again, as a new agent process would.
func (m *machine) restart() {
	m.t.Helper()
	if err := m.db.Close(); err != nil {
		m.t.Fatal(err)
	}
	m.open()
}

func (m *machine) record(action string) (store.Action, bool) {
	m.t.Helper()
	list, err := m.db.Actions(context.Background(), uid)
	if err != nil {
		m.t.Fatal(err)
	}
	for _, a := range list {
		if a.Action == action {
			return a, true
		}
	}
	return store.Action{}, false
}

// fakes are the actions A, B and R: they count their calls, end as told,
// and check the runner's first rule: an action runs only while it is
// recorded Running (never once its end is recorded).
type fakes struct {
	m      *machine
	fail   map[string]bool // actions that end Failed
	crash  string          // the action that crashes, once
	mu     sync.Mutex
	ends   map[string]int // ends returned, by action
	resume map[string]int // Resume calls, by action
}

func newFakes(m *machine, fail ...string) *fakes {
	f := &fakes{m: m, fail: map[string]bool{}, ends: map[string]int{}, resume: map[string]int{}}
	for _, a := range fail {
		f.fail[a] = true
	}
	return f
}

func (f *fakes) actions() Actions {
	set := Actions{}
	for _, name := range []string{"A", "B", "R"} {
		set[name] = WithResume(
			func(ctx context.Context, s *Step) (Outcome, error) { return f.do(s, false) },
			func(ctx context.Context, s *Step) (Outcome, error) { return f.do(s, true) })
	}
	return set
}

func (f *fakes) do(s *Step, resumed bool) (Outcome, error) {
	f.m.t.Helper()
	if rec, ok := f.m.record(s.Action); !ok || rec.State != store.ActionRunning {
		f.m.t.Errorf("action %s runs while its record is %+v (found %v), want it recorded Running first", s.Action, rec, ok)
	}
	if s.Resumed != resumed {
		f.m.t.Errorf("action %s: Step.Resumed = %v in a call of Resume = %v", s.Action, s.Resumed, resumed)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if resumed {
		f.resume[s.Action]++
	}
	if f.crash == s.Action {
		f.crash = ""
		return Outcome{}, errCrash
	}
	f.ends[s.Action]++
	if f.fail[s.Action] {
		return Fail(s.Action+" failed", []byte(`"`+s.Action+`"`)), nil
	}
	return OK(s.Action+" done", []byte(`"`+s.Action+`"`)), nil
}

// crashingStore is the DB of a process that dies at its at-th write
// (SetAction or MarkActionReported, 1-based; 0: never): that write and
// everything after it do not happen.
type crashingStore struct {
	Store
	at, writes int
}

func (c *crashingStore) write() error {
	c.writes++
	if c.at > 0 && c.writes >= c.at {
		return errCrash
	}
	return nil
}

func (c *crashingStore) SetAction(ctx context.Context, a store.Action) error {
	if err := c.write(); err != nil {
		return err
	}
	return c.Store.SetAction(ctx, a)
}

func (c *crashingStore) MarkActionReported(ctx context.Context, uid, action string) error {
	if err := c.write(); err != nil {
		return err
	}
	return c.Store.MarkActionReported(ctx, uid, action)
}

// reports keeps the reports sent, checking that each end was recorded
// before it was reported. crashAt (1-based) fails that report.
type reports struct {
	m       *machine
	crashAt int
	n       int
	list    []string // "A ok Running"
}

func (r *reports) report(_ context.Context, rep Report) error {
	r.n++
	if r.crashAt > 0 && r.n == r.crashAt {
		return errCrash
	}
	if rec, _ := r.m.record(rep.Action); !rep.Waiting && rec.State == store.ActionRunning {
		r.m.t.Errorf("the end of %s was reported before it was recorded", rep.Action)
	}
	res := "failed"
	switch {
	case rep.Waiting:
		res = "waiting"
	case rep.Success:
		res = "ok"
	}
	r.list = append(r.list, fmt.Sprintf("%s %s %s", rep.Action, res, rep.Phase()))
	return nil
}

func newRunner(t *testing.T, s Store) *Runner {
	t.Helper()
	r, err := New(Options{Store: s, Clock: clocktest.New(time.Time{})})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// scenarios are the flow's two paths.
var scenarios = []struct {
	name    string
	fail    []string
	path    []string
	reports []string
	end     End
}{
	{"success", nil, []string{"A", "B"}, []string{"A ok Running", "B ok Succeeded"},
		End{Result: nodejobwire.Succeeded, Reason: "B done"}},
	{"failure and rollback", []string{"B"}, []string{"A", "B", "R"}, []string{"A ok Running", "B failed Running", "R ok Failed"},
		End{Result: nodejobwire.Failed, Reason: "R done"}},
}

func TestRunWalksTheFlowOnceAndThenRepeatsNothing(t *testing.T) {
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			ctx := testCtx(t)
			m := newMachine(t)
			f := newFakes(m, sc.fail...)
			rep := &reports{m: m}
			for i := range 2 {
				end, err := newRunner(t, m.db).Run(ctx, uid, testFlow(), f.actions(), rep.report)
				if err != nil || end != sc.end {
					t.Fatalf("Run() #%d = %+v, %v; want %+v", i+1, end, err, sc.end)
				}
			}
			if strings.Join(rep.list, "; ") != strings.Join(sc.reports, "; ") {
				t.Errorf("reports = %q, want %q (once each, over both runs)", rep.list, sc.reports)
			}
			for _, a := range sc.path {
				if f.ends[a] != 1 {
					t.Errorf("action %s ended %d times, want 1", a, f.ends[a])
				}
				if rec, _ := m.record(a); rec.State == store.ActionRunning || !rec.Reported || string(rec.Data) != `"`+a+`"` {
					t.Errorf("record of %s = %+v, want ended, reported, with its data", a, rec)
				}
			}
		})
	}
}

// TestCrashAtEachPoint stops the process at every write to the DB, every
// report and inside every action, then starts a new runner on the same DB
// file: the flow must end as without the crash, with no ended action run
// again and every end reported (a report is sent again only when the
// crash came between it and its record).
func TestCrashAtEachPoint(t *testing.T) {
	for _, sc := range scenarios {
		// A run without a crash tells how many writes and reports there are.
		m := newMachine(t)
		count := &crashingStore{Store: m.db}
		rep := &reports{m: m}
		if _, err := newRunner(t, count).Run(testCtx(t), uid, testFlow(), newFakes(m, sc.fail...).actions(), rep.report); err != nil {
			t.Fatal(err)
		}
		type crash struct {
			name          string
			write, report int
			action        string
		}
		var crashes []crash
		for i := 1; i <= count.writes; i++ {
			crashes = append(crashes, crash{name: fmt.Sprintf("at write %d of %d", i, count.writes), write: i})
		}
		for i := 1; i <= rep.n; i++ {
			crashes = append(crashes, crash{name: fmt.Sprintf("in report %d of %d", i, rep.n), report: i})
		}
		for _, a := range sc.path {
			crashes = append(crashes, crash{name: "inside action " + a, action: a})
		}
		for _, c := range crashes {
			t.Run(sc.name+"/"+c.name, func(t *testing.T) {
				ctx := testCtx(t)
				m := newMachine(t)
				f := newFakes(m, sc.fail...)
				f.crash = c.action
				rep := &reports{m: m, crashAt: c.report}
				_, err := newRunner(t, &crashingStore{Store: m.db, at: c.write}).Run(ctx, uid, testFlow(), f.actions(), rep.report)
				if !errors.Is(err, errCrash) {
					t.Fatalf("Run() with the crash = %v, want the crash", err)
				}
				// Which action did the crash leave Running?
				var running string
				for _, a := range sc.path {
					if rec, ok := m.record(a); ok && rec.State == store.ActionRunning {
						running = a
					}
				}

				m.restart()
				end, err := newRunner(t, m.db).Run(ctx, uid, testFlow(), f.actions(), rep.report)
				if err != nil || end != sc.end {
					t.Fatalf("Run() after the restart = %+v, %v; want %+v", end, err, sc.end)
				}
				if c.action != "" && running != c.action {
					t.Errorf("the crash inside %s left %q Running, want %s", c.action, running, c.action)
				}
				for _, a := range sc.path {
					// Only the action the crash left Running may end twice:
					// its first end was never recorded.
					maxEnds := 1
					if a == running {
						maxEnds = 2
						if f.resume[a] != 1 {
							t.Errorf("action %s (Running at the restart) was resumed %d times, want 1", a, f.resume[a])
						}
					} else if f.resume[a] != 0 {
						t.Errorf("action %s was resumed, but the crash did not leave it Running", a)
					}
					if got := f.ends[a]; got < 1 || got > maxEnds {
						t.Errorf("action %s ended %d times, want 1 to %d", a, got, maxEnds)
					}
					if rec, _ := m.record(a); rec.State == store.ActionRunning || !rec.Reported {
						t.Errorf("record of %s after the restart = %+v, want ended and reported", a, rec)
					}
				}
				if got := slices.Compact(slices.Clone(rep.list)); strings.Join(got, "; ") != strings.Join(sc.reports, "; ") {
					t.Errorf("reports = %q, want %q (a repeat allowed only right after the crash)", rep.list, sc.reports)
				}
				if len(rep.list) > len(sc.reports)+1 {
					t.Errorf("reports = %q: more than one repeat", rep.list)
				}
			})
		}
	}
}

func TestUnfinishedActionIsResumedByTheNextProcess(t *testing.T) {
	ctx := testCtx(t)
	m := newMachine(t)
	var resumedWith []byte
	actions := Actions{
		"A": ActionFunc(func(context.Context, *Step) (Outcome, error) { return OK("checked", nil), nil }),
		"B": WithResume(
			func(ctx context.Context, s *Step) (Outcome, error) {
				if err := s.Save(ctx, []byte(`{"stage":"swapped"}`)); err != nil {
					return Outcome{}, err
				}
				return Outcome{}, &Unfinished{Reason: "restarting as v2"}
			},
			func(ctx context.Context, s *Step) (Outcome, error) {
				resumedWith = s.Record.Data
				return OK("upgraded", s.Record.Data), nil
			}),
	}
	rep := &reports{m: m}
	end, err := newRunner(t, m.db).Run(ctx, uid, testFlow(), actions, rep.report)
	if err != nil || end != (End{Result: nodejobwire.Running, Reason: "restarting as v2"}) {
		t.Fatalf("Run() = %+v, %v; want Running, restarting as v2", end, err)
	}
	if rec, _ := m.record("B"); rec.State != store.ActionRunning {
		t.Fatalf("record of B after Unfinished = %+v, want Running", rec)
	}

	m.restart()
	end, err = newRunner(t, m.db).Run(ctx, uid, testFlow(), actions, rep.report)
	if err != nil || end != (End{Result: nodejobwire.Succeeded, Reason: "upgraded"}) {
		t.Fatalf("Run() in the next process = %+v, %v; want Succeeded", end, err)
	}
	if string(resumedWith) != `{"stage":"swapped"}` {
		t.Errorf("Resume saw data %q, want what the first run saved", resumedWith)
	}
	if want := "A ok Running; B ok Succeeded"; strings.Join(rep.list, "; ") != want {
		t.Errorf("reports = %q, want %q", rep.list, want)
	}
}

func TestCancelRecordsNoEndAndTheNextRunRunsTheActionAgain(t *testing.T) {
	ctx := testCtx(t)
	m := newMachine(t)
	runs := 0
	waiting := make(chan struct{})
	actions := Actions{
		"A": ActionFunc(func(context.Context, *Step) (Outcome, error) { return OK("checked", nil), nil }),
		// B has no Resume: cut short, it runs again.
		"B": ActionFunc(func(ctx context.Context, s *Step) (Outcome, error) {
			runs++
			if runs > 1 {
				return OK("confirmed", nil), nil
			}
			if err := s.Wait(ctx, "waiting for confirmation"); err != nil {
				return Outcome{}, err
			}
			close(waiting)
			<-ctx.Done()
			return Outcome{}, ctx.Err()
		}),
	}
	rep := &reports{m: m}
	stopCtx, stop := context.WithCancel(ctx)
	go func() {
		select {
		case <-waiting:
		case <-ctx.Done():
		}
		stop()
	}()
	_, err := newRunner(t, m.db).Run(stopCtx, uid, testFlow(), actions, rep.report)
	if err == nil || err.Error() != "B interrupted: context canceled" {
		t.Fatalf("Run(cancelled) = %v, want B interrupted: context canceled", err)
	}
	if rec, _ := m.record("B"); rec.State != store.ActionRunning {
		t.Fatalf("record of B after the cancel = %+v, want Running (no end)", rec)
	}
	end, err := newRunner(t, m.db).Run(ctx, uid, testFlow(), actions, rep.report)
	if err != nil || end != (End{Result: nodejobwire.Succeeded, Reason: "confirmed"}) {
		t.Fatalf("Run() again = %+v, %v; want Succeeded", end, err)
	}
	if want := "A ok Running; B waiting Running; B ok Succeeded"; strings.Join(rep.list, "; ") != want {
		t.Errorf("reports = %q, want %q", rep.list, want)
	}
}

func TestAnActionMissingFromTheSetFailsIntoTheFailureBranch(t *testing.T) {
	ctx := testCtx(t)
	m := newMachine(t)
	f := newFakes(m)
	actions := f.actions()
	delete(actions, "B")
	rep := &reports{m: m}
	end, err := newRunner(t, m.db).Run(ctx, uid, testFlow(), actions, rep.report)
	if err != nil || end != (End{Result: nodejobwire.Failed, Reason: "R done"}) {
		t.Fatalf("Run() = %+v, %v; want Failed after R", end, err)
	}
	if rec, _ := m.record("B"); rec.State != store.ActionFailed || !strings.Contains(rec.Reason, `no action "B"`) {
		t.Errorf("record of B = %+v, want Failed: no action", rec)
	}
}

func TestReportsAreStampedByTheClock(t *testing.T) {
	ctx := testCtx(t)
	m := newMachine(t)
	clk := clocktest.New(time.Time{})
	r, err := New(Options{Store: m.db, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	var times []time.Time
	_, err = r.Run(ctx, uid, testFlow(), newFakes(m).actions(), func(_ context.Context, rep Report) error {
		times = append(times, rep.Time)
		return nil
	})
	if err != nil || len(times) != 2 || !times[0].Equal(clk.Now()) {
		t.Errorf("report times = %v (%v), want two at %v", times, err, clk.Now())
	}
}

func TestNewNeedsAStore(t *testing.T) {
	if _, err := New(Options{}); err == nil || !strings.Contains(err.Error(), "Store is required") {
		t.Errorf("New(no store) = %v, want Store is required", err)
	}
}
