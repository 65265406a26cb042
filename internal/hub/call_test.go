package hub

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// streamEnvelopes opens node's stream with a raw client and returns what the
// hub sends on it, until the test ends.
func streamEnvelopes(t *testing.T, h *runningHub, c agentv1.AgentHubClient, node string) <-chan *agentv1.Envelope {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := c.GetMessage(ctx, &agentv1.GetMessageRequest{})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	out := make(chan *agentv1.Envelope, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			env, err := stream.Recv()
			if err != nil {
				return
			}
			select {
			case out <- env:
			case <-ctx.Done():
				return
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	waitConnected(t, h, node)
	return out
}

// nextOfKind returns the next envelope of kind from envs, skipping others.
func nextOfKind(t *testing.T, envs <-chan *agentv1.Envelope, kind agentv1.Kind) *agentv1.Envelope {
	t.Helper()
	timer := time.NewTimer(waitTimeout)
	defer timer.Stop()
	for {
		select {
		case env := <-envs:
			if env.GetKind() == kind {
				return env
			}
		case <-timer.C:
			t.Fatalf("no %v envelope within %s", kind, waitTimeout)
			return nil
		}
	}
}

// callResult is what a Call running in the background returned.
type callResult struct {
	st  *agentv1.WorkStatus
	err error
}

// waiting reports how many Calls wait for uid from node.
func (h *Hub) waiting(node, uid string) int {
	h.calls.mu.Lock()
	defer h.calls.mu.Unlock()
	return len(h.calls.waiting[callKey{node, uid}])
}

// TestCallWaitsForTheNodesAnswer: Call returns the first report of its
// uid from its node that done accepts; reports it does not accept, and
// reports of the same uid from another node, leave it waiting; the
// accepted report reaches the feature too, before Call returns.
func TestCallWaitsForTheNodesAnswer(t *testing.T) {
	f := newFixture(t, "hub-call")
	snk := &sink{}
	feat := &testFeature{name: "session", prefix: "sess-", sink: snk}
	h := f.startHub(Options{Name: "hub-call", Features: []Feature{feat}})
	const node, other = "call-node", "call-other"
	c := f.registerRaw(h, node).client(t, h.addr, false)
	oc := f.registerRaw(h, other).client(t, h.addr, false)
	envs := streamEnvelopes(t, h, c, node)
	openStream(t, h, oc, other, 0)

	const uid = "sess-1"
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	res := make(chan callResult, 1)
	go func() {
		st, err := feat.attached().Call(ctx, node, &agentv1.WorkItem{Uid: uid, Type: "noop"}, func(st *agentv1.WorkStatus) bool {
			return st.GetPhase() == "Open"
		})
		res <- callResult{st, err}
	}()
	d := nextOfKind(t, envs, agentv1.Kind_KIND_DISPATCH)
	if got := d.GetDispatch().GetItem().GetUid(); got != uid {
		t.Fatalf("node got a Dispatch of %s, want %s", got, uid)
	}

	// Each SendMessage delivers its report before it answers: after it,
	// the Call has seen the report.
	steps := []struct {
		name   string
		client agentv1.AgentHubClient
		env    *agentv1.Envelope
	}{
		{"another node's answer", oc, protocol.NewStatus(other, 1, &agentv1.WorkStatus{Uid: uid, Phase: "Open"})},
		{"a report done does not accept", c, protocol.NewStatus(node, 1, &agentv1.WorkStatus{Uid: uid, Phase: "Pending"})},
		{"the answer for another uid", c, protocol.NewStatus(node, 2, &agentv1.WorkStatus{Uid: "sess-2", Phase: "Open"})},
	}
	for _, s := range steps {
		if _, err := send(t, s.client, s.env); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if n := h.waiting(node, uid); n != 1 {
			t.Fatalf("after %s: %d Calls waiting, want the Call still waiting", s.name, n)
		}
	}
	if _, err := send(t, c, protocol.NewStatus(node, 3, &agentv1.WorkStatus{Uid: uid, Phase: "Open", Message: "port 7001"})); err != nil {
		t.Fatal(err)
	}
	var r callResult
	select {
	case r = <-res:
	case <-time.After(waitTimeout):
		t.Fatalf("Call did not return within %s of its answer", waitTimeout)
	}
	if r.err != nil || r.st.GetPhase() != "Open" || r.st.GetMessage() != "port 7001" {
		t.Fatalf("Call = %v, %v; want the node's Open report", r.st, r.err)
	}
	// The feature had the answer before Call returned.
	if got := snk.statuses(node, uid); len(got) != 2 || got[1].GetPhase() != "Open" {
		t.Errorf("the feature got %v from %s, want Pending then Open", got, node)
	}
	if got := snk.statuses(other, uid); len(got) != 1 {
		t.Errorf("the feature got %d reports of %s from %s, want its one report (a Call does not swallow reports)", len(got), uid, other)
	}
	if n := h.waiting(node, uid); n != 0 {
		t.Errorf("%d Calls still waiting after the answer", n)
	}
}

// TestCallAnsweredByANodeState: after a gap in its reports an agent sends
// its whole state, which answers a Call as well.
func TestCallAnsweredByANodeState(t *testing.T) {
	f := newFixture(t, "hub-call-state")
	feat := &testFeature{name: "session", prefix: "sess-"}
	h := f.startHub(Options{Name: "hub-call-state", Features: []Feature{feat}})
	const node = "call-state-node"
	c := f.registerRaw(h, node).client(t, h.addr, false)
	envs := streamEnvelopes(t, h, c, node)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	res := make(chan callResult, 1)
	go func() {
		st, err := feat.attached().Call(ctx, node, &agentv1.WorkItem{Uid: "sess-1", Type: "noop"}, nil)
		res <- callResult{st, err}
	}()
	nextOfKind(t, envs, agentv1.Kind_KIND_DISPATCH)
	if _, err := send(t, c, protocol.NewNodeState(node, 5, nil, []*agentv1.WorkStatus{{Uid: "sess-0", Phase: "Done"}, {Uid: "sess-1", Phase: "Open"}})); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-res:
		if r.err != nil || r.st.GetUid() != "sess-1" || r.st.GetPhase() != "Open" {
			t.Fatalf("Call = %v, %v; want sess-1's entry of the NodeState", r.st, r.err)
		}
	case <-time.After(waitTimeout):
		t.Fatalf("Call did not return within %s of the NodeState", waitTimeout)
	}
}

// TestCallFails: a Call to a node without a stream fails at once, and a
// Call nobody answers fails when its context ends; neither leaves a waiter.
func TestCallFails(t *testing.T) {
	f := newFixture(t, "hub-call-fails")
	feat := &testFeature{name: "session", prefix: "sess-"}
	h := f.startHub(Options{Name: "hub-call-fails", Features: []Feature{feat}})
	const node = "call-silent-node"
	c := f.registerRaw(h, node).client(t, h.addr, false)
	openStream(t, h, c, node, 0)

	t.Run("a node without a stream", func(t *testing.T) {
		// No deadline: it must not wait at all.
		_, err := feat.attached().Call(context.Background(), "call-nowhere", &agentv1.WorkItem{Uid: "sess-1", Type: "noop"}, nil)
		if !errors.Is(err, ErrNotConnected) {
			t.Fatalf("Call = %v, want ErrNotConnected", err)
		}
		if n := h.waiting("call-nowhere", "sess-1"); n != 0 {
			t.Errorf("%d Calls left waiting", n)
		}
	})
	t.Run("no answer before the deadline", func(t *testing.T) {
		// The agent never answers: the deadline's length does not matter.
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err := feat.attached().Call(ctx, node, &agentv1.WorkItem{Uid: "sess-2", Type: "noop"}, nil)
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), node) {
			t.Fatalf("Call = %v, want a DeadlineExceeded error naming the node", err)
		}
		if n := h.waiting(node, "sess-2"); n != 0 {
			t.Errorf("%d Calls left waiting", n)
		}
	})
}

// TestUnroutedReportsAreCounted: through a real hub, a report of a uid no
// feature owns is accepted from the agent (it cannot do better), reaches no
// feature, and is counted.
func TestUnroutedReportsAreCounted(t *testing.T) {
	f := newFixture(t, "hub-unrouted")
	snk := &sink{}
	h := f.startHub(Options{Name: "hub-unrouted", Features: []Feature{&testFeature{name: "mine", prefix: "mine-", sink: snk}}})
	const node = "unrouted-node"
	c := f.registerRaw(h, node).client(t, h.addr, false)
	openStream(t, h, c, node, 0)
	resp, err := send(t, c, protocol.NewStatuses(node, 1, []*agentv1.WorkStatus{{Uid: "mine-1", Phase: "Succeeded"}, {Uid: "stray-1", Phase: "Succeeded"}}))
	if err != nil || resp.GetDuplicate() || resp.GetFullSyncRequired() {
		t.Fatalf("SendMessage = %v, %v; want the reports accepted", resp, err)
	}
	if len(snk.statuses(node, "mine-1")) != 1 || len(snk.statuses(node, "stray-1")) != 0 {
		t.Errorf("the feature got %v of its own and %v of the stray uid, want its own report only", snk.statuses(node, "mine-1"), snk.statuses(node, "stray-1"))
	}
	if n := h.counter(t, "drover_hub_reports_unrouted_total"); n != 1 {
		t.Errorf("drover_hub_reports_unrouted_total = %v, want 1", n)
	}
}
