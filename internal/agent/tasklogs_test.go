package agent

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/agent/taskexec"
	"github.com/drover-fleet/drover/internal/clock/clocktest"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/store"
	taskwire "github.com/drover-fleet/drover/internal/task/taskwire"
	"github.com/drover-fleet/drover/internal/testkit"
)

// collect is a LogChunk sink: the chunks streamLog sends, in order.
type collect struct{ chunks []*agentv1.LogChunk }

func (c *collect) send(ch *agentv1.LogChunk) error {
	c.chunks = append(c.chunks, &agentv1.LogChunk{Data: bytes.Clone(ch.GetData()), Eof: ch.GetEof(), Error: ch.GetError()})
	return nil
}

func (c *collect) data() string {
	var b strings.Builder
	for _, ch := range c.chunks {
		b.Write(ch.GetData())
	}
	return b.String()
}

func TestStreamLog(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const uid = "task-abc-1"
	dir := filepath.Join(a.opts.StateDir, "tasks", uid)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", protocol.MaxLogChunkBytes+10)
	if err := os.WriteFile(filepath.Join(dir, "stdout.log.1"), []byte("old\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "stdout.log"), []byte(big+"\nnew\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := a.db.PutWork(ctx, store.Work{UID: uid, Type: "task-exec", Phase: PhaseSucceeded}); err != nil {
		t.Fatal(err)
	}

	t.Run("whole log, in chunks within the limit, rotated file first", func(t *testing.T) {
		var c collect
		if err := a.streamLog(ctx, &agentv1.LogRequest{Uid: uid, Stream: "stdout"}, c.send); err != nil {
			t.Fatal(err)
		}
		if c.data() != "old\n"+big+"\nnew\n" || !c.chunks[len(c.chunks)-1].GetEof() {
			t.Errorf("got %d bytes, want the rotated file, then the current one, then eof", len(c.data()))
		}
		for _, ch := range c.chunks {
			if len(ch.GetData()) > protocol.MaxLogChunkBytes {
				t.Errorf("a chunk of %d bytes", len(ch.GetData()))
			}
		}
	})
	t.Run("follow of an ended item drains and ends", func(t *testing.T) {
		var c collect
		if err := a.streamLog(ctx, &agentv1.LogRequest{Uid: uid, Stream: "stdout", Follow: true, TailBytes: 4}, c.send); err != nil {
			t.Fatal(err)
		}
		if c.data() != "new\n" || !c.chunks[len(c.chunks)-1].GetEof() {
			t.Errorf("got %q", c.data())
		}
	})
	t.Run("an item that wrote nothing has an empty log", func(t *testing.T) {
		var c collect
		if err := a.streamLog(ctx, &agentv1.LogRequest{Uid: uid, Stream: "stderr"}, c.send); err != nil {
			t.Fatal(err)
		}
		if len(c.chunks) != 2 || len(c.chunks[0].GetData()) != 0 || !c.chunks[1].GetEof() {
			t.Errorf("got %v", c.chunks)
		}
	})
	t.Run("follow goes on across a copy-truncate rotation", func(t *testing.T) {
		const live = "task-live-1"
		ldir := filepath.Join(a.opts.StateDir, "tasks", live)
		if err := os.MkdirAll(ldir, 0o700); err != nil {
			t.Fatal(err)
		}
		cur := filepath.Join(ldir, "stdout.log")
		if err := os.WriteFile(cur, []byte("one\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := a.db.PutWork(ctx, store.Work{UID: live, Type: "task-exec", Phase: PhaseRunning}); err != nil {
			t.Fatal(err)
		}
		var (
			c    collect
			mu   sync.Mutex
			done = make(chan error, 1)
		)
		send := func(ch *agentv1.LogChunk) error { mu.Lock(); defer mu.Unlock(); return c.send(ch) }
		got := func() string { mu.Lock(); defer mu.Unlock(); return c.data() }
		go func() { done <- a.streamLog(ctx, &agentv1.LogRequest{Uid: live, Stream: "stdout", Follow: true}, send) }()
		waitFor(t, func() bool { return got() == "one\n" })
		// What the exec driver does: more output, the whole file copied to
		// .1, the file emptied in place (same inode), then new output.
		appendFile(t, cur, "two\n")
		if err := os.WriteFile(cur+".tmp", []byte("one\ntwo\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(cur+".tmp", cur+".1"); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(cur, 0); err != nil {
			t.Fatal(err)
		}
		appendFile(t, cur, "three\n")
		waitFor(t, func() bool { return strings.HasSuffix(got(), "three\n") })
		if err := a.db.SetWorkPhase(ctx, live, PhaseSucceeded, ""); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if g := got(); g != "one\ntwo\nthree\n" {
			t.Errorf("followed %q across the rotation, want one, two, three", g)
		}
	})
	t.Run("follow goes on across a rename rotation", func(t *testing.T) {
		const live = "task-live-2"
		ldir := filepath.Join(a.opts.StateDir, "tasks", live)
		if err := os.MkdirAll(ldir, 0o700); err != nil {
			t.Fatal(err)
		}
		cur := filepath.Join(ldir, "stdout.log")
		if err := os.WriteFile(cur, []byte("one\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := a.db.PutWork(ctx, store.Work{UID: live, Type: "task-exec", Phase: PhaseRunning}); err != nil {
			t.Fatal(err)
		}
		var (
			c    collect
			mu   sync.Mutex
			done = make(chan error, 1)
		)
		send := func(ch *agentv1.LogChunk) error { mu.Lock(); defer mu.Unlock(); return c.send(ch) }
		got := func() string { mu.Lock(); defer mu.Unlock(); return c.data() }
		go func() { done <- a.streamLog(ctx, &agentv1.LogRequest{Uid: live, Stream: "stdout", Follow: true}, send) }()
		waitFor(t, func() bool { return got() == "one\n" })
		// What the log shim does: the file filled, renamed to .1, and a
		// new one started once there is more output.
		appendFile(t, cur, "two\n")
		if err := os.Rename(cur, cur+".1"); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(cur, []byte("three\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { return strings.HasSuffix(got(), "three\n") })
		if err := a.db.SetWorkPhase(ctx, live, PhaseSucceeded, ""); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if g := got(); g != "one\ntwo\nthree\n" {
			t.Errorf("followed %q across the rotation, want one, two, three", g)
		}
	})
	for _, bad := range []*agentv1.LogRequest{
		{Uid: "../../etc", Stream: "stdout"},
		{Uid: "task-..-1", Stream: "stdout"},
		{Uid: uid, Stream: "../agent.db"},
		{Uid: "task-unknown-1", Stream: "stdout"},
	} {
		var c collect
		err := a.streamLog(ctx, bad, c.send)
		var le *logError
		if !errors.As(err, &le) || c.data() != "" {
			t.Errorf("request %v: %v, %d chunks; want a reason for the reader and nothing read", bad, err, len(c.chunks))
		}
	}
}

func appendFile(t *testing.T, path, text string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(text); err != nil {
		t.Fatal(err)
	}
}

// waitFor waits until cond holds; what it waits for is in the caller's
// line of the failure.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	testkit.Eventually(t, testkit.DefaultTimeout, func() string {
		if !cond() {
			return "condition not met"
		}
		return ""
	})
}

// TestStreamLogOfARemovedTaskDir: once the exec driver's collector removed
// an ended attempt's task dir, its logs are an error that says so, not an
// empty log. An attempt the agent no longer holds (the hub dropped it from
// its snapshot once it finished) keeps its dir, and its log, for the
// retention period too.
func TestStreamLogOfARemovedTaskDir(t *testing.T) {
	a := newTestAgent(t, nil)
	a.opts.TaskRetention = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), testkit.DefaultTimeout)
	defer cancel()
	// The collector's pass at the driver's start runs on its own goroutine:
	// on a busy machine it could run after the clock moved on, and take
	// dirs the test's GC must find. Wait for it to end (its next pass waits
	// on the clock), and make that next pass one the test never reaches.
	clk := clocktest.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	d, err := taskexec.New(taskexec.Options{StateDir: a.opts.StateDir, WorkDir: filepath.Join(openDir(t), "work"), Retention: a.opts.TaskRetention,
		GCInterval: 1000 * time.Hour, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := clk.BlockUntilWaiters(ctx, 1); err != nil {
		t.Fatalf("the driver's first collection has not ended: %v", err)
	}
	const (
		held    = "task-held-1"    // ended, still held
		dropped = "task-dropped-1" // ended, dropped by the hub
		// neverRan failed before its task dir was made (a bad spec): it
		// has an empty log, not a removed one.
		neverRan = "task-never-1"
	)
	for _, id := range []string{held, neverRan} {
		if _, err := a.db.PutWork(ctx, store.Work{UID: id, Type: taskwire.TypeExec, Phase: PhaseSucceeded}); err != nil {
			t.Fatal(err)
		}
	}
	// What the exec runner records once an attempt's task dir is made.
	if err := a.db.SetAction(ctx, store.Action{UID: held, Action: execAction, State: store.ActionSucceeded}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{held, dropped} {
		prep, err := d.Prepare(ctx, id, &taskwire.Spec{Command: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		prep.Close() // marks the task dir ended
	}
	emptyLog := func(t *testing.T, id string) {
		t.Helper()
		for _, follow := range []bool{false, true} {
			var c collect
			if err := a.streamLog(ctx, &agentv1.LogRequest{Uid: id, Stream: "stdout", Follow: follow}, c.send); err != nil {
				t.Fatalf("follow=%v: %v", follow, err)
			}
			if c.data() != "" || !c.chunks[len(c.chunks)-1].GetEof() {
				t.Fatalf("follow=%v: got %v, want an empty log", follow, c.chunks)
			}
		}
	}
	// Within the retention period both dirs stay, held or not.
	clk.Step(59 * time.Minute)
	if removed, err := d.GC(ctx); err != nil || len(removed) != 0 {
		t.Fatalf("GC within the retention period = %v, %v; want nothing removed", removed, err)
	}
	for _, id := range []string{held, dropped} {
		emptyLog(t, id)
	}
	clk.Step(time.Minute)
	if removed, err := d.GC(ctx); err != nil || len(removed) != 2 {
		t.Fatalf("GC after the retention period = %v, %v; want both removed", removed, err)
	}
	for _, tc := range []struct {
		id   string
		want string
	}{
		{dropped, "the logs of task attempt task-dropped-1 are not on this node: the agent never ran it here, " +
			"or removed its task directory once --task-retention (1h) had passed since it ended"},
		{held, "the logs of task attempt task-held-1 were removed from this node: " +
			"the agent keeps an ended attempt's logs for --task-retention (1h)"},
	} {
		t.Run(tc.id, func(t *testing.T) {
			if _, err := os.Stat(d.TaskDir(tc.id)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("task dir after GC: %v; want it removed", err)
			}
			for _, follow := range []bool{false, true} {
				var c collect
				err := a.streamLog(ctx, &agentv1.LogRequest{Uid: tc.id, Stream: "stdout", Follow: follow}, c.send)
				var le *logError
				if !errors.As(err, &le) || le.msg != tc.want {
					t.Errorf("follow=%v: err = %v, want %q", follow, err, tc.want)
				}
				if c.data() != "" || c.chunks[len(c.chunks)-1].GetEof() {
					t.Errorf("follow=%v: sent %v before the error", follow, c.chunks)
				}
			}
		})
	}
	t.Run(neverRan, func(t *testing.T) {
		var c collect
		if err := a.streamLog(ctx, &agentv1.LogRequest{Uid: neverRan, Stream: "stdout"}, c.send); err != nil {
			t.Fatal(err)
		}
		if c.data() != "" || !c.chunks[len(c.chunks)-1].GetEof() {
			t.Errorf("got %v, want an empty log", c.chunks)
		}
	})
}
