package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/store"
	"github.com/drover-fleet/drover/internal/testkit"
)

// testTimeout bounds every wait in this file.
const testTimeout = testkit.DefaultTimeout

func TestHostOf(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1:7443":      "127.0.0.1",
		"hub.example.com:443": "hub.example.com",
		"[::1]:7443":          "::1",
		"no-port":             "no-port",
		"":                    "",
	} {
		if got := hostOf(addr); got != want {
			t.Errorf("hostOf(%q) = %q, want %q", addr, got, want)
		}
	}
}

func TestClassify(t *testing.T) {
	cases := []struct {
		err   error
		fatal bool
	}{
		{status.Error(codes.Unauthenticated, "no certificate"), true},
		{status.Error(codes.PermissionDenied, "node x is revoked"), true},
		{status.Error(codes.Unavailable, "connection refused"), false},
		{status.Error(codes.Aborted, "hub shutting down"), false},
		{status.Error(codes.FailedPrecondition, "no stream"), false},
		{errors.New("plain"), false},
	}
	for _, tc := range cases {
		err := classify("hub:1", tc.err)
		var fatal *FatalError
		if got := errors.As(err, &fatal); got != tc.fatal {
			t.Errorf("classify(%v): fatal=%v, want %v", tc.err, got, tc.fatal)
		}
		if !strings.Contains(err.Error(), "hub:1") {
			t.Errorf("classify(%v) = %q, does not name the hub", tc.err, err)
		}
		if !tc.fatal && !errors.Is(err, tc.err) {
			t.Errorf("classify(%v) = %v, does not wrap the cause", tc.err, err)
		}
	}
}

func TestOptionsDefaults(t *testing.T) {
	valid := func() Options { return Options{Node: "n1", Hubs: []string{"h:1"}, StateDir: t.TempDir()} }
	for name, tc := range map[string]struct {
		mutate func(*Options)
		err    string
	}{
		"valid":         {func(*Options) {}, ""},
		"bad node name": {func(o *Options) { o.Node = "Not_A_Name" }, "node"},
		"no hubs":       {func(o *Options) { o.Hubs = nil }, "hub address"},
		"no state dir":  {func(o *Options) { o.StateDir = "" }, "state directory"},
	} {
		t.Run(name, func(t *testing.T) {
			o := valid()
			tc.mutate(&o)
			err := o.defaults()
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("got %v, want an error about %q", err, tc.err)
			}
		})
	}

	t.Run("noop is built in and can be replaced", func(t *testing.T) {
		o := valid()
		if err := o.defaults(); err != nil {
			t.Fatal(err)
		}
		if _, ok := o.Runners["noop"]; !ok {
			t.Fatal("no noop runner")
		}
		mine := RunnerFunc(func(context.Context, store.Work) (string, string) { return PhaseFailed, "mine" })
		o = valid()
		o.Runners = map[string]Runner{"noop": mine}
		if err := o.defaults(); err != nil {
			t.Fatal(err)
		}
		if p, _ := o.Runners["noop"].Run(context.Background(), store.Work{}); p != PhaseFailed {
			t.Fatal("the caller's noop runner was replaced by the built-in one")
		}
	})
}

// newTestAgent is an agent on a fresh DB, not connected to anything.
func newTestAgent(t *testing.T, runners map[string]Runner) *Agent {
	t.Helper()
	opts := Options{Node: "n1", Hubs: []string{"h:1"}, StateDir: t.TempDir(), Runners: runners, Capacity: map[string]string{"cpu": "1"}}
	if err := opts.defaults(); err != nil {
		t.Fatal(err)
	}
	db, err := store.Open(context.Background(), filepath.Join(opts.StateDir, "agent.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return &Agent{opts: opts, log: opts.Logger, db: db, heartbeat: time.Second, kick: make(chan struct{}, 1), work: make(chan string, 1024)}
}

// outbox decodes the agent's queued reports, oldest first.
func outbox(t *testing.T, a *Agent) []*agentv1.Envelope {
	t.Helper()
	msgs, err := a.db.Pending(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []*agentv1.Envelope
	for _, m := range msgs {
		env, err := protocol.Decode(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, env)
	}
	return out
}

// TestReportsAreQueuedInRevisionOrder: work statuses (from the work loop)
// and NodeStates (from the connection) are built concurrently; the outbox
// must still be in revision order, or the hub drops the report that comes
// after one with a higher revision as stale.
func TestReportsAreQueuedInRevisionOrder(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	const n = 50
	for i := range n {
		if _, err := a.db.PutWork(ctx, store.Work{UID: fmt.Sprintf("w%d", i), Type: "noop", Phase: PhaseRunning}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := range n {
		wg.Add(2)
		go func() { defer wg.Done(); errs <- a.finish(ctx, fmt.Sprintf("w%d", i), PhaseSucceeded, "") }()
		go func() { defer wg.Done(); _, err := a.reportNodeState(ctx); errs <- err }()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	envs := outbox(t, a)
	if len(envs) != 2*n {
		t.Fatalf("outbox holds %d reports, want %d", len(envs), 2*n)
	}
	done := map[string]bool{} // uids whose status is queued before this point
	for i, env := range envs {
		if want := uint64(i + 1); env.GetRevision() != want {
			t.Fatalf("report %d (%s) has revision %d, want %d: the outbox is not in revision order", i, env.GetKind(), env.GetRevision(), want)
		}
		if st := env.GetStatus(); st != nil {
			done[st.GetWork().GetUid()] = true
		}
		// A NodeState shows at least every change reported before it.
		for _, w := range env.GetNodeState().GetWork() {
			if done[w.GetUid()] && w.GetPhase() != PhaseSucceeded {
				t.Fatalf("NodeState at revision %d shows %s %s after its Succeeded status", env.GetRevision(), w.GetUid(), w.GetPhase())
			}
		}
	}
}

func TestAckedRevision(t *testing.T) {
	ctx := context.Background()
	a := newTestAgent(t, nil)
	check := func(want uint64) {
		t.Helper()
		got, err := a.ackedRevision(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("ackedRevision = %d, want %d", got, want)
		}
	}
	check(0)
	for range 3 { // revisions 1..3 reported and acked
		if _, err := a.db.NextAgentRevision(ctx); err != nil {
			t.Fatal(err)
		}
	}
	check(3)
	if _, err := a.db.PutWork(ctx, store.Work{UID: "w", Type: "noop"}); err != nil {
		t.Fatal(err)
	}
	if err := a.finish(ctx, "w", PhaseSucceeded, ""); err != nil { // revision 4, queued
		t.Fatal(err)
	}
	if _, err := a.reportNodeState(ctx); err != nil { // revision 5, queued
		t.Fatal(err)
	}
	check(3)
	envs := outbox(t, a)
	if err := a.db.Ack(ctx, envs[0].GetId()); err != nil {
		t.Fatal(err)
	}
	check(4)
	if err := a.db.Ack(ctx, envs[1].GetId()); err != nil {
		t.Fatal(err)
	}
	check(5)
}

// fakeHub is an AgentHubClient that records what the agent sends. With a
// tracker it answers reports as the hub does: a gap asks for a full sync,
// an old revision is a duplicate.
type fakeHub struct {
	mu      sync.Mutex
	sent    []*agentv1.Envelope
	tracker *protocol.Tracker
	// refuseBatches answers a Status of several reports InvalidArgument.
	refuseBatches bool
}

func (f *fakeHub) Register(context.Context, *agentv1.RegisterRequest, ...grpc.CallOption) (*agentv1.RegisterResponse, error) {
	return nil, status.Error(codes.Unimplemented, "fake")
}

func (f *fakeHub) Renew(context.Context, *agentv1.RenewRequest, ...grpc.CallOption) (*agentv1.RenewResponse, error) {
	return nil, status.Error(codes.Unimplemented, "fake")
}

func (f *fakeHub) GetMessage(context.Context, *agentv1.GetMessageRequest, ...grpc.CallOption) (grpc.ServerStreamingClient[agentv1.Envelope], error) {
	return nil, status.Error(codes.Unimplemented, "fake")
}

func (f *fakeHub) SendMessage(_ context.Context, env *agentv1.Envelope, _ ...grpc.CallOption) (*agentv1.SendResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sent = append(f.sent, env)
	if f.refuseBatches && len(env.GetStatus().GetMore()) > 0 {
		return nil, status.Error(codes.InvalidArgument, "fake: no batches")
	}
	if f.tracker == nil {
		return &agentv1.SendResponse{}, nil
	}
	var v protocol.Verdict
	switch env.GetKind() {
	case agentv1.Kind_KIND_STATUS:
		v = f.tracker.Step(env.GetRevision())
	case agentv1.Kind_KIND_NODE_STATE:
		v = f.tracker.Reset(env.GetRevision())
	default:
		return &agentv1.SendResponse{}, nil
	}
	return &agentv1.SendResponse{FullSyncRequired: v == protocol.Gap, Duplicate: v == protocol.Duplicate || v == protocol.Stale}, nil
}

// take returns and forgets what was sent.
func (f *fakeHub) take() []*agentv1.Envelope {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.sent
	f.sent = nil
	return out
}

// TestHandleRevisions feeds hub->agent envelopes to handle and checks what
// the agent stores, schedules and answers.
func TestHandleRevisions(t *testing.T) {
	ctx := context.Background()
	a := newTestAgent(t, nil)
	hub := &fakeHub{}
	tr := protocol.NewTracker(0)
	it := func(uid string) *agentv1.WorkItem { return &agentv1.WorkItem{Uid: uid, Type: "noop"} }
	scheduled := func() []string {
		var out []string
		for {
			select {
			case uid := <-a.work:
				out = append(out, uid)
			default:
				return out
			}
		}
	}

	snap := protocol.NewSnapshot("n1", 1, []*agentv1.WorkItem{it("a")})
	d2 := protocol.NewDispatch("n1", 2, it("b"))
	steps := []struct {
		name      string
		env       *agentv1.Envelope
		acked     bool   // the agent acks env
		fullSync  uint64 // the agent asks for a full sync from this revision (0: does not)
		scheduled []string
		hubRev    uint64 // the DB's hub revision afterwards
	}{
		{"a snapshot is applied", snap, true, 0, []string{"a"}, 1},
		{"the next dispatch is applied", d2, true, 0, []string{"b"}, 2},
		{"the same dispatch again is acked, not applied", d2, true, 0, nil, 2},
		{"a stale dispatch is acked, not applied", protocol.NewDispatch("n1", 1, it("stale")), true, 0, nil, 2},
		{"a gap asks for a full sync and is not acked", protocol.NewDispatch("n1", 5, it("gap")), false, 2, nil, 2},
		{"an older snapshot is acked, not applied", protocol.NewSnapshot("n1", 2, nil), true, 0, nil, 2},
		{"a snapshot past the gap is applied", protocol.NewSnapshot("n1", 6, []*agentv1.WorkItem{it("a"), it("b"), it("gap")}), true, 0, []string{"a", "b", "gap"}, 6},
		{"a message for another node is ignored", protocol.NewDispatch("n2", 7, it("other")), false, 0, nil, 6},
		{"a malformed message is ignored", &agentv1.Envelope{Id: "m", Node: "n1", Kind: agentv1.Kind_KIND_DISPATCH}, false, 0, nil, 6},
		{"a cancel is applied", protocol.NewCancel("n1", 7, "gap"), true, 0, nil, 7},
		{"a snapshot that drops items cancels and forgets them", protocol.NewSnapshot("n1", 8, []*agentv1.WorkItem{it("gap")}), true, 0, []string{"gap"}, 8},
	}
	for _, s := range steps {
		if err := a.handleBatch(ctx, hub, tr, []*agentv1.Envelope{s.env}); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		sent := hub.take()
		var acks, syncs []*agentv1.Envelope
		for _, e := range sent {
			switch e.GetKind() {
			case agentv1.Kind_KIND_ACK:
				acks = append(acks, e)
			case agentv1.Kind_KIND_FULL_SYNC_REQUEST:
				syncs = append(syncs, e)
			}
		}
		if s.acked != (len(acks) == 1 && acks[0].GetAckOf() == s.env.GetId()) || len(acks) > 1 {
			t.Fatalf("%s: acks %v, want acked=%v", s.name, acks, s.acked)
		}
		if s.fullSync == 0 && len(syncs) > 0 || s.fullSync > 0 && (len(syncs) != 1 || syncs[0].GetFullSyncRequest().GetHaveRevision() != s.fullSync) {
			t.Fatalf("%s: full-sync requests %v, want one from %d (0: none)", s.name, syncs, s.fullSync)
		}
		if got := scheduled(); !slices.Equal(got, s.scheduled) {
			t.Fatalf("%s: scheduled %v, want %v", s.name, got, s.scheduled)
		}
		if rev, err := a.db.HubRevision(ctx); err != nil || rev != s.hubRev {
			t.Fatalf("%s: hub revision %d (%v), want %d", s.name, rev, err, s.hubRev)
		}
	}
	if w, ok, err := a.db.Work(ctx, "gap"); err != nil || !ok || w.Phase != PhaseCancelled {
		t.Fatalf("cancelled item: %+v %v %v, want phase Cancelled", w, ok, err)
	}
	for _, uid := range []string{"stale", "a", "b"} {
		if _, ok, _ := a.db.Work(ctx, uid); ok {
			t.Errorf("the DB holds %s, which the hub never sent or dropped", uid)
		}
	}
	// One Cancelled status each for the cancelled and the dropped items.
	var got []string
	for _, e := range outbox(t, a) {
		if w := e.GetStatus().GetWork(); w != nil {
			got = append(got, w.GetUid()+"="+w.GetPhase())
		}
	}
	slices.Sort(got)
	if want := []string{"a=Cancelled", "b=Cancelled", "gap=Cancelled"}; !slices.Equal(got, want) {
		t.Fatalf("statuses %v, want %v", got, want)
	}
}

// TestOutboxSendsARunOfReportsInOneEnvelope: reports at consecutive
// revisions go in one Status; a NodeState breaks the run; a hub that
// refuses the batch gets the reports one by one.
func TestOutboxSendsARunOfReportsInOneEnvelope(t *testing.T) {
	for _, refuse := range []bool{false, true} {
		t.Run(fmt.Sprintf("refuseBatches=%v", refuse), func(t *testing.T) {
			ctx := context.Background()
			a := newTestAgent(t, nil)
			hub := &fakeHub{refuseBatches: refuse}
			st := func(uid string) func(uint64) *agentv1.Envelope {
				return func(rev uint64) *agentv1.Envelope {
					return protocol.NewStatus("n1", rev, &agentv1.WorkStatus{Uid: uid, Phase: PhaseSucceeded})
				}
			}
			for _, uid := range []string{"a", "b", "c"} {
				if _, err := a.report(ctx, "", "", "", st(uid)); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := a.reportNodeState(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := a.report(ctx, "", "", "", st("d")); err != nil {
				t.Fatal(err)
			}
			msgs, err := a.db.Pending(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			var covered uint64
			if err := a.sendBatch(ctx, hub, msgs, &covered); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range hub.take() {
				var uids []string
				for _, w := range append([]*agentv1.WorkStatus{e.GetStatus().GetWork()}, e.GetStatus().GetMore()...) {
					uids = append(uids, w.GetUid())
				}
				if e.GetKind() == agentv1.Kind_KIND_NODE_STATE {
					uids = []string{"state"}
				}
				got = append(got, fmt.Sprintf("%d:%s", e.GetRevision(), strings.Join(uids, "+")))
			}
			want := []string{"1:a+b+c", "4:state", "5:d"}
			if refuse {
				want = []string{"1:a+b+c", "1:a", "2:b", "3:c", "4:state", "5:d"}
			}
			if !slices.Equal(got, want) {
				t.Errorf("sent %v, want %v", got, want)
			}
			if left := outbox(t, a); len(left) != 0 {
				t.Errorf("outbox holds %d messages after all were answered", len(left))
			}
		})
	}
}

// TestHandleBatchAcksARunInOrder feeds a run of envelopes at once, as the
// stream reader hands over what arrived while the last run was applied.
func TestHandleBatchAcksARunInOrder(t *testing.T) {
	ctx := context.Background()
	a := newTestAgent(t, nil)
	hub := &fakeHub{}
	tr := protocol.NewTracker(0)
	it := func(uid string) *agentv1.WorkItem { return &agentv1.WorkItem{Uid: uid, Type: "noop"} }
	run := []*agentv1.Envelope{
		protocol.NewDispatch("n1", 1, it("a")),
		protocol.NewDispatch("n1", 2, it("b")),
		protocol.NewCancel("n1", 3, "a"), // sees a, dispatched in the same run
		protocol.NewDispatch("n1", 4, it("c")),
		protocol.NewDispatch("n1", 4, it("c")), // a repeat: acked again, applied once
		protocol.NewDispatch("n1", 7, it("gap1")),
		protocol.NewDispatch("n1", 8, it("gap2")),
	}
	if err := a.handleBatch(ctx, hub, tr, run); err != nil {
		t.Fatal(err)
	}
	var acks, syncs []*agentv1.Envelope
	for _, e := range hub.take() {
		switch e.GetKind() {
		case agentv1.Kind_KIND_ACK:
			acks = append(acks, e)
		case agentv1.Kind_KIND_FULL_SYNC_REQUEST:
			syncs = append(syncs, e)
		}
	}
	if len(acks) != 1 {
		t.Fatalf("%d acks, want one for the run", len(acks))
	}
	got := append([]string{acks[0].GetAckOf()}, acks[0].GetAck().GetMore()...)
	want := []string{run[0].GetId(), run[1].GetId(), run[2].GetId(), run[3].GetId(), run[4].GetId()}
	if !slices.Equal(got, want) {
		t.Errorf("acked %v, want %v (the gaps are not acked)", got, want)
	}
	if len(syncs) != 1 || syncs[0].GetFullSyncRequest().GetHaveRevision() != 4 {
		t.Errorf("full-sync requests %v, want one from revision 4", syncs)
	}
	if rev, _ := a.db.HubRevision(ctx); rev != 4 {
		t.Errorf("hub revision %d, want 4", rev)
	}
	for uid, phase := range map[string]string{"a": PhaseCancelled, "b": PhasePending, "c": PhasePending} {
		if w, ok, err := a.db.Work(ctx, uid); err != nil || !ok || w.Phase != phase {
			t.Errorf("work %s: %+v %v %v, want phase %s", uid, w, ok, err, phase)
		}
	}
	for _, uid := range []string{"gap1", "gap2"} {
		if _, ok, _ := a.db.Work(ctx, uid); ok {
			t.Errorf("the DB holds %s, which came after a gap", uid)
		}
	}
}

func TestNodeStateWork(t *testing.T) {
	w := func(uid, phase string) store.Work { return store.Work{UID: uid, Phase: phase} }
	all := []store.Work{
		w("done1", PhaseSucceeded), w("run1", PhaseRunning), w("done2", PhaseFailed),
		w("pend1", PhasePending), w("done3", PhaseCancelled), w("new", ""),
	}
	uids := func(ws []*agentv1.WorkStatus) string {
		var out []string
		for _, w := range ws {
			out = append(out, w.GetUid())
		}
		return strings.Join(out, ",")
	}
	// Sizes as nodeStateWork counts them: done1 30, run1 27, done2 27,
	// pend1 28, done3 30, new 19; 161 in all.
	for _, tc := range []struct {
		max, bytes int
		want       string
	}{
		{10, 1 << 20, "done1,run1,done2,pend1,done3,new"},
		{6, 161, "done1,run1,done2,pend1,done3,new"},
		{5, 1 << 20, "run1,pend1,new,done2,done3"}, // unfinished first, then the latest finished
		{3, 1 << 20, "run1,pend1,new"},
		{2, 1 << 20, "run1,pend1"},
		{10, 160, "run1,pend1,new,done2,done3"},
		{10, 110, "run1,pend1,new,done3"},
		{10, 80, "run1,pend1,new"},
		{10, 50, "run1"},
	} {
		if got := uids(nodeStateWork(all, tc.max, tc.bytes)); got != tc.want {
			t.Errorf("max %d items, %d bytes: %s, want %s", tc.max, tc.bytes, got, tc.want)
		}
	}
}

// TestCancelInterruptsARunningItem: the runner's context ends, and the item
// ends once, as Cancelled, whatever the runner returns afterwards.
func TestCancelInterruptsARunningItem(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started, returned := make(chan struct{}), make(chan string, 1)
	a := newTestAgent(t, map[string]Runner{"wait": RunnerFunc(func(ctx context.Context, _ store.Work) (string, string) {
		close(started)
		select {
		case <-ctx.Done():
			returned <- "interrupted"
			return PhaseFailed, "interrupted"
		case <-time.After(testTimeout):
			returned <- "not interrupted"
			return PhaseSucceeded, "not interrupted"
		}
	})})
	for _, w := range []store.Work{{UID: "w", Type: "wait", Phase: PhasePending}, {UID: "after", Type: "noop", Phase: PhasePending}} {
		if _, err := a.db.PutWork(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	a.schedule("w")
	done := make(chan error, 1)
	go func() { done <- a.runWork(ctx) }()
	select {
	case <-started:
	case <-time.After(testTimeout):
		t.Fatal("the runner did not start")
	}
	if err := a.cancel(ctx, "w", "cancelled by the hub"); err != nil {
		t.Fatal(err)
	}
	if got := <-returned; got != "interrupted" {
		t.Fatalf("runner %s", got)
	}
	a.schedule("w")     // a re-delivery must not run it again
	a.schedule("after") // runs after the re-delivery was handled
	statuses := func() []string {
		var got []string
		for _, e := range outbox(t, a) {
			got = append(got, e.GetStatus().GetWork().GetUid()+" "+e.GetStatus().GetWork().GetPhase()+": "+e.GetStatus().GetWork().GetReason())
		}
		return got
	}
	testkit.Eventually(t, testTimeout, func() string {
		if got := statuses(); len(got) < 2 {
			return fmt.Sprintf("statuses %q, want 2", got)
		}
		return ""
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got, want := statuses(), []string{"w Cancelled: cancelled by the hub", "after Succeeded: "}; !slices.Equal(got, want) {
		t.Fatalf("statuses %q, want %q", got, want)
	}
}

// TestRunWorkStopsCleanly: stopping the agent while the loop picks an item
// is a clean stop, not an error from the cancelled DB call.
func TestRunWorkStopsCleanly(t *testing.T) {
	for range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		a := newTestAgent(t, nil)
		if _, err := a.db.PutWork(ctx, store.Work{UID: "w", Type: "noop", Phase: PhasePending}); err != nil {
			t.Fatal(err)
		}
		for range 100 {
			a.schedule("w")
		}
		done := make(chan error, 1)
		go func() { done <- a.runWork(ctx) }()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("runWork after its context ended: %v", err)
			}
		case <-time.After(testTimeout):
			t.Fatal("runWork did not return")
		}
	}
}

// TestOneFullSyncPerGap: after the hub reports a gap in the agent's reports,
// the agent queues one NodeState and does not send the status reports it
// covers (each would be another gap, and another NodeState).
func TestOneFullSyncPerGap(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := newTestAgent(t, nil)
	for i := range 4 {
		uid := fmt.Sprint("w", i)
		if _, err := a.db.PutWork(ctx, store.Work{UID: uid, Type: "noop", Phase: PhaseRunning}); err != nil {
			t.Fatal(err)
		}
		if err := a.finish(ctx, uid, PhaseSucceeded, ""); err != nil { // status at revision i+1
			t.Fatal(err)
		}
	}
	lost := outbox(t, a)[0] // the hub never gets revision 1
	if err := a.db.Ack(ctx, lost.GetId()); err != nil {
		t.Fatal(err)
	}
	hub := &fakeHub{tracker: protocol.NewTracker(0)}
	done := make(chan error, 1)
	go func() { done <- a.flushOutbox(ctx, hub) }()
	testkit.Eventually(t, testTimeout, func() string {
		if n := len(outbox(t, a)); n > 0 {
			return fmt.Sprintf("%d reports still in the outbox", n)
		}
		return ""
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range hub.take() {
		got = append(got, fmt.Sprintf("%s@%d", strings.TrimPrefix(e.GetKind().String(), "KIND_"), e.GetRevision()))
	}
	if want := []string{"STATUS@2", "NODE_STATE@5"}; !slices.Equal(got, want) {
		t.Fatalf("sent %v, want %v", got, want)
	}
	if hub.tracker.Last() != 5 {
		t.Fatalf("hub at revision %d, want 5", hub.tracker.Last())
	}
}

// TestARunnersVerdictIsClippedToTheProtocol: a runner's phase and reason go
// into a report; one longer than the protocol allows, or not UTF-8, must not
// stop the agent (the report could never be encoded), and a phase that is
// not an end must not leave the item open.
func TestARunnersVerdictIsClippedToTheProtocol(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	long := strings.Repeat("é", protocol.MaxTextBytes) // 2 bytes each
	a := newTestAgent(t, map[string]Runner{
		"long":   RunnerFunc(func(context.Context, store.Work) (string, string) { return PhaseFailed, long }),
		"binary": RunnerFunc(func(context.Context, store.Work) (string, string) { return PhaseSucceeded, "bad \xff\xfe bytes" }),
		"empty":  RunnerFunc(func(context.Context, store.Work) (string, string) { return "", "forgot" }),
		"odd":    RunnerFunc(func(context.Context, store.Work) (string, string) { return "Odd\xff", "" }),
	})
	for _, w := range []store.Work{{UID: "long", Type: "long"}, {UID: "binary", Type: "binary"}, {UID: "empty", Type: "empty"}, {UID: "odd", Type: "odd"}, {UID: "after", Type: "noop"}} {
		if _, err := a.db.PutWork(ctx, w); err != nil {
			t.Fatal(err)
		}
		a.schedule(w.UID)
	}
	done := make(chan error, 1)
	go func() { done <- a.runWork(ctx) }()
	testkit.Eventually(t, testTimeout, func() string {
		select {
		case err := <-done:
			t.Fatalf("the work loop stopped: %v", err)
		default:
		}
		if n := len(outbox(t, a)); n < 5 {
			return fmt.Sprintf("%d reports, want 5", n)
		}
		return ""
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, e := range outbox(t, a) {
		w := e.GetStatus().GetWork()
		if len(w.GetReason()) > protocol.MaxTextBytes || len(w.GetPhase()) > protocol.MaxTextBytes {
			t.Errorf("%s: phase %d bytes, reason %d bytes, over %d", w.GetUid(), len(w.GetPhase()), len(w.GetReason()), protocol.MaxTextBytes)
		}
		switch w.GetUid() {
		case "long":
			if !strings.HasPrefix(w.GetReason(), "éé") || w.GetPhase() != PhaseFailed {
				t.Errorf("long: %q %q", w.GetPhase(), w.GetReason()[:10])
			}
		case "binary":
			if w.GetPhase() != PhaseSucceeded || w.GetReason() != "bad \uFFFD bytes" {
				t.Errorf("binary: %q %q", w.GetPhase(), w.GetReason())
			}
		case "empty", "odd":
			// Not an end: recorded as Failed, so it is neither left open nor run again.
			if w.GetPhase() != PhaseFailed || !strings.Contains(w.GetReason(), "runner ended with phase") {
				t.Errorf("%s: %q %q", w.GetUid(), w.GetPhase(), w.GetReason())
			}
		}
	}
}

func TestClipText(t *testing.T) {
	for _, tc := range []struct {
		in   string
		max  int
		want string
	}{
		{"abc", 10, "abc"},
		{"abcdef", 6, "abcdef"},
		{"abcdef", 5, "ab…"},
		{"éé", 4, "éé"},
		{"ééé", 5, "é…"},
		{"éééé", 6, "é…"}, // never cuts a rune in two
		{"a\xffb", 10, "a\uFFFDb"},
	} {
		got := clipText(tc.in, tc.max)
		if got != tc.want || len(got) > tc.max {
			t.Errorf("clipText(%q, %d) = %q, want %q", tc.in, tc.max, got, tc.want)
		}
	}
}

// TestNodeStateFitsInAnEnvelope: however much work the DB holds, the
// NodeState sent on every connect can be encoded; otherwise the agent could
// never connect again.
func TestNodeStateFitsInAnEnvelope(t *testing.T) {
	ctx := context.Background()
	a := newTestAgent(t, nil)
	reason := strings.Repeat("r", protocol.MaxTextBytes)
	var ws []store.Work
	for i := range 1500 {
		phase := PhaseFailed
		if i%100 == 0 {
			phase = PhaseRunning
		}
		ws = append(ws, store.Work{UID: fmt.Sprintf("w%04d", i), Type: "noop", Phase: phase, Reason: reason})
	}
	if _, err := a.db.ApplySnapshot(ctx, 1, ws); err != nil { // one transaction: fast
		t.Fatal(err)
	}
	if _, err := a.reportNodeState(ctx); err != nil {
		t.Fatal(err)
	}
	envs := outbox(t, a)
	work := envs[0].GetNodeState().GetWork()
	running := 0
	for _, w := range work {
		if w.GetPhase() == PhaseRunning {
			running++
		}
	}
	if running != 15 {
		t.Errorf("NodeState lists %d of the 15 running items", running)
	}
	if last := work[len(work)-1].GetUid(); last != "w1499" {
		t.Errorf("NodeState ends with %s, want the latest item w1499", last)
	}
}

// TestAFullWorkQueueLosesNothing: more items than the queue holds arrive at
// once; those schedule could not queue still run, once each, without
// waiting for a reconnect or a restart.
func TestAFullWorkQueueLosesNothing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	runs := map[string]int{}
	a := newTestAgent(t, map[string]Runner{"count": RunnerFunc(func(_ context.Context, w store.Work) (string, string) {
		mu.Lock()
		defer mu.Unlock()
		runs[w.UID]++
		return PhaseSucceeded, ""
	})})
	a.work = make(chan string, 4)
	const n = 30
	for i := range n {
		uid := fmt.Sprintf("w%02d", i)
		if _, err := a.db.PutWork(ctx, store.Work{UID: uid, Type: "count", Phase: PhasePending}); err != nil {
			t.Fatal(err)
		}
		a.schedule(uid)
	}
	done := make(chan error, 1)
	go func() { done <- a.runWork(ctx) }()
	testkit.Eventually(t, testTimeout, func() string {
		if got := len(outbox(t, a)); got < n {
			return fmt.Sprintf("%d of %d items reported", got, n)
		}
		return ""
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		if uid := fmt.Sprintf("w%02d", i); runs[uid] != 1 {
			t.Errorf("%s ran %d times, want 1", uid, runs[uid])
		}
	}
}

// TestHandleBatchedDispatches feeds Dispatch envelopes of several items
// (Dispatch.more, item i at the envelope's revision + i) to handleBatch: the
// new items are applied once each at their own revisions and the envelope
// acked once, also when the hub publishes it again; a batch past a gap asks
// for a full sync and applies nothing.
func TestHandleBatchedDispatches(t *testing.T) {
	ctx := context.Background()
	a := newTestAgent(t, nil)
	hub := &fakeHub{}
	tr := protocol.NewTracker(0)
	items := func(uids ...string) []*agentv1.WorkItem {
		var out []*agentv1.WorkItem
		for _, uid := range uids {
			out = append(out, &agentv1.WorkItem{Uid: uid, Type: "noop"})
		}
		return out
	}
	batch := protocol.NewDispatches("n1", 2, items("b", "c", "d"))
	beforeGap, afterGap := protocol.NewDispatches("n1", 16, items("k", "l")), protocol.NewDispatches("n1", 20, items("m", "n"))
	steps := []struct {
		name      string
		envs      []*agentv1.Envelope
		acked     []string // ids, in one Ack (nil: no Ack)
		fullSync  uint64   // the agent asks for a full sync from this revision (0: does not)
		scheduled []string
		hubRev    uint64
	}{
		{"a snapshot", []*agentv1.Envelope{protocol.NewSnapshot("n1", 1, items("a"))}, nil, 0, []string{"a"}, 1},
		{"a batch applies every item", []*agentv1.Envelope{batch}, []string{batch.GetId()}, 0, []string{"b", "c", "d"}, 4},
		{"the batch published again is acked, not applied", []*agentv1.Envelope{batch}, []string{batch.GetId()}, 0, nil, 4},
		{"a batch that overlaps what the agent holds applies the new items", []*agentv1.Envelope{protocol.NewDispatches("n1", 3, items("c", "d", "e"))}, nil, 0, []string{"e"}, 5},
		{"a batch past a gap is not applied nor acked", []*agentv1.Envelope{protocol.NewDispatches("n1", 7, items("x", "y"))}, []string{}, 5, nil, 5},
		{"a snapshot past the gap", []*agentv1.Envelope{protocol.NewSnapshot("n1", 9, items("a", "b", "c", "d", "e", "x", "y"))}, nil, 0, []string{"a", "b", "c", "d", "e", "x", "y"}, 9},
		{"batches, single dispatches and a cancel in one run", []*agentv1.Envelope{
			protocol.NewDispatches("n1", 10, items("f", "g")),
			protocol.NewDispatch("n1", 12, items("h")[0]),
			protocol.NewCancel("n1", 13, "f"),
			protocol.NewDispatches("n1", 14, items("i", "j")),
		}, nil, 0, []string{"f", "g", "h", "i", "j"}, 15},
		{"a gap between two batches of a run: the first is applied and acked, the second is not", []*agentv1.Envelope{beforeGap, afterGap},
			[]string{beforeGap.GetId()}, 17, []string{"k", "l"}, 17},
	}
	for _, s := range steps {
		if s.acked == nil && s.fullSync == 0 {
			for _, e := range s.envs {
				s.acked = append(s.acked, e.GetId())
			}
		}
		if err := a.handleBatch(ctx, hub, tr, s.envs); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		var acked []string
		var syncs []*agentv1.Envelope
		for _, e := range hub.take() {
			switch e.GetKind() {
			case agentv1.Kind_KIND_ACK:
				if acked != nil {
					t.Fatalf("%s: more than one Ack", s.name)
				}
				acked = append([]string{e.GetAckOf()}, e.GetAck().GetMore()...)
			case agentv1.Kind_KIND_FULL_SYNC_REQUEST:
				syncs = append(syncs, e)
			}
		}
		if !slices.Equal(acked, s.acked) {
			t.Fatalf("%s: acked %v, want %v", s.name, acked, s.acked)
		}
		if s.fullSync == 0 && len(syncs) > 0 || s.fullSync > 0 && (len(syncs) != 1 || syncs[0].GetFullSyncRequest().GetHaveRevision() != s.fullSync) {
			t.Fatalf("%s: full-sync requests %v, want one from %d (0: none)", s.name, syncs, s.fullSync)
		}
		var scheduled []string
	drain:
		for {
			select {
			case uid := <-a.work:
				scheduled = append(scheduled, uid)
			default:
				break drain
			}
		}
		if !slices.Equal(scheduled, s.scheduled) {
			t.Fatalf("%s: scheduled %v, want %v", s.name, scheduled, s.scheduled)
		}
		if rev, err := a.db.HubRevision(ctx); err != nil || rev != s.hubRev {
			t.Fatalf("%s: hub revision %d (%v), want %d", s.name, rev, err, s.hubRev)
		}
	}
	for uid, want := range map[string]struct {
		rev   uint64
		phase string
	}{"f": {10, PhaseCancelled}, "g": {11, PhasePending}, "h": {12, PhasePending}, "i": {14, PhasePending}, "j": {15, PhasePending}} {
		w, ok, err := a.db.Work(ctx, uid)
		if err != nil || !ok || w.Revision != want.rev || w.Phase != want.phase {
			t.Errorf("work %s: %+v %v %v, want revision %d phase %s", uid, w, ok, err, want.rev, want.phase)
		}
	}
	if _, ok, _ := a.db.Work(ctx, "x"); !ok {
		t.Error("the snapshot's x is not in the DB")
	}
}

// TestFlusherLingersOnlyWhileWorkIsQueued: while the work loop has items
// queued, the outbox flusher waits (lingerForReports) after a wake-up, and
// the reports queued meanwhile go in one Status; with nothing queued it
// never waits.
func TestFlusherLingersOnlyWhileWorkIsQueued(t *testing.T) {
	for _, queued := range []bool{true, false} {
		t.Run(fmt.Sprintf("queued=%v", queued), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			a := newTestAgent(t, nil)
			if queued {
				a.work <- "waiting"
			}
			lingering := make(chan struct{})
			release := make(chan struct{})
			lingered := 0
			a.linger = func(ctx context.Context) error {
				lingered++
				select {
				case lingering <- struct{}{}:
				case <-ctx.Done():
					return ctx.Err()
				}
				select {
				case <-release:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			report := func(uid string) {
				t.Helper()
				if _, err := a.report(ctx, "", "", "", func(rev uint64) *agentv1.Envelope {
					return protocol.NewStatus("n1", rev, &agentv1.WorkStatus{Uid: uid, Phase: PhaseSucceeded})
				}); err != nil {
					t.Fatal(err)
				}
			}
			// a is in the outbox and has kicked the flusher before it starts:
			// the first read sends it, then the kick wakes it.
			report("a")
			hub := &fakeHub{}
			done := make(chan error, 1)
			go func() { done <- a.flushOutbox(ctx, hub) }()
			if queued {
				select {
				case <-lingering:
				case <-time.After(testTimeout):
					t.Fatal("the flusher did not linger with work queued")
				}
				report("b")
				report("c")
				close(release)
			}
			testkit.Eventually(t, testTimeout, func() string {
				if n := len(outbox(t, a)); n > 0 {
					return fmt.Sprintf("%d reports still in the outbox", n)
				}
				return ""
			})
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range hub.take() {
				var uids []string
				for _, w := range append([]*agentv1.WorkStatus{e.GetStatus().GetWork()}, e.GetStatus().GetMore()...) {
					uids = append(uids, w.GetUid())
				}
				got = append(got, strings.Join(uids, "+"))
			}
			want := []string{"a"}
			if queued {
				want = []string{"a", "b+c"}
			}
			if !slices.Equal(got, want) {
				t.Errorf("sent %v, want %v", got, want)
			}
			if queued != (lingered > 0) {
				t.Errorf("lingered %d times with work queued=%v", lingered, queued)
			}
		})
	}
}
