package hub

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// testFeature is a Feature made of a test's parts: works for its items,
// a sink for its reports (either may be nil), owning the uids with prefix
// (every uid when empty). assigned says which node a uid is (nil: every
// node is given every uid, for the tests about anything else).
type testFeature struct {
	name     string
	prefix   string
	works    WorkSource
	sink     StatusSink
	assigned func(node, uid string) bool

	mu   sync.Mutex
	err  error // WorkFor fails with it when set
	link Link
}

var (
	_ Feature = (*testFeature)(nil)
	_ Readier = (*testFeature)(nil)
)

// feature is the one feature of a hub whose tests need only items and reports.
func feature(w WorkSource, s StatusSink) []Feature {
	return []Feature{&testFeature{name: "test", works: w, sink: s}}
}

func (f *testFeature) Name() string         { return f.name }
func (f *testFeature) Owns(uid string) bool { return strings.HasPrefix(uid, f.prefix) }

func (f *testFeature) Assigned(_ context.Context, node, uid string) bool {
	return f.assigned == nil || f.assigned(node, uid)
}

func (f *testFeature) Attach(l Link) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.link = l
}

func (f *testFeature) attached() Link {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.link
}

// Ready is the works' Ready when it can tell.
func (f *testFeature) Ready() bool {
	r, ok := f.works.(Readier)
	return !ok || r.Ready()
}

func (f *testFeature) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

func (f *testFeature) WorkFor(ctx context.Context, node string) ([]*agentv1.WorkItem, error) {
	f.mu.Lock()
	err := f.err
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if f.works == nil {
		return nil, nil
	}
	return f.works.WorkFor(ctx, node)
}

func (f *testFeature) WorkStatus(ctx context.Context, node string, st *agentv1.WorkStatus) {
	if f.sink != nil {
		f.sink.WorkStatus(ctx, node, st)
	}
}

func (f *testFeature) NodeState(ctx context.Context, node string, work []*agentv1.WorkStatus) {
	if f.sink != nil {
		f.sink.NodeState(ctx, node, work)
	}
}

// logFeature is a testFeature that finds task logs.
type logFeature struct{ testFeature }

func (*logFeature) LogTarget(context.Context, string, string, int32) (string, string, error) {
	return "", "", errors.New("no logs here")
}

func uidsOf(items []*agentv1.WorkItem) []string {
	var out []string
	for _, it := range items {
		out = append(out, it.GetUid())
	}
	return out
}

// TestRouterRoutesByOwner: a node's list holds every feature's items, each
// report goes to the feature owning its uid, a NodeState is split by owner
// (a feature owning none of it gets an empty one), and what no feature
// owns is dropped and counted.
func TestRouterRoutesByOwner(t *testing.T) {
	var taskWorks, jobWorks works
	var tasks, jobs sink
	taskWorks.add("n1", &agentv1.WorkItem{Uid: "task-a-1", Type: "task-exec"})
	jobWorks.add("n1", &agentv1.WorkItem{Uid: "job-x", Type: "upgrade"})
	unrouted := prometheus.NewCounter(prometheus.CounterOpts{Name: "unrouted"})
	r, err := newRouter([]Feature{
		&testFeature{name: "task", prefix: "task-", works: &taskWorks, sink: &tasks},
		&testFeature{name: "nodejob", prefix: "job-", works: &jobWorks, sink: &jobs},
	}, unrouted, foreignVec(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()

	items, err := r.WorkFor(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if got := uidsOf(items); !slices.Equal(got, []string{"task-a-1", "job-x"}) {
		t.Errorf("WorkFor = %v, want both features' items", got)
	}

	r.WorkStatus(ctx, "n1", &agentv1.WorkStatus{Uid: "task-a-1", Phase: "Running"})
	r.WorkStatus(ctx, "n1", &agentv1.WorkStatus{Uid: "job-x", Phase: "Succeeded"})
	r.WorkStatus(ctx, "n1", &agentv1.WorkStatus{Uid: "nobodys", Phase: "Succeeded"})
	if got := tasks.statuses("n1", "task-a-1"); len(got) != 1 || len(tasks.statuses("n1", "job-x")) != 0 {
		t.Errorf("task feature got %d of its own reports, or some of node jobs'", len(got))
	}
	if got := jobs.statuses("n1", "job-x"); len(got) != 1 || len(jobs.statuses("n1", "task-a-1")) != 0 {
		t.Errorf("nodejob feature got %d of its own reports, or some of tasks'", len(got))
	}
	if len(tasks.statuses("n1", "nobodys"))+len(jobs.statuses("n1", "nobodys")) != 0 {
		t.Error("a report no feature owns reached a feature")
	}
	if n := testutil.ToFloat64(unrouted); n != 1 {
		t.Errorf("unrouted reports = %v after one report nobody owns, want 1", n)
	}

	r.NodeState(ctx, "n1", []*agentv1.WorkStatus{{Uid: "job-x"}, {Uid: "job-y"}, {Uid: "stray"}})
	ts, js := tasks.nodeStates("n1"), jobs.nodeStates("n1")
	if len(ts) != 1 || len(ts[0].work) != 0 {
		t.Errorf("task feature got NodeStates %v, want one, empty (it replaces what the feature knew)", ts)
	}
	if len(js) != 1 || len(js[0].work) != 2 {
		t.Errorf("nodejob feature got NodeStates %v, want one with both of its items", js)
	}
	if n := testutil.ToFloat64(unrouted); n != 2 {
		t.Errorf("unrouted reports = %v after a NodeState with one stray entry, want 2", n)
	}
}

// TestRouterFailsTheSnapshotWithAFeature: one feature failing fails the
// whole list, naming the feature: a snapshot without its items would make
// the agent cancel them.
func TestRouterFailsTheSnapshotWithAFeature(t *testing.T) {
	var ok works
	ok.add("n1", &agentv1.WorkItem{Uid: "a-1", Type: "noop"})
	r, err := newRouter([]Feature{
		&testFeature{name: "fine", prefix: "a-", works: &ok},
		func() Feature {
			f := &testFeature{name: "broken", prefix: "b-"}
			f.fail(errors.New("cache not synced"))
			return f
		}(),
	}, prometheus.NewCounter(prometheus.CounterOpts{Name: "unrouted"}), foreignVec(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	items, err := r.WorkFor(t.Context(), "n1")
	if err == nil || !strings.Contains(err.Error(), "broken") || !strings.Contains(err.Error(), "cache not synced") {
		t.Fatalf("WorkFor = %v, %v; want an error naming the broken feature and why", uidsOf(items), err)
	}
}

// TestNewChecksFeatures: New refuses features it could not route between
// and attaches each of the others to the hub with a link that refuses
// items the feature does not own.
func TestNewChecksFeatures(t *testing.T) {
	// New only keeps the client; nothing here reaches an API.
	c := fake.NewClientBuilder().Build()
	bad := []struct {
		name     string
		features []Feature
		want     string
	}{
		{"a nil feature", []Feature{nil}, "nil"},
		{"a feature without a name", []Feature{&testFeature{}}, "no name"},
		{"two features of one name", []Feature{&testFeature{name: "x"}, &testFeature{name: "x"}}, `"x"`},
		{"two features finding logs", []Feature{&logFeature{testFeature{name: "x"}}, &logFeature{testFeature{name: "y"}}}, "both find task logs"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(Options{Name: "hub-features", Client: c, Features: tc.features})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New = %v, want an error containing %q", err, tc.want)
			}
		})
	}

	f := &testFeature{name: "mine", prefix: "mine-"}
	lf := &logFeature{testFeature{name: "logs", prefix: "logs-"}}
	h, err := New(Options{Name: "hub-features", Client: c, Features: []Feature{f, lf}})
	if err != nil {
		t.Fatal(err)
	}
	l := f.attached()
	if l == nil {
		t.Fatal("New did not attach the feature")
	}
	if l.HubName() != "hub-features" {
		t.Errorf("HubName = %q, want the hub's name", l.HubName())
	}
	if h.logs == nil {
		t.Error("the hub did not find the feature that finds logs")
	}
	err = l.Dispatch("n1", &agentv1.WorkItem{Uid: "other-1", Type: "noop"})
	if err == nil || !strings.Contains(err.Error(), "does not own") {
		t.Errorf("Dispatch of another feature's uid = %v, want a refusal", err)
	}
	_, err = l.Call(t.Context(), "n1", &agentv1.WorkItem{Uid: "other-1", Type: "noop"}, nil)
	if err == nil || !strings.Contains(err.Error(), "does not own") {
		t.Errorf("Call of another feature's uid = %v, want a refusal", err)
	}
	err = l.Dispatch("n1", &agentv1.WorkItem{Uid: "mine-1", Type: "noop"})
	if err == nil || !strings.Contains(err.Error(), "not connected") {
		t.Errorf("Dispatch of an owned uid to a node without a stream = %v, want 'not connected'", err)
	}
}

// TestSnapshotJoinsTheFeatures: through a real hub, a node's snapshot holds
// every feature's items, and a feature that cannot list its items keeps the
// node's stream from opening (Unavailable, naming the feature).
func TestSnapshotJoinsTheFeatures(t *testing.T) {
	f := newFixture(t, "hub-features-snap")
	var a, b works
	a.add("snap-node", &agentv1.WorkItem{Uid: "a-1", Type: "noop"})
	b.add("snap-node", &agentv1.WorkItem{Uid: "b-1", Type: "noop"})
	broken := &testFeature{name: "broken", prefix: "c-"}
	h := f.startHub(Options{Name: "hub-features-snap", Features: []Feature{
		&testFeature{name: "a", prefix: "a-", works: &a},
		&testFeature{name: "b", prefix: "b-", works: &b},
		broken,
	}})
	const node = "snap-node"
	c := f.registerRaw(h, node).client(t, h.addr, false)
	envs := streamEnvelopes(t, h, c, node)
	snap := nextOfKind(t, envs, agentv1.Kind_KIND_SNAPSHOT)
	got := uidsOf(snap.GetSnapshot().GetItems())
	slices.Sort(got)
	if !slices.Equal(got, []string{"a-1", "b-1"}) {
		t.Errorf("snapshot holds %v, want both features' items", got)
	}

	broken.fail(errors.New("cache not synced"))
	const other = "snap-other"
	oc := f.registerRaw(h, other).client(t, h.addr, false)
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	stream, err := oc.GetMessage(ctx, &agentv1.GetMessageRequest{})
	for err == nil {
		// The configuration comes first; the refusal ends the stream.
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "broken") {
		t.Fatalf("stream while a feature cannot list its work: %v, want Unavailable naming the feature", err)
	}
}

func foreignVec() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "foreign"}, []string{"feature"})
}
