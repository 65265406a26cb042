package session

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// TestRefusalsUseNoRevision: the agent ignores a malformed envelope (never
// acking it) and drops its stream on an oversized one, so the Machine
// refuses them, says why, and the revision is not used up.
func TestRefusalsUseNoRevision(t *testing.T) {
	m := New(Config{Node: "n1"})
	big := make([]*agentv1.WorkItem, 0, 3)
	for i := range 3 {
		big = append(big, &agentv1.WorkItem{Uid: fmt.Sprint("w", i), Type: "noop", Spec: make([]byte, protocol.MaxSpecBytes)})
	}
	dispatch := func(it *agentv1.WorkItem) func() error {
		return func() error { _, _, err := m.Dispatch(it); return err }
	}
	for _, tc := range []struct {
		name string
		send func() error
		want string
	}{
		{"a dispatch without a uid", dispatch(&agentv1.WorkItem{Type: "noop"}), "uid"},
		{"a dispatch of a bad type", dispatch(&agentv1.WorkItem{Uid: "w", Type: "Not A Type"}), "type"},
		{"a dispatch of an oversized spec", dispatch(&agentv1.WorkItem{Uid: "w", Type: "noop", Spec: make([]byte, protocol.MaxSpecBytes+1)}), "spec"},
		{"a cancel without a uid", func() error { _, _, err := m.Cancel(""); return err }, "uid"},
		{"a snapshot over the envelope limit", func() error { _, err := m.EndSnapshot(m.BeginSnapshot(), big, 0); return err }, "envelope too large"},
		{"a log request without a stream", func() error {
			return m.Send(protocol.NewLogRequest("n1", &agentv1.LogRequest{RequestId: "r", Uid: "w"}))
		}, "stdout or stderr"},
	} {
		err := tc.send()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error about %q", tc.name, err, tc.want)
		}
	}
	if m.Queued() != 0 || m.Pending() != 0 || m.Revision() != 0 {
		t.Fatalf("%d queued, %d pending, revision %d after refusals", m.Queued(), m.Pending(), m.Revision())
	}
	if env, _, err := m.Dispatch(&agentv1.WorkItem{Uid: "ok", Type: "noop"}); err != nil || env.GetRevision() != 1 {
		t.Fatalf("the first valid dispatch: %v at revision %d, want revision 1", err, env.GetRevision())
	}
}

// TestClosedRefusesEverything: events on a closed Machine fail with
// ErrClosed, naming the reason, and queue nothing.
func TestClosedRefusesEverything(t *testing.T) {
	m := New(Config{Node: "n1"})
	m.Close("test")
	for name, err := range map[string]error{
		"dispatch": func() error { _, _, err := m.Dispatch(&agentv1.WorkItem{Uid: "w", Type: "noop"}); return err }(),
		"cancel":   func() error { _, _, err := m.Cancel("w"); return err }(),
		"snapshot": func() error { _, err := m.EndSnapshot(m.BeginSnapshot(), nil, 0); return err }(),
		"log":      m.Send(protocol.NewLogRequest("n1", &agentv1.LogRequest{RequestId: "r", Uid: "w", Stream: "stdout"})),
		"push":     m.Push(protocol.NewDispatch("n1", 1, &agentv1.WorkItem{Uid: "w", Type: "noop"})),
	} {
		if !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "stream closed: test") {
			t.Errorf("%s on a closed Machine: %v, want ErrClosed naming the reason", name, err)
		}
	}
	if a, _ := m.Next(); a != Closed || m.Queued() != 0 {
		t.Errorf("Next %v with %d queued, want closed and nothing queued", a, m.Queued())
	}
}

// TestBatchesKeepTheProtocol: every envelope Next sends from a burst of
// Dispatches is valid and within MaxEnvelopeBytes, and keeps the id and
// revision of the first envelope it joined.
func TestBatchesKeepTheProtocol(t *testing.T) {
	for _, spec := range []int{0, 100 << 10, 400 << 10, protocol.MaxSpecBytes} {
		t.Run(fmt.Sprint("spec ", spec), func(t *testing.T) {
			m := New(Config{Node: "n1", Batching: true, QueueLimit: 600, QueueBytesLimit: 600 * protocol.MaxEnvelopeBytes})
			var firsts []*agentv1.Envelope
			for i := range 600 {
				env, _, err := m.Dispatch(&agentv1.WorkItem{Uid: fmt.Sprint("w", i), Type: "noop", Spec: make([]byte, spec)})
				if err != nil {
					t.Fatal(err)
				}
				firsts = append(firsts, env)
			}
			sent := 0
			for {
				a, env := m.Next()
				if a != Send {
					break
				}
				if err := protocol.Validate(env); err != nil {
					t.Fatalf("sent envelope: %v", err)
				}
				if n := proto.Size(env); n > protocol.MaxEnvelopeBytes {
					t.Fatalf("sent envelope is %d bytes, more than %d", n, protocol.MaxEnvelopeBytes)
				}
				if first := firsts[sent]; env.GetId() != first.GetId() || env.GetRevision() != first.GetRevision() {
					t.Fatalf("sent id %s revision %d, want the first joined envelope's %s, %d", env.GetId(), env.GetRevision(), first.GetId(), first.GetRevision())
				}
				sent += len(protocol.DispatchItems(env.GetDispatch()))
				m.Ack(env.GetId())
			}
			if sent != 600 || m.Pending() != 0 || len(m.batches) != 0 {
				t.Fatalf("sent %d items, %d pending, %d batches left; want 600, 0, 0", sent, m.Pending(), len(m.batches))
			}
		})
	}
}

// TestQueueIsBoundedInBytes: Dispatches that would take the queue past
// its byte limit are deferred to the resync snapshot like those meeting a
// full count, log requests are refused, and an empty queue still takes one
// envelope of any size.
func TestQueueIsBoundedInBytes(t *testing.T) {
	const spec = 100 << 10
	m := New(Config{Node: "n1", QueueBytesLimit: 3 * spec})
	big := func(i int) *agentv1.WorkItem {
		return &agentv1.WorkItem{Uid: fmt.Sprint("w", i), Type: "noop", Spec: make([]byte, spec)}
	}
	var outcomes []Outcome
	for i := range 5 {
		_, o, err := m.Dispatch(big(i))
		if err != nil {
			t.Fatal(err)
		}
		outcomes = append(outcomes, o)
	}
	if want := []Outcome{Queued, Queued, Deferred, Deferred, Deferred}; !slices.Equal(outcomes, want) {
		t.Fatalf("outcomes %v, want %v (two %d-byte envelopes fit in %d bytes)", outcomes, want, spec, 3*spec)
	}
	if m.QueuedBytes() <= 2*spec || m.QueuedBytes() > 3*spec {
		t.Fatalf("QueuedBytes = %d, want the two queued envelopes' size", m.QueuedBytes())
	}
	if err := m.Send(protocol.NewLogRequest("n1", &agentv1.LogRequest{RequestId: "r", Uid: "w", Stream: "stdout"})); err != nil {
		t.Fatalf("a small log request still fits: %v", err)
	}
	for range 3 {
		if a, _ := m.Next(); a != Send {
			t.Fatalf("Next = %v, want send", a)
		}
	}
	if m.QueuedBytes() != 0 {
		t.Fatalf("QueuedBytes = %d after draining, want 0", m.QueuedBytes())
	}
	if a, _ := m.Next(); a != Resync {
		t.Fatalf("Next = %v after draining, want resync", a)
	}

	one := New(Config{Node: "n1", QueueBytesLimit: 10})
	if _, o, err := one.Dispatch(big(0)); err != nil || o != Queued {
		t.Fatalf("an empty queue takes one envelope over the byte limit: %v, %v", o, err)
	}
}

// TestSeenIsBounded: the last SeenLimit ids are remembered, whatever their
// form, and no more.
func TestSeenIsBounded(t *testing.T) {
	const limit = 5
	m := New(Config{Node: "n1", SeenLimit: limit})
	id := func(i int) string {
		if i%3 == 0 {
			return fmt.Sprint("other-", i)
		}
		return fmt.Sprintf("%032x", i)
	}
	for i := range 50 {
		if !m.Received(id(i)) {
			t.Fatalf("id %d is new but Received says duplicate", i)
		}
		for j := max(0, i-limit+1); j <= i; j++ {
			if m.Received(id(j)) {
				t.Fatalf("after id %d: id %d, among the last %d, was not remembered", i, j, limit)
			}
		}
		if len(m.seen.ring) > limit || len(m.seen.other) > limit {
			t.Fatalf("seen holds %d ids and %d others, more than %d", len(m.seen.ring), len(m.seen.other), limit)
		}
	}
	if !m.Received(id(40)) {
		t.Error("an id older than the last 5 is still remembered")
	}
}

// TestIdleMachineHoldsNoQueue: once everything was sent and acked, a
// Machine holds no queue, no pending map, no batches and no recent list:
// what an idle stream costs is its fixed fields and the ids it remembers.
func TestIdleMachineHoldsNoQueue(t *testing.T) {
	m := New(Config{Node: "n1", Batching: true})
	m.EndSnapshot(m.BeginSnapshot(), nil, 0)
	for i := range 300 {
		if _, _, err := m.Dispatch(&agentv1.WorkItem{Uid: fmt.Sprint("w", i), Type: "noop"}); err != nil {
			t.Fatal(err)
		}
	}
	for {
		a, env := m.Next()
		if a == Resync {
			m.EndSnapshot(m.BeginSnapshot(), nil, 0)
			continue
		}
		if a != Send {
			break
		}
		m.Ack(env.GetId())
	}
	if m.queue != nil || m.pending != nil || m.batches != nil || m.recent != nil || m.snap != nil {
		t.Errorf("idle Machine holds queue %d, pending %v, batches %v, recent %d, snap %v",
			cap(m.queue), m.pending, m.batches, cap(m.recent), m.snap)
	}
}
