package hub

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// grants is which node each uid was given to, as a feature would know it.
type grants struct {
	mu sync.Mutex
	to map[string]string // uid → node
}

func (g *grants) give(uid, node string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.to == nil {
		g.to = map[string]string{}
	}
	g.to[uid] = node
}

func (g *grants) has(node, uid string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.to[uid] == node
}

// TestForeignReportsAreDropped: a node is trusted with its own work only.
// Through a real hub, reports (and NodeState entries) of work given to
// another node, or to no node, reach neither the feature nor a Call; each
// is counted by feature and logged once per node and uid; the node's own
// reports still go through.
func TestForeignReportsAreDropped(t *testing.T) {
	f := newFixture(t, "hub-foreign")
	snk := &sink{}
	var g grants
	g.give("job-1", "foreign-owner")
	feat := &testFeature{name: "job", prefix: "job-", sink: snk, assigned: g.has}
	h := f.startHub(Options{Name: "hub-foreign", Features: []Feature{feat}})
	const owner, forger = "foreign-owner", "foreign-forger"
	oc := f.registerRaw(h, owner).client(t, h.addr, false)
	fc := f.registerRaw(h, forger).client(t, h.addr, false)
	openStream(t, h, oc, owner, 0)
	openStream(t, h, fc, forger, 0)
	foreign := func() float64 { return h.counter(t, "drover_hub_reports_foreign_total", "job") }

	// Each SendMessage delivers (or drops) its reports before it answers.
	resp, err := send(t, fc, protocol.NewStatus(forger, 1, &agentv1.WorkStatus{Uid: "job-1", Phase: "Succeeded", Message: "forged"}))
	if err != nil || resp.GetDuplicate() || resp.GetFullSyncRequired() {
		t.Fatalf("SendMessage = %v, %v; want the envelope accepted (and its report dropped)", resp, err)
	}
	if got := snk.statuses(forger, "job-1"); len(got) != 0 {
		t.Errorf("the feature got %v from %s for another node's work", got, forger)
	}
	if n := foreign(); n != 1 {
		t.Errorf("drover_hub_reports_foreign_total{feature=job} = %v after one forged report, want 1", n)
	}

	// A NodeState: the other node's item and an item given to no one are
	// left out of what the feature gets (an empty part, which still
	// replaces what it knew of the forger); a uid nobody owns stays unrouted.
	if _, err := send(t, fc, protocol.NewNodeState(forger, 2, nil, []*agentv1.WorkStatus{
		{Uid: "job-1", Phase: "Succeeded"}, {Uid: "job-2", Phase: "Failed"}, {Uid: "stray-1", Phase: "Running"},
	})); err != nil {
		t.Fatal(err)
	}
	if st := snk.nodeStates(forger); len(st) != 1 || len(st[0].work) != 0 {
		t.Errorf("the feature got NodeStates %v from %s, want one, empty", st, forger)
	}
	if n := foreign(); n != 3 {
		t.Errorf("drover_hub_reports_foreign_total{feature=job} = %v after a NodeState with two foreign entries, want 3", n)
	}
	if n := h.counter(t, "drover_hub_reports_unrouted_total"); n != 1 {
		t.Errorf("drover_hub_reports_unrouted_total = %v, want 1 (the uid no feature owns)", n)
	}

	// The same forgery again is counted again but not logged again.
	if _, err := send(t, fc, protocol.NewStatus(forger, 3, &agentv1.WorkStatus{Uid: "job-1", Phase: "Failed"})); err != nil {
		t.Fatal(err)
	}
	if n := foreign(); n != 4 {
		t.Errorf("drover_hub_reports_foreign_total{feature=job} = %v after the forgery's repeat, want 4", n)
	}
	warned := 0
	for _, line := range strings.Split(f.logs.String(), "\n") {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, "node="+forger) && strings.Contains(line, "uid=job-1 ") {
			warned++
		}
	}
	if warned != 1 {
		t.Errorf("%d warnings of %s's reports of job-1, want one (once per node and uid)", warned, forger)
	}

	// The owner's own report goes through.
	if _, err := send(t, oc, protocol.NewStatus(owner, 1, &agentv1.WorkStatus{Uid: "job-1", Phase: "Succeeded", Message: "real"})); err != nil {
		t.Fatal(err)
	}
	if got := snk.statuses(owner, "job-1"); len(got) != 1 || got[0].GetMessage() != "real" {
		t.Errorf("the feature got %v from %s, want its own report", got, owner)
	}
	if n := foreign(); n != 4 {
		t.Errorf("drover_hub_reports_foreign_total{feature=job} = %v after the owner's own report, want still 4", n)
	}
}

// TestForeignReportSatisfiesNoCall: a Call waits for its node's report of
// its uid; a report of that uid the feature does not count as the node's
// leaves the Call waiting, and it returns once the feature does.
func TestForeignReportSatisfiesNoCall(t *testing.T) {
	f := newFixture(t, "hub-foreign-call")
	var g grants
	feat := &testFeature{name: "session", prefix: "sess-", assigned: g.has}
	h := f.startHub(Options{Name: "hub-foreign-call", Features: []Feature{feat}})
	const node = "foreign-call-node"
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
	// The feature has not recorded the item as the node's: its report is
	// not the node's to make.
	if _, err := send(t, c, protocol.NewStatus(node, 1, &agentv1.WorkStatus{Uid: "sess-1", Phase: "Open"})); err != nil {
		t.Fatal(err)
	}
	if n := h.waiting(node, "sess-1"); n != 1 {
		t.Fatalf("%d Calls waiting after a report not assigned to the node, want the Call still waiting", n)
	}
	if n := h.counter(t, "drover_hub_reports_foreign_total", "session"); n != 1 {
		t.Errorf("drover_hub_reports_foreign_total{feature=session} = %v, want 1", n)
	}
	g.give("sess-1", node)
	if _, err := send(t, c, protocol.NewNodeState(node, 2, nil, []*agentv1.WorkStatus{{Uid: "sess-1", Phase: "Open"}})); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-res:
		if r.err != nil || r.st.GetPhase() != "Open" {
			t.Fatalf("Call = %v, %v; want the node's Open", r.st, r.err)
		}
	case <-time.After(waitTimeout):
		t.Fatalf("Call did not return within %s of the node's own report", waitTimeout)
	}
}

// TestOnceSetIsBounded: the set of (node, uid) already warned of forgets
// its oldest keys past its size.
func TestOnceSetIsBounded(t *testing.T) {
	s := newOnceSet(2)
	a, b, c := callKey{"n", "a"}, callKey{"n", "b"}, callKey{"n", "c"}
	for _, step := range []struct {
		k     callKey
		first bool
	}{{a, true}, {a, false}, {b, true}, {c, true}, {b, false}, {c, false}, {a, true}, {b, true}} {
		if got := s.first(step.k); got != step.first {
			t.Fatalf("first(%v) = %v, want %v", step.k, got, step.first)
		}
	}
	if len(s.seen) != 2 || len(s.order) != 2 {
		t.Errorf("the set holds %d keys (%d in order), want at most 2", len(s.seen), len(s.order))
	}
}
