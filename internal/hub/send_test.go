package hub

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// openStream opens node's GetMessage stream as an agent would and reads it
// in the background until the test ends.
func openStream(t *testing.T, h *runningHub, c agentv1.AgentHubClient, node string, agentRev uint64) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := c.GetMessage(ctx, &agentv1.GetMessageRequest{AgentRevision: agentRev})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := stream.Recv(); err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	waitConnected(t, h, node)
}

func send(t *testing.T, c agentv1.AgentHubClient, env *agentv1.Envelope) (*agentv1.SendResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return c.SendMessage(ctx, env)
}

// bigNodeState is a NodeState whose every field is within its own limit but
// whose encoding is about size bytes.
func bigNodeState(node string, size int) *agentv1.Envelope {
	var work []*agentv1.WorkStatus
	for i := 0; i*protocol.MaxMessageBytes < size; i++ {
		work = append(work, &agentv1.WorkStatus{Uid: fmt.Sprintf("w%d", i), Phase: "Running", Message: strings.Repeat("x", protocol.MaxMessageBytes)})
	}
	return protocol.NewNodeState(node, 1, nil, work)
}

// TestSendMessageRefusals sends with a raw gRPC client what a real agent
// never would, and checks each refusal's code and reason; the hub keeps
// serving the node afterwards.
func TestSendMessageRefusals(t *testing.T) {
	f := newFixture(t, "hub-refusals")
	h := f.startHub(Options{Name: "hub-refusals"})
	const node, idle = "refusals-node", "refusals-idle"
	n := f.registerRaw(h, node)
	c := n.client(t, h.addr, false)
	openStream(t, h, c, node, 0)
	anonymous := n.client(t, h.addr, true)
	noStream := f.registerRaw(h, idle).client(t, h.addr, false)

	heartbeat := func() *agentv1.Envelope { return protocol.NewHeartbeat(node) }
	cases := []struct {
		name     string
		client   agentv1.AgentHubClient
		env      *agentv1.Envelope
		code     codes.Code
		contains string
	}{
		{"no client certificate", anonymous, heartbeat(), codes.Unauthenticated, "client certificate"},
		{"kind does not match the payload", c, func() *agentv1.Envelope {
			e := heartbeat()
			e.Kind = agentv1.Kind_KIND_STATUS
			return e
		}(), codes.InvalidArgument, "kind KIND_STATUS but payload is heartbeat"},
		{"no kind", c, func() *agentv1.Envelope {
			e := heartbeat()
			e.Kind = agentv1.Kind_KIND_UNSPECIFIED
			return e
		}(), codes.InvalidArgument, "KIND_UNSPECIFIED"},
		{"no id", c, func() *agentv1.Envelope {
			e := heartbeat()
			e.Id = ""
			return e
		}(), codes.InvalidArgument, "id"},
		{"no payload", c, &agentv1.Envelope{Id: "x1", Node: node, Kind: agentv1.Kind_KIND_HEARTBEAT}, codes.InvalidArgument, "no payload"},
		{"a status without a revision", c, protocol.NewStatus(node, 0, &agentv1.WorkStatus{Uid: "w", Phase: "Running"}), codes.InvalidArgument, "needs a revision"},
		{"an ack without ack_of", c, protocol.NewAck(node, ""), codes.InvalidArgument, "ack_of"},
		{"a kind only hubs send", c, protocol.NewDispatch(node, 1, item("w", "noop", "")), codes.InvalidArgument, "not sent by agents"},
		{"over the protocol's size limit", c, bigNodeState(node, protocol.MaxEnvelopeBytes+64<<10), codes.InvalidArgument, "envelope too large"},
		{"far over it: refused by gRPC before decoding", c, bigNodeState(node, 3*protocol.MaxEnvelopeBytes), codes.ResourceExhausted, "larger than max"},
		{"another node's name", c, protocol.NewHeartbeat(idle), codes.PermissionDenied, "may not send as node " + idle},
		{"no stream open", noStream, protocol.NewHeartbeat(idle), codes.FailedPrecondition, "open GetMessage first"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := send(t, tc.client, tc.env)
			st := status.Convert(err)
			if st.Code() != tc.code || !strings.Contains(st.Message(), tc.contains) {
				t.Fatalf("got %v %q, want %v containing %q", st.Code(), st.Message(), tc.code, tc.contains)
			}
		})
	}

	t.Run("the hub keeps serving the node", func(t *testing.T) {
		if _, err := send(t, c, heartbeat()); err != nil {
			t.Fatalf("heartbeat after the refusals: %v", err)
		}
		if !h.Connected(node) {
			t.Fatal("the refusals closed the node's stream")
		}
	})

	t.Run("refusals are counted by reason", func(t *testing.T) {
		for reason, want := range map[string]float64{"malformed": 6, "unexpected-kind": 1, "too-large": 1, "wrong-node": 1} {
			if got := h.counter(t, "drover_hub_rejected_messages_total", reason); got != want {
				t.Errorf("rejected{reason=%q} = %v, want %v", reason, got, want)
			}
		}
	})

	t.Run("GetMessage without a client certificate", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		stream, err := anonymous.GetMessage(ctx, &agentv1.GetMessageRequest{})
		if err == nil {
			_, err = stream.Recv()
		}
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("got %v, want Unauthenticated", err)
		}
	})
}

// TestAgentReportRevisions checks the hub's side of agent->hub revisions:
// each report is applied once and in order, re-sends are answered as
// duplicates, a gap asks for a NodeState, and a NodeState resets the count.
func TestAgentReportRevisions(t *testing.T) {
	f := newFixture(t, "hub-reports")
	snk := &sink{}
	h := f.startHub(Options{Name: "hub-reports", Features: feature(nil, snk)})
	const node = "reports-node"
	c := f.registerRaw(h, node).client(t, h.addr, false)
	const agentRev = 10 // what the agent says the hub acknowledged before
	openStream(t, h, c, node, agentRev)

	st := func(rev uint64, uid string) *agentv1.Envelope {
		return protocol.NewStatus(node, rev, &agentv1.WorkStatus{Uid: uid, Phase: "Succeeded"})
	}
	batch := func(rev uint64, uids ...string) *agentv1.Envelope {
		var ws []*agentv1.WorkStatus
		for _, uid := range uids {
			ws = append(ws, &agentv1.WorkStatus{Uid: uid, Phase: "Succeeded"})
		}
		return protocol.NewStatuses(node, rev, ws)
	}
	first := st(11, "a")
	steps := []struct {
		name     string
		env      *agentv1.Envelope
		want     *agentv1.SendResponse
		wantSink []string // uids the sink holds after the step
		states   int      // NodeStates the sink holds after the step
	}{
		{"the next revision is applied", first, &agentv1.SendResponse{}, []string{"a"}, 0},
		{"the same envelope again is a duplicate", first, &agentv1.SendResponse{Duplicate: true}, []string{"a"}, 0},
		{"the same revision in a new envelope is a duplicate", st(11, "a"), &agentv1.SendResponse{Duplicate: true}, []string{"a"}, 0},
		{"an older revision is not applied", st(9, "old"), &agentv1.SendResponse{Duplicate: true}, []string{"a"}, 0},
		{"a gap asks for the agent's whole state", st(13, "b"), &agentv1.SendResponse{FullSyncRequired: true}, []string{"a"}, 0},
		{"a NodeState past the gap is applied", protocol.NewNodeState(node, 13, nil, []*agentv1.WorkStatus{{Uid: "a", Phase: "Succeeded"}, {Uid: "b", Phase: "Succeeded"}}), &agentv1.SendResponse{}, []string{"a"}, 1},
		{"reports go on from the NodeState's revision", st(14, "c"), &agentv1.SendResponse{}, []string{"a", "c"}, 1},
		{"an older NodeState is not applied", protocol.NewNodeState(node, 12, nil, nil), &agentv1.SendResponse{Duplicate: true}, []string{"a", "c"}, 1},
		{"a batch applies its new revisions in order and skips repeats", batch(13, "b", "c", "d", "e"), &agentv1.SendResponse{}, []string{"a", "c", "d", "e"}, 1},
		{"a batch of repeats is a duplicate", batch(15, "d", "e"), &agentv1.SendResponse{Duplicate: true}, []string{"a", "c", "d", "e"}, 1},
		{"a batch stops at a gap", batch(18, "f", "g"), &agentv1.SendResponse{FullSyncRequired: true}, []string{"a", "c", "d", "e"}, 1},
	}
	for _, s := range steps {
		// Steps depend on each other: stop at the first failure.
		resp, err := send(t, c, s.env)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if resp.GetDuplicate() != s.want.GetDuplicate() || resp.GetFullSyncRequired() != s.want.GetFullSyncRequired() {
			t.Fatalf("%s: got duplicate=%v fullSyncRequired=%v, want %v %v", s.name,
				resp.GetDuplicate(), resp.GetFullSyncRequired(), s.want.GetDuplicate(), s.want.GetFullSyncRequired())
		}
		var got []string
		snk.mu.Lock()
		for _, r := range snk.status {
			got = append(got, r.st.GetUid())
		}
		snk.mu.Unlock()
		if strings.Join(got, ",") != strings.Join(s.wantSink, ",") {
			t.Fatalf("%s: sink got statuses of %v, want %v", s.name, got, s.wantSink)
		}
		if n := len(snk.nodeStates(node)); n != s.states {
			t.Fatalf("%s: sink got %d NodeStates, want %d", s.name, n, s.states)
		}
	}
}

// TestNodeInfoBeyondTheProtocolIsRefused: Register and GetMessage carry a
// NodeInfo that ends up in the FleetNode; the hub holds it to the protocol's
// bounds, not only to what the API accepts.
func TestNodeInfoBeyondTheProtocolIsRefused(t *testing.T) {
	f := newFixture(t, "hub-nodeinfo")
	h := f.startHub(Options{Name: "hub-nodeinfo"})
	const node = "nodeinfo-node"
	n := f.registerRaw(h, node)
	labels := map[string]string{}
	for i := range protocol.MaxMapEntries + 1 {
		labels[fmt.Sprintf("l%d", i)] = "v"
	}
	tooMany := &agentv1.NodeInfo{Labels: labels}
	longText := &agentv1.NodeInfo{AgentVersion: strings.Repeat("v", protocol.MaxTextBytes+1)}
	for name, info := range map[string]*agentv1.NodeInfo{"too many labels": tooMany, "a long agent version": longText} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			defer cancel()
			_, csr, err := pki.NewKeyAndCSR("nodeinfo-other")
			if err != nil {
				t.Fatal(err)
			}
			_, err = n.client(t, h.addr, true).Register(ctx, &agentv1.RegisterRequest{Node: "nodeinfo-other", BootstrapToken: f.token(), Csr: csr, Info: info})
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("Register: %v, want InvalidArgument", err)
			}
			stream, err := n.client(t, h.addr, false).GetMessage(ctx, &agentv1.GetMessageRequest{Info: info})
			if err == nil {
				_, err = stream.Recv()
			}
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("GetMessage: %v, want InvalidArgument", err)
			}
		})
	}
}

// loadingWorks is a WorkSource whose caches load when the test says so.
type loadingWorks struct {
	works
	ready atomic.Bool
}

func (w *loadingWorks) Ready() bool { return w.ready.Load() }

// TestStreamsWaitForTheWorkToLoad: while the hub's WorkSource is still
// loading, a stream is refused as Unavailable (the agent retries) and the
// node is not marked Online; once it has loaded, the stream opens.
func TestStreamsWaitForTheWorkToLoad(t *testing.T) {
	f := newFixture(t, "hub-loading")
	ws := &loadingWorks{}
	h := f.startHub(Options{Name: "hub-loading", Features: feature(ws, nil)})
	const node = "loading-node"
	c := f.registerRaw(h, node).client(t, h.addr, false)

	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	stream, err := c.GetMessage(ctx, &agentv1.GetMessageRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "still loading") {
		t.Fatalf("stream while loading: %v, want Unavailable saying the work is still loading", err)
	}
	var fn fleetv1.FleetNode
	if err := f.c.Get(ctx, client.ObjectKey{Name: node}, &fn); err != nil {
		t.Fatal(err)
	}
	if fn.Status.Phase == fleetv1.FleetNodeOnline || fn.Status.Hub != "" {
		t.Errorf("FleetNode %s is %s on hub %q while the hub refused its stream; want it not Online", node, fn.Status.Phase, fn.Status.Hub)
	}

	ws.ready.Store(true)
	openStream(t, h, c, node, 0)
}
