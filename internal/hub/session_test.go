package hub

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// bareHub is a Hub with a session for node and nothing else: no API, no
// network. For tests of the session bookkeeping alone.
func bareHub(node string) (*Hub, *session) {
	h := &Hub{opts: Options{Name: "bare"}, router: &router{}, log: slog.New(slog.DiscardHandler), metrics: newMetrics(nil), sessions: map[string]*session{}}
	s := newSession(node, 0, 0)
	h.sessions[node] = s
	return h, s
}

// TestSessionQueueIsInRevisionOrder: concurrent Dispatch and Cancel calls
// must queue their envelopes in the order of the revisions they took, or the
// agent sees a gap (and a needless full sync) where there is none.
func TestSessionQueueIsInRevisionOrder(t *testing.T) {
	const node, senders = "n1", 8
	const each = sendQueue / senders // all fit in the queue: no reader needed
	for round := range 50 {
		h, s := bareHub(node)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := range senders {
			wg.Go(func() {
				<-start
				for i := range each {
					uid := fmt.Sprintf("w-%d-%d", g, i)
					var err error
					if i%2 == 0 {
						err = h.Dispatch(node, &agentv1.WorkItem{Uid: uid, Type: "noop"})
					} else {
						err = h.Cancel(node, uid)
					}
					if err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		close(start)
		wg.Wait()
		if n := len(s.out); n != senders*each {
			t.Fatalf("round %d: %d envelopes queued, want %d", round, n, senders*each)
		}
		for i := range senders * each {
			if env := <-s.out; env.GetRevision() != uint64(i+1) {
				t.Fatalf("round %d: envelope %d on the stream has revision %d, want %d", round, i, env.GetRevision(), i+1)
			}
		}
		if n := h.Pending(node); n != senders*each {
			t.Fatalf("round %d: %d pending, want %d", round, n, senders*each)
		}
	}
}

// TestAckedSnapshotSettlesEarlierEnvelopes: an agent that saw a gap never
// acks the envelopes before the snapshot it asked for; acking the snapshot
// settles them, and nothing sent after it.
func TestAckedSnapshotSettlesEarlierEnvelopes(t *testing.T) {
	const node = "n1"
	h, s := bareHub(node)
	for i := range 3 {
		if err := h.Dispatch(node, &agentv1.WorkItem{Uid: fmt.Sprint("w", i), Type: "noop"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.sendSnapshot(t.Context(), s, 1); err != nil {
		t.Fatal(err)
	}
	if err := h.Dispatch(node, &agentv1.WorkItem{Uid: "after", Type: "noop"}); err != nil {
		t.Fatal(err)
	}
	var snap, first *agentv1.Envelope
	for range 5 {
		env := <-s.out
		switch {
		case env.GetKind() == agentv1.Kind_KIND_SNAPSHOT:
			snap = env
		case first == nil:
			first = env
		}
	}
	s.ack(first.GetId())
	if n := h.Pending(node); n != 4 {
		t.Fatalf("after acking one dispatch: %d pending, want 4", n)
	}
	s.ack(snap.GetId())
	if n := h.Pending(node); n != 1 {
		t.Fatalf("after acking the snapshot: %d pending, want 1 (the dispatch sent after it)", n)
	}
	s.ack(snap.GetId()) // acks may repeat
	if n := h.Pending(node); n != 1 {
		t.Fatalf("after a repeated ack: %d pending, want 1", n)
	}
}

// TestFirstSnapshotShowsWhatWasQueuedBeforeIt: Dispatch and Cancel may
// queue envelopes as soon as a session exists, before its first snapshot
// is built; the snapshot follows them on the stream, so it must show them,
// or the agent cancels what it was just sent.
func TestFirstSnapshotShowsWhatWasQueuedBeforeIt(t *testing.T) {
	const node = "n1"
	h, s := bareHub(node)
	for _, uid := range []string{"kept", "dropped"} {
		if err := h.Dispatch(node, &agentv1.WorkItem{Uid: uid, Type: "noop"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.Cancel(node, "dropped"); err != nil {
		t.Fatal(err)
	}
	if err := h.sendSnapshot(t.Context(), s, 0); err != nil {
		t.Fatal(err)
	}
	var snap *agentv1.Envelope
	for range 4 {
		if env := <-s.out; env.GetKind() == agentv1.Kind_KIND_SNAPSHOT {
			snap = env
		}
	}
	var uids []string
	for _, it := range snap.GetSnapshot().GetItems() {
		uids = append(uids, it.GetUid())
	}
	if !slices.Equal(uids, []string{"kept"}) {
		t.Errorf("first snapshot holds %v, want [kept]", uids)
	}
	// A later snapshot goes by the WorkSource again (here: nothing).
	if err := h.sendSnapshot(t.Context(), s, 0); err != nil {
		t.Fatal(err)
	}
	if env := <-s.out; len(env.GetSnapshot().GetItems()) != 0 {
		t.Errorf("second snapshot holds %v, want nothing", env.GetSnapshot().GetItems())
	}
}

// TestClosedSessionRefusesSends: Dispatch on a stream that is closing fails
// instead of queuing what will never be sent.
func TestClosedSessionRefusesSends(t *testing.T) {
	const node = "n1"
	h, s := bareHub(node)
	s.close("test")
	for range 100 {
		if err := h.Dispatch(node, &agentv1.WorkItem{Uid: "w", Type: "noop"}); err == nil {
			t.Fatal("Dispatch on a closed stream succeeded")
		}
	}
}

// TestSendsBreakingTheProtocolAreRefused: the agent ignores a malformed
// envelope (never acking it) and drops its stream on an oversized one, so
// the hub refuses to queue them and says why; the revision is not used up.
func TestSendsBreakingTheProtocolAreRefused(t *testing.T) {
	const node = "n1"
	h, s := bareHub(node)
	big := make([]*agentv1.WorkItem, 0, 3)
	for i := range 3 {
		big = append(big, &agentv1.WorkItem{Uid: fmt.Sprint("w", i), Type: "noop", Spec: make([]byte, protocol.MaxSpecBytes)})
	}
	h.router = &router{features: feature(&works{items: map[string][]*agentv1.WorkItem{node: big}}, nil)}
	for _, tc := range []struct {
		name string
		send func() error
		want string
	}{
		{"a dispatch without a uid", func() error { return h.Dispatch(node, &agentv1.WorkItem{Type: "noop"}) }, "uid"},
		{"a dispatch of a bad type", func() error { return h.Dispatch(node, &agentv1.WorkItem{Uid: "w", Type: "Not A Type"}) }, "type"},
		{"a dispatch of an oversized spec", func() error {
			return h.Dispatch(node, &agentv1.WorkItem{Uid: "w", Type: "noop", Spec: make([]byte, protocol.MaxSpecBytes+1)})
		}, "spec"},
		{"a cancel without a uid", func() error { return h.Cancel(node, "") }, "uid"},
		{"a snapshot over the envelope limit", func() error { return h.sendSnapshot(t.Context(), s, 0) }, "envelope too large"},
	} {
		err := tc.send()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error about %q", tc.name, err, tc.want)
		}
	}
	if len(s.out) != 0 || h.Pending(node) != 0 {
		t.Fatalf("%d queued, %d pending after refusals", len(s.out), h.Pending(node))
	}
	if err := h.Dispatch(node, &agentv1.WorkItem{Uid: "ok", Type: "noop"}); err != nil {
		t.Fatal(err)
	}
	if env := <-s.out; env.GetRevision() != 1 {
		t.Fatalf("the first valid dispatch has revision %d, want 1", env.GetRevision())
	}
}

// gatedWorks is a WorkSource whose WorkFor waits for a signal, so that a
// test can dispatch while a snapshot is being built.
type gatedWorks struct {
	items   []*agentv1.WorkItem
	entered chan struct{}
	release chan struct{}
}

func (g *gatedWorks) WorkFor(ctx context.Context, _ string) ([]*agentv1.WorkItem, error) {
	close(g.entered)
	<-g.release
	return g.items, nil
}

// TestSnapshotShowsWhatWasSentWhileItWasBuilt: a Dispatch or Cancel queued
// while WorkFor runs comes before the snapshot on the stream; the snapshot
// must agree with it, or the agent cancels the item it just got (or revives
// the one just cancelled).
func TestSnapshotShowsWhatWasSentWhileItWasBuilt(t *testing.T) {
	const node, have = "n1", 10
	h, _ := bareHub(node)
	s := newSession(node, have, 0) // the agent applied revision 10 before
	h.sessions[node] = s
	listed := []*agentv1.WorkItem{{Uid: "kept", Type: "noop"}, {Uid: "cancelled", Type: "noop"}}
	g := &gatedWorks{items: listed, entered: make(chan struct{}), release: make(chan struct{})}
	h.router = &router{features: feature(g, nil)}

	done := make(chan error, 1)
	go func() { done <- h.sendSnapshot(t.Context(), s, have) }()
	<-g.entered
	if err := h.Dispatch(node, &agentv1.WorkItem{Uid: "new", Type: "noop"}); err != nil {
		t.Fatal(err)
	}
	if err := h.Cancel(node, "cancelled"); err != nil {
		t.Fatal(err)
	}
	close(g.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	var got []string
	for range 3 {
		env := <-s.out
		desc := fmt.Sprintf("%s@%d", strings.TrimPrefix(env.GetKind().String(), "KIND_"), env.GetRevision())
		if snap := env.GetSnapshot(); snap != nil {
			var uids []string
			for _, it := range snap.GetItems() {
				uids = append(uids, it.GetUid())
			}
			desc += "[" + strings.Join(uids, ",") + "]"
		}
		got = append(got, desc)
	}
	// Revisions continue from what the agent holds: nothing looks stale.
	want := []string{"DISPATCH@11", "CANCEL@12", "SNAPSHOT@13[kept,new]"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("stream %v, want %v", got, want)
	}
	if len(listed) != 2 || listed[1].GetUid() != "cancelled" {
		t.Fatal("the snapshot changed the WorkSource's slice")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.snapshotting != 0 || s.recent != nil {
		t.Fatalf("snapshotting %d, %d recent envelopes kept after the snapshot", s.snapshotting, len(s.recent))
	}
}

// TestFullQueueResyncsWithASnapshot: a burst longer than the send queue
// does not close the stream. What did not fit is not queued; once the queue
// has drained the stream sends a snapshot that carries it, Cancels applied.
func TestFullQueueResyncsWithASnapshot(t *testing.T) {
	const node = "n1"
	h, s := bareHub(node)
	if err := h.sendSnapshot(t.Context(), s, 0); err != nil { // the session's first
		t.Fatal(err)
	}
	<-s.out
	for i := range sendQueue {
		if err := h.Dispatch(node, &agentv1.WorkItem{Uid: fmt.Sprintf("fit-%d", i), Type: "noop"}); err != nil {
			t.Fatalf("dispatch %d: %v", i, err)
		}
	}
	for i := range 5 {
		if err := h.Dispatch(node, &agentv1.WorkItem{Uid: fmt.Sprintf("over-%d", i), Type: "noop"}); err != nil {
			t.Fatalf("dispatch over-%d to a full queue: %v", i, err)
		}
	}
	if err := h.Cancel(node, "over-1"); err != nil {
		t.Fatal(err)
	}
	if s.reason != "" {
		t.Fatalf("session closed: %s", s.reason)
	}
	if n := len(s.out); n != sendQueue {
		t.Fatalf("queue holds %d, want %d", n, sendQueue)
	}
	if s.needsResync() {
		t.Fatal("resync due before the queue drained")
	}
	for range sendQueue {
		<-s.out
	}
	if !s.needsResync() {
		t.Fatal("no resync due after the queue drained")
	}
	if err := h.sendSnapshot(t.Context(), s, 0); err != nil {
		t.Fatal(err)
	}
	snap := <-s.out
	var uids []string
	for _, it := range snap.GetSnapshot().GetItems() {
		uids = append(uids, it.GetUid())
	}
	if want := []string{"over-0", "over-2", "over-3", "over-4"}; !slices.Equal(uids, want) {
		t.Errorf("resync snapshot holds %v, want %v", uids, want)
	}
	if snap.GetRevision() != uint64(1+sendQueue+6+1) {
		t.Errorf("resync snapshot at revision %d, want %d (after every revision taken)", snap.GetRevision(), 1+sendQueue+6+1)
	}
	if s.needsResync() {
		t.Error("resync still due after its snapshot")
	}
	// The queue takes envelopes again.
	if err := h.Dispatch(node, &agentv1.WorkItem{Uid: "after", Type: "noop"}); err != nil {
		t.Fatal(err)
	}
	if env := <-s.out; env.GetDispatch().GetItem().GetUid() != "after" {
		t.Errorf("next envelope %v, want the Dispatch of after", env)
	}
}

// TestFirstSnapshotAfterABurst: Dispatches that fill the queue before the
// session's first snapshot is built do not close the stream: the snapshot,
// which carries them all, goes ahead of the queue.
func TestFirstSnapshotAfterABurst(t *testing.T) {
	const node = "n1"
	h, s := bareHub(node)
	for i := range sendQueue + 5 {
		if err := h.Dispatch(node, &agentv1.WorkItem{Uid: fmt.Sprintf("b-%d", i), Type: "noop"}); err != nil {
			t.Fatalf("dispatch %d: %v", i, err)
		}
	}
	if err := h.sendSnapshot(t.Context(), s, 0); err != nil {
		t.Fatalf("first snapshot after a burst: %v", err)
	}
	if s.reason != "" {
		t.Fatalf("session closed: %s", s.reason)
	}
	snap := s.takeSnap()
	if snap == nil {
		t.Fatal("no snapshot waiting ahead of the full queue")
	}
	if n := len(snap.GetSnapshot().GetItems()); n != sendQueue+5 {
		t.Errorf("snapshot holds %d items, want %d", n, sendQueue+5)
	}
	if snap.GetRevision() <= uint64(sendQueue+5) {
		t.Errorf("snapshot at revision %d, not after the queued dispatches", snap.GetRevision())
	}
	// Its ack settles everything queued before it.
	s.ack(snap.GetId())
	if n := h.Pending(node); n != 0 {
		t.Errorf("%d envelopes pending after the snapshot's ack", n)
	}
}
