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

	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/store"
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

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
