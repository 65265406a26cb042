package hub

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/agent"
	hubsession "github.com/drover-fleet/drover/internal/hub/session"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/testenv"
)

// agentOpts are the options of an in-process agent for node with a fresh
// state dir, registering with h, running "test" items with r.
func (f *fixture) agentOpts(node string, h *runningHub, r *runner) agent.Options {
	f.t.Helper()
	return agent.Options{
		Node:           node,
		Hubs:           []string{h.addr},
		BootstrapToken: f.token(),
		CAFile:         f.caFile(),
		StateDir:       f.t.TempDir(),
		Capacity:       map[string]string{"cpu": "1"},
		Runners:        map[string]agent.Runner{"test": r},
	}
}

func item(uid, typ, spec string) *agentv1.WorkItem {
	return &agentv1.WorkItem{Uid: uid, Type: typ, Spec: []byte(spec)}
}

// TestDispatchRunsOnceAndReportsStatus dispatches one item per case to a
// connected agent and follows it through the Runner back to the StatusSink.
func TestDispatchRunsOnceAndReportsStatus(t *testing.T) {
	f := newFixture(t, "hub-dispatch")
	snk := &sink{}
	h := f.startHub(Options{Name: "hub-dispatch", Features: feature(nil, snk)})
	r := newRunner()
	r.phase, r.reason = agent.PhaseSucceeded, "done"
	const node = "dispatch-node"
	f.startAgent(f.agentOpts(node, h, r))
	waitConnected(t, h, node)

	cases := []struct {
		name       string
		item       *agentv1.WorkItem
		wantPhase  string
		wantReason string // substring
		wantRuns   int
	}{
		{"a registered runner runs it", item("w-test", "test", `{"x":1}`), agent.PhaseSucceeded, "done", 1},
		{"the built-in noop runner", item("w-noop", "noop", `{}`), agent.PhaseSucceeded, "", 0},
		{"a type without a runner fails", item("w-none", "no-such-type", `{}`), agent.PhaseFailed, `no runner for work type "no-such-type"`, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := h.Dispatch(node, tc.item); err != nil {
				t.Fatal(err)
			}
			got := snk.waitStatus(t, node, tc.item.GetUid(), tc.wantPhase)
			if last := got[len(got)-1]; !strings.Contains(last.GetReason(), tc.wantReason) {
				t.Errorf("reason %q, want it to contain %q", last.GetReason(), tc.wantReason)
			}
			waitNoPending(t, h, node)
			if n := r.count(tc.item.GetUid()); n != tc.wantRuns {
				t.Errorf("runner ran %s %d times, want %d", tc.item.GetUid(), n, tc.wantRuns)
			}
			if tc.wantRuns > 0 {
				r.mu.Lock()
				spec := string(r.specs[tc.item.GetUid()])
				r.mu.Unlock()
				if spec != string(tc.item.GetSpec()) {
					t.Errorf("runner got spec %q, want %q", spec, tc.item.GetSpec())
				}
			}
			if len(got) != 1 {
				t.Errorf("sink got %d statuses for %s, want 1: %v", len(got), tc.item.GetUid(), got)
			}
		})
	}
	// Connecting reported the agent's state once, through the sink.
	if n := len(snk.nodeStates(node)); n < 1 {
		t.Errorf("sink got %d NodeStates, want at least the one sent on connect", n)
	}
}

// TestDispatchToADisconnectedNodeFails: the hub says so instead of dropping
// the item silently.
func TestDispatchToADisconnectedNodeFails(t *testing.T) {
	f := newFixture(t, "hub-dispatch-offline")
	h := f.startHub(Options{Name: "hub-offline"})
	err := h.Dispatch("never-connected", item("w1", "noop", ""))
	if err == nil || !strings.Contains(err.Error(), "not connected") {
		t.Fatalf("Dispatch to a node without a stream: %v, want a 'not connected' error", err)
	}
}

// TestWorkSurvivesReconnects breaks the agent's stream while an item is
// unacked or running and checks that the item still runs exactly once and
// its status reaches the sink exactly once. The hub's WorkSource lists the
// item, as a real dispatcher's would, so a new stream's snapshot re-sends it.
func TestWorkSurvivesReconnects(t *testing.T) {
	cases := []struct {
		name string
		// during breaks the stream after the dispatch; it returns the hub
		// the agent ends up on.
		during func(t *testing.T, f *fixture, h *runningHub, a *runningAgent, r *runner, restartHub func() *runningHub) *runningHub
		// uid's run is held until released; release happens in during or after it.
		gated bool
	}{
		{
			name:  "hub restarts while the item runs; it finishes after the reconnect",
			gated: true,
			during: func(t *testing.T, f *fixture, h *runningHub, a *runningAgent, r *runner, restartHub func() *runningHub) *runningHub {
				r.waitStarted(t, "w1")
				h.stop(t)
				h2 := restartHub()
				waitConnected(t, h2, a.opts.Node)
				close(r.gate)
				return h2
			},
		},
		{
			name:  "hub is down when the item finishes; the outbox delivers the status after the reconnect",
			gated: true,
			during: func(t *testing.T, f *fixture, h *runningHub, a *runningAgent, r *runner, restartHub func() *runningHub) *runningHub {
				r.waitStarted(t, "w1")
				h.stop(t)
				close(r.gate)
				return restartHub()
			},
		},
		{
			name: "hub restarts right after the dispatch, acked or not",
			during: func(t *testing.T, f *fixture, h *runningHub, a *runningAgent, r *runner, restartHub func() *runningHub) *runningHub {
				h.stop(t)
				return restartHub()
			},
		},
		{
			name: "agent restarts right after the dispatch, with the same state",
			during: func(t *testing.T, f *fixture, h *runningHub, a *runningAgent, r *runner, restartHub func() *runningHub) *runningHub {
				a.stop(t)
				f.startAgent(a.opts)
				return h
			},
		},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fmt.Sprintf("hub-reconnect-%d", i))
			node := fmt.Sprintf("reconnect-node-%d", i)
			snk := &sink{}
			ws := &works{}
			opts := Options{Name: "hub-reconnect", Features: feature(ws, snk)}
			h := f.startHub(opts)
			restartHub := func() *runningHub {
				o := opts
				o.ListenAddress = h.addr // same name, same address: the agent comes back by itself
				return f.startHub(o)
			}
			r := newRunner()
			if tc.gated {
				r.gate = make(chan struct{})
			}
			a := f.startAgent(f.agentOpts(node, h, r))
			waitConnected(t, h, node)

			it := item("w1", "test", `{"n":1}`)
			ws.add(node, it)
			if err := h.Dispatch(node, it); err != nil {
				t.Fatal(err)
			}
			last := tc.during(t, f, h, a, r, restartHub)

			snk.waitStatus(t, node, "w1", agent.PhaseSucceeded)
			waitConnected(t, last, node)
			waitNoPending(t, last, node)
			testenv.Never(t, settle, "a second run or a second status of w1", func(context.Context) (bool, error) {
				if n := r.count("w1"); n != 1 {
					return true, fmt.Errorf("runner ran w1 %d times", n)
				}
				if got := snk.statuses(node, "w1"); len(got) != 1 {
					return true, fmt.Errorf("sink got %d statuses for w1: %v", len(got), got)
				}
				return false, nil
			})
		})
	}
}

// TestAgentRestartAfterTheDispatchWasMissed: the node was away when the
// item was dispatched; the snapshot of its next stream brings it.
func TestAgentRestartAfterTheDispatchWasMissed(t *testing.T) {
	f := newFixture(t, "hub-missed")
	snk := &sink{}
	ws := &works{}
	h := f.startHub(Options{Name: "hub-missed", Features: feature(ws, snk)})
	r := newRunner()
	const node = "missed-node"
	a := f.startAgent(f.agentOpts(node, h, r))
	waitConnected(t, h, node)
	a.stop(t)
	testenv.Eventually(t, waitTimeout, "hub sees the stream end", func(context.Context) (bool, error) {
		return !h.Connected(node), nil
	})

	it := item("w-missed", "test", "")
	ws.add(node, it)
	if err := h.Dispatch(node, it); err == nil {
		t.Fatal("Dispatch to a stopped agent succeeded")
	}
	f.startAgent(a.opts)
	snk.waitStatus(t, node, "w-missed", agent.PhaseSucceeded)
	waitNoPending(t, h, node)
	if n := r.count("w-missed"); n != 1 {
		t.Errorf("runner ran w-missed %d times, want 1", n)
	}
}

// session returns node's session on h.
func (r *runningHub) session(t *testing.T, node string) *session {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sessions[node]
	if s == nil {
		t.Fatalf("node %s has no session on hub %s", node, r.Name())
	}
	return s
}

// send queues env on node's stream as Dispatch does, tracking it as pending.
func (r *runningHub) send(t *testing.T, node string, env *agentv1.Envelope) {
	t.Helper()
	s := r.session(t, node)
	var err error
	s.step(func(m *hubsession.Machine) { err = m.Push(env) })
	if err != nil {
		t.Fatal(err)
	}
}

// nextRev is the session's next revision after skip revisions; send takes
// it.
func (r *runningHub) nextRev(t *testing.T, node string, skip uint64) uint64 {
	t.Helper()
	s := r.session(t, node)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.Revision() + skip + 1
}

// TestRevisionsEndToEnd drives the agent's revision tracking through the
// real hub: a gap makes it ask for a full sync and apply the snapshot it
// gets; duplicates and stale messages are acked and have no effect.
func TestRevisionsEndToEnd(t *testing.T) {
	f := newFixture(t, "hub-revisions")
	snk := &sink{}
	ws := &works{}
	h := f.startHub(Options{Name: "hub-revisions", Features: feature(ws, snk)})
	r := newRunner()
	const node = "revisions-node"
	f.startAgent(f.agentOpts(node, h, r))
	waitConnected(t, h, node)
	waitNoPending(t, h, node)
	const received = "drover_hub_messages_received_total"

	t.Run("a gap makes the agent ask for a snapshot and apply it", func(t *testing.T) {
		before := h.counter(t, received, "KIND_FULL_SYNC_REQUEST")
		gapped := item("w-gap", "test", "")
		ws.add(node, gapped)
		rev := h.nextRev(t, node, 3) // revisions rev-3 .. rev-1 are never sent
		h.send(t, node, protocol.NewDispatch(node, rev, gapped))

		snk.waitStatus(t, node, "w-gap", agent.PhaseSucceeded)
		if got := h.counter(t, received, "KIND_FULL_SYNC_REQUEST") - before; got != 1 {
			t.Errorf("hub got %v full-sync requests, want 1", got)
		}
		// The gapped dispatch is never acked: the acked snapshot that
		// followed it supersedes it.
		waitNoPending(t, h, node)
		if n := r.count("w-gap"); n != 1 {
			t.Errorf("runner ran w-gap %d times, want 1", n)
		}
	})

	t.Run("a duplicate is acked and not applied again", func(t *testing.T) {
		const acked = "drover_hub_acked_envelopes_total"
		acks := h.counter(t, acked)
		it := item("w-dup", "test", "")
		env := protocol.NewDispatch(node, h.nextRev(t, node, 0), it)
		h.send(t, node, env)
		h.send(t, node, env)
		snk.waitStatus(t, node, "w-dup", agent.PhaseSucceeded)
		waitNoPending(t, h, node)
		testenv.Eventually(t, waitTimeout, "both copies acked", func(context.Context) (bool, error) {
			if got := h.counter(t, acked) - acks; got != 2 {
				return false, fmt.Errorf("%v acks", got)
			}
			return true, nil
		})
		if n := r.count("w-dup"); n != 1 {
			t.Errorf("runner ran w-dup %d times, want 1", n)
		}
	})

	t.Run("a stale message is acked and not applied", func(t *testing.T) {
		acks := h.counter(t, received, "KIND_ACK")
		h.send(t, node, protocol.NewDispatch(node, 1, item("w-stale", "test", "")))
		waitNoPending(t, h, node)
		testenv.Eventually(t, waitTimeout, "stale dispatch acked", func(context.Context) (bool, error) {
			if got := h.counter(t, received, "KIND_ACK") - acks; got != 1 {
				return false, fmt.Errorf("%v acks", got)
			}
			return true, nil
		})
		testenv.Never(t, settle, "the stale item runs", func(context.Context) (bool, error) {
			return r.count("w-stale") > 0 || len(snk.statuses(node, "w-stale")) > 0, nil
		})
	})
}

// TestConcurrentDispatchesKeepRevisionOrder: several components dispatch to
// one node at once; the stream must still carry revisions in order, or the
// agent sees gaps and asks for full syncs it should not need.
func TestConcurrentDispatchesKeepRevisionOrder(t *testing.T) {
	f := newFixture(t, "hub-concurrent")
	snk := &sink{}
	ws := &works{}
	h := f.startHub(Options{Name: "hub-concurrent", Features: feature(ws, snk)})
	r := newRunner()
	const node = "concurrent-node"
	f.startAgent(f.agentOpts(node, h, r))
	waitConnected(t, h, node)
	// The real agent names the feature, so bursts like this one reach it
	// in batched Dispatches.
	if s := h.session(t, node); !s.m.Batching() {
		t.Errorf("the agent's session does not batch dispatches: the agent did not name %q", protocol.FeatureDispatchBatch)
	}
	const dispatchers, each = 8, 10
	var wg sync.WaitGroup
	errs := make(chan error, dispatchers*each)
	for d := range dispatchers {
		wg.Go(func() {
			for i := range each {
				it := item(fmt.Sprintf("c-%d-%d", d, i), "test", "")
				ws.add(node, it)
				errs <- h.Dispatch(node, it)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for d := range dispatchers {
		for i := range each {
			snk.waitStatus(t, node, fmt.Sprintf("c-%d-%d", d, i), agent.PhaseSucceeded)
		}
	}
	waitNoPending(t, h, node)
	if n := h.counter(t, "drover_hub_messages_received_total", "KIND_FULL_SYNC_REQUEST"); n != 0 {
		t.Errorf("the agent asked for %v full syncs, want none", n)
	}
	for d := range dispatchers {
		for i := range each {
			if n := r.count(fmt.Sprintf("c-%d-%d", d, i)); n != 1 {
				t.Errorf("c-%d-%d ran %d times, want 1", d, i, n)
			}
		}
	}
}

// TestBurstLongerThanTheQueue: a burst of three queues' worth of
// Dispatches to one node keeps its stream (what does not fit goes in a
// resync snapshot): every item runs once, with no reconnect.
func TestBurstLongerThanTheQueue(t *testing.T) {
	f := newFixture(t, "hub-burst")
	snk := &sink{}
	ws := &works{}
	h := f.startHub(Options{Name: "hub-burst", Features: feature(ws, snk)})
	r := newRunner()
	const node = "burst-node"
	f.startAgent(f.agentOpts(node, h, r))
	waitConnected(t, h, node)
	const n = 3 * sendQueue
	for i := range n {
		it := item(fmt.Sprintf("b-%d", i), "test", "")
		ws.add(node, it)
		if err := h.Dispatch(node, it); err != nil {
			t.Fatalf("dispatch %d: %v", i, err)
		}
	}
	for i := range n {
		snk.waitStatus(t, node, fmt.Sprintf("b-%d", i), agent.PhaseSucceeded)
	}
	waitNoPending(t, h, node)
	for i := range n {
		if c := r.count(fmt.Sprintf("b-%d", i)); c != 1 {
			t.Errorf("b-%d ran %d times, want 1", i, c)
		}
	}
	if c := h.counter(t, "drover_hub_api_writes_total", "connect"); c != 1 {
		t.Errorf("the node connected %v times, want once (no reconnect)", c)
	}
	t.Logf("resync snapshots: %v", h.counter(t, "drover_hub_queue_resyncs_total"))
}

func (w *works) remove(node, uid string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.items[node] = slices.DeleteFunc(w.items[node], func(it *agentv1.WorkItem) bool { return it.GetUid() == uid })
}

// TestCancellingRunningWork stops a running item two ways: Hub.Cancel on the
// open stream, and dropping it from the WorkSource while the node is away
// (its next snapshot does not list it). Either way the runner is interrupted
// and the sink gets one Cancelled status, not the runner's later verdict.
func TestCancellingRunningWork(t *testing.T) {
	cases := []struct {
		name   string
		cancel func(t *testing.T, f *fixture, h *runningHub, a *runningAgent, ws *works, uid string)
		reason string
	}{
		{"Hub.Cancel", func(t *testing.T, f *fixture, h *runningHub, a *runningAgent, ws *works, uid string) {
			ws.remove(a.opts.Node, uid)
			if err := h.Cancel(a.opts.Node, uid); err != nil {
				t.Fatal(err)
			}
		}, "cancelled by the hub"},
		{"dropped from the WorkSource while the stream is down", func(t *testing.T, f *fixture, h *runningHub, a *runningAgent, ws *works, uid string) {
			ws.remove(a.opts.Node, uid)
			h.session(t, a.opts.Node).close("test breaks the stream")
		}, "no longer in the hub's snapshot"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fmt.Sprintf("hub-cancel-%d", i))
			node := fmt.Sprintf("cancel-node-%d", i)
			snk := &sink{}
			ws := &works{}
			h := f.startHub(Options{Name: "hub-cancel", Features: feature(ws, snk)})
			r := newRunner()
			r.gate = make(chan struct{}) // never opened: only the cancel ends the run
			a := f.startAgent(f.agentOpts(node, h, r))
			waitConnected(t, h, node)
			it := item("w-cancel", "test", "")
			ws.add(node, it)
			if err := h.Dispatch(node, it); err != nil {
				t.Fatal(err)
			}
			r.waitStarted(t, "w-cancel")

			tc.cancel(t, f, h, a, ws, "w-cancel")
			got := snk.waitStatus(t, node, "w-cancel", agent.PhaseCancelled)
			if got[0].GetReason() != tc.reason {
				t.Errorf("reason %q, want %q", got[0].GetReason(), tc.reason)
			}
			waitConnected(t, h, node)
			waitNoPending(t, h, node)
			testenv.Never(t, settle, "a second status of w-cancel", func(context.Context) (bool, error) {
				if got := snk.statuses(node, "w-cancel"); len(got) != 1 {
					return true, fmt.Errorf("statuses %v", got)
				}
				return false, nil
			})
			if n := r.count("w-cancel"); n != 1 {
				t.Errorf("runner ran w-cancel %d times, want 1", n)
			}
		})
	}
}

// TestWorkFollowsTheNodeToAnotherHub: the node's hub stops while an item
// runs; the agent moves to the other hub, whose snapshot does not run the
// item again, and whose sink gets the item's status once.
func TestWorkFollowsTheNodeToAnotherHub(t *testing.T) {
	f := newFixture(t, "hub-move")
	ws := &works{}
	snkA, snkB := &sink{}, &sink{}
	a := f.startHub(Options{Name: "hub-move-a", Features: feature(ws, snkA)})
	b := f.startHub(Options{Name: "hub-move-b", Features: feature(ws, snkB)})
	r := newRunner()
	r.gate = make(chan struct{})
	const node = "move-node"
	opts := f.agentOpts(node, a, r)
	opts.Hubs = []string{a.addr, b.addr}
	f.startAgent(opts)
	waitConnected(t, a, node)

	it := item("w-move", "test", "")
	ws.add(node, it)
	if err := a.Dispatch(node, it); err != nil {
		t.Fatal(err)
	}
	r.waitStarted(t, "w-move")
	a.stop(t)
	waitConnected(t, b, node)
	close(r.gate)

	snkB.waitStatus(t, node, "w-move", agent.PhaseSucceeded)
	waitNoPending(t, b, node)
	testenv.Never(t, settle, "a second run or status of w-move", func(context.Context) (bool, error) {
		if n := r.count("w-move"); n != 1 {
			return true, fmt.Errorf("ran %d times", n)
		}
		if n := len(snkA.statuses(node, "w-move")) + len(snkB.statuses(node, "w-move")); n != 1 {
			return true, fmt.Errorf("%d statuses", n)
		}
		return false, nil
	})
	// The new hub learnt the node's state from its NodeState on connect.
	states := snkB.nodeStates(node)
	if len(states) == 0 {
		t.Fatal("hub B got no NodeState")
	}
}

// A node whose stream ends says so at once (Ready Unknown, Disconnected,
// still Online, so that the scheduler places nothing new on it while the
// offline timeout runs), and is Ready again when it reconnects. A hub that
// stops writes nothing of the kind: its nodes are moving elsewhere.
func TestDisconnectedNodeIsMarked(t *testing.T) {
	f := newFixture(t, "hub-disconnect")
	h := f.startHub(Options{Name: "hub-disconnect", OfflineTimeout: time.Hour})
	const node = "disconnect-node"
	opts := f.agentOpts(node, h, newRunner())
	a := f.startAgent(opts)
	waitConnected(t, h, node)
	ready := func(status metav1.ConditionStatus, reason string) {
		t.Helper()
		testenv.Eventually(t, waitTimeout, fmt.Sprintf("Ready %s/%s", status, reason), func(ctx context.Context) (bool, error) {
			var n fleetv1.FleetNode
			if err := f.c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
				return false, err
			}
			c := meta.FindStatusCondition(n.Status.Conditions, fleetv1.ReadyCondition)
			if c == nil || c.Status != status || c.Reason != reason || n.Status.Phase != fleetv1.FleetNodeOnline {
				return false, fmt.Errorf("phase %s, Ready %+v", n.Status.Phase, c)
			}
			return true, nil
		})
	}
	ready(metav1.ConditionTrue, fleetv1.ReasonConnected)
	a.stop(t)
	ready(metav1.ConditionUnknown, fleetv1.ReasonDisconnected)
	f.startAgent(opts)
	waitConnected(t, h, node)
	ready(metav1.ConditionTrue, fleetv1.ReasonConnected)
	h.stop(t)
	testenv.Never(t, settle, "a stopping hub marks its node Disconnected", func(ctx context.Context) (bool, error) {
		var n fleetv1.FleetNode
		if err := f.c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
			return false, nil
		}
		return meta.IsStatusConditionPresentAndEqual(n.Status.Conditions, fleetv1.ReadyCondition, metav1.ConditionUnknown), nil
	})
}

// TestRestartedHubAdoptsItsNodes: a node the API shows Online at a hub that
// restarted, and that never connects to the new process, is first marked
// Disconnected (no new work) and then Offline, as if the hub had always
// tracked it; a node Online at another hub is left alone.
func TestRestartedHubAdoptsItsNodes(t *testing.T) {
	f := newFixture(t, "hub-adopt")
	ctx := context.Background()
	before := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	online := func(name, hub string) {
		t.Helper()
		n := &fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: fleetv1.FleetNodeSpec{Approved: true}}
		if err := f.c.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
		n.Status.Phase, n.Status.Hub, n.Status.LastHeartbeatTime = fleetv1.FleetNodeOnline, hub, &before
		meta.SetStatusCondition(&n.Status.Conditions, metav1.Condition{Type: fleetv1.ReadyCondition, Status: metav1.ConditionTrue,
			Reason: fleetv1.ReasonConnected, Message: "connected before the restart", LastTransitionTime: before})
		if err := f.c.Status().Update(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	online("adopt-gone", "hub-adopt")
	online("adopt-other", "hub-elsewhere")
	f.startHub(Options{Name: "hub-adopt", OfflineTimeout: 4 * time.Second, HeartbeatInterval: time.Second})

	get := func(ctx context.Context, name string) (*fleetv1.FleetNode, *metav1.Condition, error) {
		var n fleetv1.FleetNode
		if err := f.c.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
			return nil, nil, err
		}
		return &n, meta.FindStatusCondition(n.Status.Conditions, fleetv1.ReadyCondition), nil
	}
	testenv.Eventually(t, waitTimeout, "the unconnected node marked Disconnected", func(ctx context.Context) (bool, error) {
		n, c, err := get(ctx, "adopt-gone")
		if err != nil {
			return false, err
		}
		if n.Status.Phase == fleetv1.FleetNodeOffline {
			return false, fmt.Errorf("Offline before it was marked Disconnected: %+v", c)
		}
		return c != nil && c.Status == metav1.ConditionUnknown && c.Reason == fleetv1.ReasonDisconnected &&
			strings.Contains(c.Message, "not connected since hub hub-adopt restarted"), nil
	})
	testenv.Eventually(t, waitTimeout, "the unconnected node Offline", func(ctx context.Context) (bool, error) {
		n, c, err := get(ctx, "adopt-gone")
		if err != nil {
			return false, err
		}
		if n.Status.Phase != fleetv1.FleetNodeOffline || c == nil || c.Reason != fleetv1.ReasonHeartbeatTimeout {
			return false, fmt.Errorf("phase %s, Ready %+v", n.Status.Phase, c)
		}
		if !n.Status.LastHeartbeatTime.Equal(&before) {
			return false, fmt.Errorf("lastHeartbeatTime %v, want the one on record before the restart, %v", n.Status.LastHeartbeatTime, before)
		}
		return true, nil
	})
	n, c, err := get(ctx, "adopt-other")
	if err != nil {
		t.Fatal(err)
	}
	if n.Status.Phase != fleetv1.FleetNodeOnline || c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("a node Online at another hub: phase %s, Ready %+v; want it left alone", n.Status.Phase, c)
	}
}

// TestNodeTransitionEvents: a node's connect, disconnect, return and
// Offline are Events on its FleetNode, as kubectl describe shows them.
func TestNodeTransitionEvents(t *testing.T) {
	f := newFixture(t, "hub-events")
	cs := kubernetes.NewForConfigOrDie(env.Config)
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: cs.EventsV1()})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.StartRecordingToSink(ctx.Done())
	defer b.Shutdown()
	h := f.startHub(Options{Name: "hub-events", OfflineTimeout: 3 * time.Second, HeartbeatInterval: time.Second,
		Recorder: b.NewRecorder(testScheme(), "drover-hub")})
	const node = "events-node"
	opts := f.agentOpts(node, h, newRunner())
	// Each stream is held until its connect is written, with its Event:
	// a stream ended before then abandons that write (and a Ready from
	// an earlier write would not show it).
	connectedEvents := func(ctx context.Context) int {
		list, err := cs.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return 0
		}
		n := 0
		for _, e := range list.Items {
			if e.Regarding.Name == node && e.Reason == fleetv1.ReasonConnected {
				n++
			}
		}
		return n
	}
	connect := func(what string) *runningAgent {
		a := f.startAgent(opts)
		waitConnected(t, h, node)
		f.waitReady(h, node)
		testenv.Eventually(t, waitTimeout, what, func(ctx context.Context) (bool, error) {
			return connectedEvents(ctx) >= 1, nil
		})
		return a
	}
	a := connect("a Connected Event for the first stream")
	a.stop(t)
	// Back (once the hub has seen it go), then gone for good.
	testenv.Eventually(t, waitTimeout, "the hub sees the first stream end", func(context.Context) (bool, error) {
		return !h.Connected(node), nil
	})
	a = f.startAgent(opts)
	waitConnected(t, h, node)
	f.waitReady(h, node)
	a.stop(t)
	testenv.Eventually(t, waitTimeout, "Connected, Disconnected and HeartbeatTimeout Events", func(ctx context.Context) (bool, error) {
		list, err := cs.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		count := map[string]int{}
		for _, e := range list.Items {
			if e.Regarding.Name == node && e.Regarding.Kind == "FleetNode" {
				count[e.Reason] += max(1, int(e.DeprecatedCount))
				if e.Series != nil {
					count[e.Reason] = max(count[e.Reason], int(e.Series.Count))
				}
			}
		}
		// The events library folds a repeat of an Event into a series
		// whose count it writes later: each kind of transition shows once.
		if count[fleetv1.ReasonConnected] < 1 || count[fleetv1.ReasonDisconnected] < 1 || count[fleetv1.ReasonHeartbeatTimeout] != 1 {
			return false, fmt.Errorf("events by reason: %v", count)
		}
		return true, nil
	})
}

// TestSilentNodeIsNotResponding: a node whose stream stays open but that
// sends nothing for three heartbeat intervals is marked Ready Unknown,
// NotResponding (no new work for it), long before the offline timeout;
// the next message from it makes it Ready again, with the reason it had.
func TestSilentNodeIsNotResponding(t *testing.T) {
	f := newFixture(t, "hub-late")
	h := f.startHub(Options{Name: "hub-late", OfflineTimeout: time.Hour, HeartbeatInterval: time.Second, Features: feature(nil, &sink{})})
	const node = "late-node"
	opts := f.agentOpts(node, h, newRunner())
	opts.HeartbeatInterval = time.Hour // connected, and silent
	f.startAgent(opts)
	waitConnected(t, h, node)
	ready := func(what string, ok func(c *metav1.Condition) bool) {
		t.Helper()
		testenv.Eventually(t, waitTimeout, what, func(ctx context.Context) (bool, error) {
			var n fleetv1.FleetNode
			if err := f.c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
				return false, err
			}
			c := meta.FindStatusCondition(n.Status.Conditions, fleetv1.ReadyCondition)
			if n.Status.Phase != fleetv1.FleetNodeOnline || c == nil || !ok(c) {
				return false, fmt.Errorf("phase %s, Ready %+v", n.Status.Phase, c)
			}
			return true, nil
		})
	}
	ready("NotResponding after three silent heartbeat intervals", func(c *metav1.Condition) bool {
		return c.Status == metav1.ConditionUnknown && c.Reason == fleetv1.ReasonNotResponding
	})
	// Work for it: its Ack is a message, and it is back.
	if err := h.Dispatch(node, item("w-late", "noop", `{}`)); err != nil {
		t.Fatal(err)
	}
	ready("Ready again once heard from", func(c *metav1.Condition) bool {
		return c.Status == metav1.ConditionTrue && c.Reason == fleetv1.ReasonConnected && strings.Contains(c.Message, "heard from again")
	})
}
