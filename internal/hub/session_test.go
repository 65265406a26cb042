package hub

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	hubsession "github.com/drover-fleet/drover/internal/hub/session"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// sendQueue is how many envelopes a session queues before it resyncs.
const sendQueue = hubsession.DefaultQueueLimit

// bareHub is a Hub with a session for node and nothing else: no API, no
// network. For tests of how the hub drives a session; the session's rules
// are tested in internal/hub/session from scripts.
func bareHub(node string) (*Hub, *session) {
	h := &Hub{opts: Options{Name: "bare"}, router: &router{}, log: slog.New(slog.DiscardHandler), metrics: newMetrics(nil), sessions: map[string]*session{}}
	s := newSession(Peer{Node: node}, 0, 0, nil)
	h.sessions[node] = s
	return h, s
}

// next is what the stream does next, as ServeSession asks it.
func (s *session) next() (hubsession.Action, *agentv1.Envelope) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Next()
}

// pop takes the envelope the stream sends next.
func (s *session) pop(t *testing.T) *agentv1.Envelope {
	t.Helper()
	a, env := s.next()
	if a != hubsession.Send {
		t.Fatalf("the stream would %v, want it to send", a)
	}
	return env
}

// queued is how many envelopes wait for the stream.
func (s *session) queued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Queued()
}

// ack settles id as the agent's ack of it does.
func (s *session) ack(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m.Ack(id)
}

func (s *session) reason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Reason()
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
		if n := s.queued(); n != senders*each {
			t.Fatalf("round %d: %d envelopes queued, want %d", round, n, senders*each)
		}
		for i := range senders * each {
			if env := s.pop(t); env.GetRevision() != uint64(i+1) {
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
		env := s.pop(t)
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
		if env := s.pop(t); env.GetKind() == agentv1.Kind_KIND_SNAPSHOT {
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
	if env := s.pop(t); len(env.GetSnapshot().GetItems()) != 0 {
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
	if s.queued() != 0 || h.Pending(node) != 0 {
		t.Fatalf("%d queued, %d pending after refusals", s.queued(), h.Pending(node))
	}
	if err := h.Dispatch(node, &agentv1.WorkItem{Uid: "ok", Type: "noop"}); err != nil {
		t.Fatal(err)
	}
	if env := s.pop(t); env.GetRevision() != 1 {
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
	s := newSession(Peer{Node: node}, have, 0, nil) // the agent applied revision 10 before
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
		env := s.pop(t)
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
	// That nothing is kept for it after the snapshot is checked in
	// internal/hub/session's testdata/snapshot.txt.
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
	s.pop(t)
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
	if r := s.reason(); r != "" {
		t.Fatalf("session closed: %s", r)
	}
	if n := s.queued(); n != sendQueue {
		t.Fatalf("queue holds %d, want %d", n, sendQueue)
	}
	// No resync before the queue drained: the stream sends what it holds.
	for range sendQueue {
		s.pop(t)
	}
	if a, _ := s.next(); a != hubsession.Resync {
		t.Fatalf("the stream would %v after the queue drained, want a resync", a)
	}
	if err := h.sendSnapshot(t.Context(), s, 0); err != nil {
		t.Fatal(err)
	}
	snap := s.pop(t)
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
	if a, _ := s.next(); a != hubsession.Idle {
		t.Errorf("the stream would %v after the resync snapshot, want it idle", a)
	}
	// The queue takes envelopes again.
	if err := h.Dispatch(node, &agentv1.WorkItem{Uid: "after", Type: "noop"}); err != nil {
		t.Fatal(err)
	}
	if env := s.pop(t); env.GetDispatch().GetItem().GetUid() != "after" {
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
	if r := s.reason(); r != "" {
		t.Fatalf("session closed: %s", r)
	}
	snap := s.pop(t)
	if snap.GetKind() != agentv1.Kind_KIND_SNAPSHOT {
		t.Fatalf("the stream sends %v first, want the snapshot waiting ahead of the full queue", snap.GetKind())
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
