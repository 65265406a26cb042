package taskexec

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/clock/clocktest"
	"github.com/drover-fleet/drover/internal/task/taskwire"
	"github.com/drover-fleet/drover/internal/testkit"
)

// newGCDriver is a driver on clk whose collector made its pass at the start
// and waits on clk for a next one that never comes: the test's own GC calls
// are the only ones from then on.
func newGCDriver(t *testing.T, clk *clocktest.Fake, opts Options) *Driver {
	t.Helper()
	opts.Clock, opts.GCInterval = clk, 1000*time.Hour
	d := newDriver(t, opts)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := clk.BlockUntilWaiters(ctx, 1); err != nil {
		t.Fatalf("the collector's pass at the start did not end within %v: %v", testTimeout, err)
	}
	return d
}

// setClock moves clk forward to at.
func setClock(clk *clocktest.Fake, at time.Time) { clk.Step(at.Sub(clk.Now())) }

// syncBuffer is a log sink the collector goroutine and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func exists(t *testing.T, path string) bool {
	t.Helper()
	_, err := os.Stat(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

func TestGC(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	clock := clocktest.New(t0)
	var logs syncBuffer
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	d := newGCDriver(t, clock, Options{
		Retention: time.Hour,
		Logger:    slog.New(slog.NewTextHandler(&logs, nil)),
	})
	tasks := filepath.Join(d.opts.StateDir, "tasks")
	gc := func(at time.Time) {
		t.Helper()
		setClock(clock, at)
		if _, err := d.GC(context.Background()); err != nil {
			t.Fatalf("GC: %v", err)
		}
	}
	check := func(when string, want map[string]bool) {
		t.Helper()
		for id, kept := range want {
			if got := exists(t, d.TaskDir(id)); got != kept {
				t.Errorf("%s: dir of %s exists = %v, want %v", when, id, got, kept)
			}
			if id == "task-unmarked-1" {
				continue // made by hand, without an attempt dir
			}
			if got := exists(t, d.WorkDir(id)); got != kept {
				t.Errorf("%s: the attempt dir of %s exists = %v, want %v (it goes with the task dir)", when, id, got, kept)
			}
		}
	}

	// Ended at t0: the retention period is over at t0+1h.
	run(t, d, "task-old-1", &taskwire.Spec{Command: []string{"true"}})
	ownWork := filepath.Join(sharedDir(t), "own") // made for the task, and given to it
	run(t, d, "task-own-wd-1", &taskwire.Spec{Command: []string{"touch", "kept"}, WorkingDir: ownWork})
	if _, err := d.Prepare(context.Background(), "task-noart-1", &taskwire.Spec{Command: []string{"true"},
		Artifacts: []taskwire.Artifact{{URL: srv.URL + "/x", SHA256: strings.Repeat("0", 64), Path: "x"}}}); err == nil {
		t.Fatal("Prepare with a missing artifact succeeded")
	}
	// Runs on, for ever.
	sleeper := start(t, d, "task-running-1", &taskwire.Spec{Command: []string{"sleep", "600"}})
	defer func() { sleeper.Cancel(); wait(t, sleeper) }()
	// Started by an earlier agent process, not adopted yet: no ended mark.
	if err := os.MkdirAll(filepath.Join(tasks, "task-unmarked-1"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tasks, "notes.txt"), []byte("not a task dir"), 0o640); err != nil {
		t.Fatal(err)
	}
	// Ended at t0+50m.
	setClock(clock, t0.Add(50*time.Minute))
	run(t, d, "task-young-1", &taskwire.Spec{Command: []string{"echo", "still wanted"}})

	gc(t0.Add(59 * time.Minute))
	check("t0+59m", map[string]bool{"task-old-1": true, "task-own-wd-1": true, "task-noart-1": true,
		"task-running-1": true, "task-unmarked-1": true, "task-young-1": true})

	gc(t0.Add(61 * time.Minute))
	check("t0+61m", map[string]bool{"task-old-1": false, "task-own-wd-1": false, "task-noart-1": false,
		"task-running-1": true, "task-unmarked-1": true, "task-young-1": true})
	if !exists(t, filepath.Join(ownWork, "kept")) {
		t.Error("the spec's own working dir was removed with the task dir")
	}
	if b, err := os.ReadFile(filepath.Join(d.TaskDir("task-young-1"), StdoutFile)); err != nil || string(b) != "still wanted\n" {
		t.Errorf("the log of a task within its retention: %q, %v", b, err)
	}

	gc(t0.Add(24 * time.Hour))
	check("t0+24h", map[string]bool{"task-running-1": true, "task-unmarked-1": true, "task-young-1": false})
	if !exists(t, filepath.Join(tasks, "notes.txt")) {
		t.Error("a file that is no task dir was removed")
	}

	// The running task is stopped at t0+24h (as when the hub drops it):
	// its dir goes an hour later.
	setClock(clock, t0.Add(24*time.Hour))
	sleeper.Cancel()
	wait(t, sleeper)
	gc(t0.Add(24*time.Hour + 59*time.Minute))
	check("t0+24h59m", map[string]bool{"task-running-1": true})
	gc(t0.Add(25 * time.Hour))
	check("t0+25h", map[string]bool{"task-running-1": false, "task-unmarked-1": true})

	out := logs.String()
	for _, want := range []string{"id=task-old-1", "id=task-young-1", "id=task-running-1", "its retention period is over"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log does not say %q:\n%s", want, out)
		}
	}
	if entries, _ := os.ReadDir(tasks); slices.ContainsFunc(entries, func(e os.DirEntry) bool { return strings.HasPrefix(e.Name(), gcPrefix) }) {
		t.Errorf("left %v", entries)
	}
}

// An attempt prepared again in a dir marked ended (the agent stopped
// between Prepare and Start, and resumes it) is no longer ended.
func TestGCSparesAPreparedAttempt(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	clock := clocktest.New(t0)
	d := newGCDriver(t, clock, Options{Retention: time.Hour})
	spec := &taskwire.Spec{Command: []string{"sleep", "600"}}
	prep, err := d.Prepare(context.Background(), "task-again-1", spec)
	if err != nil {
		t.Fatal(err)
	}
	prep.Close()
	if !exists(t, filepath.Join(d.TaskDir("task-again-1"), EndedFile)) {
		t.Fatal("a prepared attempt closed without starting is not marked ended")
	}
	prep, err = d.Prepare(context.Background(), "task-again-1", spec)
	if err != nil {
		t.Fatal(err)
	}
	setClock(clock, t0.Add(48*time.Hour))
	if removed, err := d.GC(context.Background()); err != nil || len(removed) != 0 {
		t.Fatalf("GC while prepared = %v, %v; want nothing removed", removed, err)
	}
	p, err := prep.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { p.Cancel(); wait(t, p) }()
	if removed, err := d.GC(context.Background()); err != nil || len(removed) != 0 || !exists(t, d.TaskDir("task-again-1")) {
		t.Fatalf("GC while running = %v, %v; want nothing removed", removed, err)
	}
}

// The driver collects at its start, by itself, and its collector stops
// with Close.
func TestGCAtStart(t *testing.T) {
	state := t.TempDir()
	old := filepath.Join(state, "tasks", "task-before-1")
	cut := filepath.Join(state, "tasks", gcPrefix+"task-before-0") // a removal the last agent cut short
	for _, dir := range []string{filepath.Join(old, "work"), cut} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(old, EndedFile), []byte(time.Now().Add(-25*time.Hour).Format(time.RFC3339Nano)), 0o640); err != nil {
		t.Fatal(err)
	}
	d, err := New(Options{StateDir: state})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, testTimeout, func() string {
		if exists(t, old) || exists(t, cut) {
			return "the driver has not removed an expired task dir, nor finished a cut-short removal, at its start"
		}
		return ""
	})
	d.Close() // returns once the collector has stopped
	if removed, err := d.GC(context.Background()); err != nil || removed != nil {
		t.Errorf("GC after Close = %v, %v; want nothing", removed, err)
	}
}
