package hub

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// uids lists the work items of a Dispatch envelope, item then more.
func uids(env *agentv1.Envelope) []string {
	var out []string
	for _, it := range protocol.DispatchItems(env.GetDispatch()) {
		out = append(out, it.GetUid())
	}
	return out
}

// TestGatherJoinsQueuedDispatches steps gather on what a session has
// queued: Dispatches at the revisions that follow the first one join it,
// within MaxDispatchBatch items and MaxEnvelopeBytes; anything else ends
// the envelope and is handed back to go next.
func TestGatherJoinsQueuedDispatches(t *testing.T) {
	const node = "n1"
	noop := func(uid string) *agentv1.WorkItem { return &agentv1.WorkItem{Uid: uid, Type: "noop"} }
	big := func(uid string) *agentv1.WorkItem {
		return &agentv1.WorkItem{Uid: uid, Type: "noop", Spec: []byte(strings.Repeat("x", 400<<10))}
	}
	cases := []struct {
		name string
		// queue fills the session's queue through h; after is queued once
		// the first envelope has been taken from it.
		queue, after func(t *testing.T, h *Hub, s *session)
		want         []string // the items of the envelope sent
		wantNext     string   // kind of the envelope handed back ("" none)
		wantLeft     int      // envelopes still queued
	}{
		{
			name:  "a lone dispatch goes as it is",
			queue: func(t *testing.T, h *Hub, _ *session) { dispatch(t, h, node, noop("a")) },
			want:  []string{"a"},
		},
		{
			name: "dispatches join until a cancel",
			queue: func(t *testing.T, h *Hub, _ *session) {
				dispatch(t, h, node, noop("a"), noop("b"), noop("c"))
				if err := h.Cancel(node, "a"); err != nil {
					t.Fatal(err)
				}
				dispatch(t, h, node, noop("d"))
			},
			want: []string{"a", "b", "c"}, wantNext: "KIND_CANCEL", wantLeft: 1,
		},
		{
			name: "a revision jump starts a new envelope",
			queue: func(t *testing.T, h *Hub, s *session) {
				for _, rev := range []uint64{1, 2, 4} {
					s.mu.Lock()
					err := s.pushLocked(protocol.NewDispatch(node, rev, noop(fmt.Sprint("r", rev))))
					s.mu.Unlock()
					if err != nil {
						t.Fatal(err)
					}
				}
			},
			want: []string{"r1", "r2"}, wantNext: "KIND_DISPATCH",
		},
		{
			name:  "at most MaxDispatchBatch items",
			queue: func(t *testing.T, h *Hub, _ *session) { dispatchN(t, h, node, "m", 0, sendQueue) },
			after: func(t *testing.T, h *Hub, _ *session) { dispatchN(t, h, node, "m", sendQueue, 1) },
			want: func() []string {
				var out []string
				for i := range protocol.MaxDispatchBatch {
					out = append(out, fmt.Sprint("m", i))
				}
				return out
			}(),
			wantLeft: sendQueue + 1 - protocol.MaxDispatchBatch,
		},
		{
			name:  "within the envelope size limit",
			queue: func(t *testing.T, h *Hub, _ *session) { dispatch(t, h, node, big("b1"), big("b2"), big("b3")) },
			want:  []string{"b1", "b2"}, wantNext: "KIND_DISPATCH",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, s := bareHub(node)
			tc.queue(t, h, s)
			first := <-s.out
			if tc.after != nil {
				tc.after(t, h, s)
			}
			queued := h.Pending(node)
			sent, next := s.gather(first)
			if got := uids(sent); !slices.Equal(got, tc.want) {
				t.Fatalf("sent items %v, want %v", got, tc.want)
			}
			if sent.GetId() != first.GetId() || sent.GetRevision() != first.GetRevision() {
				t.Errorf("sent id %s revision %d, want the first envelope's %s, %d", sent.GetId(), sent.GetRevision(), first.GetId(), first.GetRevision())
			}
			if err := protocol.Validate(sent); err != nil {
				t.Errorf("sent envelope: %v", err)
			}
			if n := proto.Size(sent); n > protocol.MaxEnvelopeBytes {
				t.Errorf("sent envelope is %d bytes, more than %d", n, protocol.MaxEnvelopeBytes)
			}
			if got := next.GetKind().String(); tc.wantNext == "" && next != nil || tc.wantNext != "" && got != tc.wantNext {
				t.Errorf("handed back %v, want %q", next, tc.wantNext)
			}
			if n := len(s.out); n != tc.wantLeft {
				t.Errorf("%d envelopes left in the queue, want %d", n, tc.wantLeft)
			}
			// The joined envelopes stay pending until the one sent is acked,
			// which settles them all and nothing else.
			if n := h.Pending(node); n != queued {
				t.Errorf("%d pending after gather, want %d", n, queued)
			}
			s.ack(sent.GetId())
			if n := h.Pending(node); n != queued-len(tc.want) {
				t.Errorf("%d pending after the ack, want %d", n, queued-len(tc.want))
			}
			if len(s.batches) != 0 {
				t.Errorf("batches %v left after the ack", s.batches)
			}
		})
	}
}

func dispatch(t *testing.T, h *Hub, node string, items ...*agentv1.WorkItem) {
	t.Helper()
	for _, it := range items {
		if err := h.Dispatch(node, it); err != nil {
			t.Fatal(err)
		}
	}
}

func dispatchN(t *testing.T, h *Hub, node, prefix string, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		dispatch(t, h, node, &agentv1.WorkItem{Uid: fmt.Sprint(prefix, i), Type: "noop"})
	}
}

// TestAckedSnapshotSettlesABatch: an agent that saw a gap before a batched
// Dispatch never acks it; acking the snapshot that followed settles every
// envelope the batch joined.
func TestAckedSnapshotSettlesABatch(t *testing.T) {
	const node = "n1"
	h, s := bareHub(node)
	dispatchN(t, h, node, "w", 0, 3)
	sent, next := s.gather(<-s.out)
	if len(uids(sent)) != 3 || next != nil {
		t.Fatalf("gather sent %v and handed back %v, want 3 items and nothing", uids(sent), next)
	}
	if err := h.sendSnapshot(t.Context(), s, 0); err != nil {
		t.Fatal(err)
	}
	dispatchN(t, h, node, "after", 0, 1)
	snap := <-s.out
	s.ack(snap.GetId())
	if n := h.Pending(node); n != 1 {
		t.Fatalf("%d pending after the snapshot's ack, want 1 (the dispatch after it)", n)
	}
	if len(s.batches) != 0 {
		t.Errorf("batches %v left after the snapshot's ack", s.batches)
	}
	s.ack(sent.GetId()) // a late ack of the batch changes nothing
	if n := h.Pending(node); n != 1 {
		t.Fatalf("%d pending after a late ack of the batch, want 1", n)
	}
}

// TestStreamBatchesOnlyForAgentsThatNameTheFeature runs ServeSession with a
// send that holds the stream while dispatches queue behind it: an agent
// that named FeatureDispatchBatch gets them in one envelope, one that did
// not (an older agent, which would drop Dispatch.more) gets one each.
func TestStreamBatchesOnlyForAgentsThatNameTheFeature(t *testing.T) {
	f := newFixture(t, "hub-dispatch-batch")
	h := f.startHub(Options{Name: "hub-dispatch-batch"})
	cases := []struct {
		name     string
		features []string
		want     []string // per envelope after the snapshot: its kind and items
	}{
		{"the agent names the feature", []string{"something-newer", protocol.FeatureDispatchBatch},
			[]string{"DISPATCH a b c", "CANCEL", "DISPATCH d"}},
		{"the agent does not", nil,
			[]string{"DISPATCH a", "DISPATCH b", "DISPATCH c", "CANCEL", "DISPATCH d"}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			node := fmt.Sprint("batch-node-", i)
			f.registerRaw(h, node)
			ctx, cancel := context.WithCancel(context.Background())
			sent := make(chan *agentv1.Envelope)
			gate := make(chan struct{})
			done := make(chan error, 1)
			go func() {
				done <- h.ServeSession(ctx, node, &agentv1.GetMessageRequest{Features: tc.features}, func(env *agentv1.Envelope) error {
					select {
					case sent <- env:
					case <-ctx.Done():
						return ctx.Err()
					}
					select {
					case <-gate:
						return nil
					case <-ctx.Done():
						return ctx.Err()
					}
				})
			}()
			t.Cleanup(func() { cancel(); <-done })
			recv := func() *agentv1.Envelope {
				t.Helper()
				select {
				case env := <-sent:
					return env
				case err := <-done:
					t.Fatalf("session ended: %v", err)
				case <-time.After(waitTimeout):
					t.Fatal("nothing sent")
				}
				return nil
			}
			if env := recv(); env.GetKind() != agentv1.Kind_KIND_NODE_CONFIGURATION {
				t.Fatalf("first envelope %v, want the node configuration", env.GetKind())
			}
			gate <- struct{}{}
			snap := recv()
			if snap.GetKind() != agentv1.Kind_KIND_SNAPSHOT {
				t.Fatalf("second envelope %v, want the snapshot", snap.GetKind())
			}
			// The stream is held in send: these queue behind the snapshot.
			dispatch(t, h.Hub, node, item("a", "noop", ""), item("b", "noop", ""), item("c", "noop", ""))
			if err := h.Cancel(node, "a"); err != nil {
				t.Fatal(err)
			}
			dispatch(t, h.Hub, node, item("d", "noop", ""))
			gate <- struct{}{}
			var got []string
			var envs []*agentv1.Envelope
			for len(got) < len(tc.want) {
				env := recv()
				gate <- struct{}{}
				desc := strings.TrimPrefix(env.GetKind().String(), "KIND_")
				if env.GetDispatch() != nil {
					desc += " " + strings.Join(uids(env), " ")
				}
				got = append(got, desc)
				envs = append(envs, env)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("sent %q, want %q", got, tc.want)
			}
			for j := 1; j < len(envs); j++ {
				if want := envs[j-1].GetRevision() + uint64(max(1, len(uids(envs[j-1])))); envs[j].GetRevision() != want {
					t.Errorf("envelope %d at revision %d, want %d", j, envs[j].GetRevision(), want)
				}
			}
			// The agent's acks of what was sent settle everything.
			for _, env := range append(envs, snap) {
				if _, err := h.HandleMessage(ctx, node, protocol.NewAck(node, env.GetId())); err != nil {
					t.Fatal(err)
				}
			}
			if n := h.Pending(node); n != 0 {
				t.Errorf("%d pending after every envelope sent was acked", n)
			}
		})
	}
}
