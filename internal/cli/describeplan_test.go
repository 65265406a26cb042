package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
	"github.com/drover-fleet/drover/internal/manager"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/*.golden from the current output; read the diff before committing it")

// TestDescribePlanTree describes a plan half way through: sequence 1 has
// one pool updated and one with a failed node, sequence 2 waits; tasks of
// an updater kind Drover does not know are read as unstructured objects.
func TestDescribePlanTree(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) metav1.Time { return metav1.NewTime(now.Add(-d)) }
	taskGVK := schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "FileUpdateTask"}
	s := manager.Scheme()
	s.AddKnownTypeWithName(taskGVK, &unstructured.Unstructured{})
	s.AddKnownTypeWithName(taskGVK.GroupVersion().WithKind("FileUpdateTaskList"), &unstructured.UnstructuredList{})

	plan := &updatev1.InPlaceUpdatePlan{ObjectMeta: metav1.ObjectMeta{Name: "p1", CreationTimestamp: at(time.Hour)},
		Spec: updatev1.InPlaceUpdatePlanSpec{UpdatePhase: updatev1.PhaseUpdating,
			Pools: []updatev1.PlanPool{{Name: "munich", Sequence: 2}, {Name: "berlin", Sequence: 1}, {Name: "bonn", Sequence: 1}},
			Updaters: []updatev1.Updater{
				{Name: "files", Sequence: 2, UpdaterUpdateTemplateRef: updatev1.ObjectRef{APIVersion: "example.com/v1", Kind: "FileUpdateTaskTemplate", Name: "files", Namespace: "updaters"},
					Responsibilities: []updatev1.Responsibility{{Path: "/files/etc/app.conf", SelectResource: updatev1.SelectConfiguration, Value: "x"}}},
				{Name: "agent", Sequence: 1, UpdaterUpdateTemplateRef: updatev1.ObjectRef{APIVersion: "example.com/v1", Kind: "FileUpdateTaskTemplate", Name: "agent", Namespace: "updaters"}},
			}},
		Status: updatev1.InPlaceUpdatePlanStatus{UpdateStatus: updatev1.StatusUpdating, CurrentSequence: 1,
			Pools: []updatev1.PoolUpdate{{Name: "berlin", Sequence: 1, UpdateStatus: updatev1.StatusUpdated, Nodes: 1, UpdatedNodes: 1},
				{Name: "bonn", Sequence: 1, UpdateStatus: updatev1.StatusFailed, Nodes: 2}},
			Nodes:      updatev1.NodeSummary{Total: 4, Updated: 1, Updating: 1, Failed: 1},
			Failures:   []updatev1.NodeFailure{{Node: "bonn-1", Updater: "files", Reason: "DiskFull", Message: "no space left on /etc"}},
			Conditions: []metav1.Condition{{Type: "Sequence1Update", Status: "False", Reason: "Updating", Message: "2 of 3 nodes updated"}}}}
	pool := func(name string, blocked bool) *updatev1.NodePool {
		p := &updatev1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: updatev1.NodePoolSpec{Selector: metav1.LabelSelector{MatchLabels: map[string]string{"site": name}}}}
		if blocked {
			p.Status.Conditions = []metav1.Condition{{Type: updatev1.PreflightBlockedCondition, Status: metav1.ConditionTrue, Reason: "NodeNotReady", Message: "not Ready: munich-1"}}
		}
		return p
	}
	node := func(name, site, status string, cordoned bool, cond *metav1.Condition) *fleetv1.FleetNode {
		n := &fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"site": site}}}
		if status != "" {
			n.Labels[updatev1.LabelUpdateTaskName] = "p1"
			n.Status.UpdateStatus = status
		}
		n.Spec.Unschedulable = cordoned
		if cond != nil {
			n.Status.Conditions = []metav1.Condition{*cond}
		}
		return n
	}
	task := func(node, updater, status string, created time.Duration, conds ...any) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(taskGVK)
		u.SetNamespace("updaters")
		u.SetName(node + "-" + updater + "-" + status)
		u.SetCreationTimestamp(at(created))
		u.SetLabels(map[string]string{updatev1.LabelUpdateTaskName: "p1", updatev1.LabelNode: node, updatev1.LabelUpdater: updater})
		u.Object["status"] = map[string]any{"updateStatus": status, "conditions": conds}
		return u
	}
	objs := []client.Object{plan, pool("berlin", false), pool("bonn", false), pool("munich", true),
		node("berlin-1", "berlin", "updated", false, nil),
		node("bonn-1", "bonn", "failed", true, &metav1.Condition{Type: updatev1.InPlaceUpdateCondition, Status: "False", Reason: "UpdaterFailed", Message: "files: DiskFull"}),
		node("bonn-2", "bonn", "updating", true, &metav1.Condition{Type: updatev1.InPlaceUpdateCondition, Status: "False", Reason: "Updating", Message: "agent"}),
		node("munich-1", "munich", "", false, nil),
		node("elsewhere", "paris", "", false, nil),
		task("berlin-1", "agent", "updated", 50*time.Minute), task("berlin-1", "files", "updated", 40*time.Minute),
		task("bonn-1", "agent", "updated", 30*time.Minute),
		task("bonn-1", "files", "failed", 20*time.Minute, map[string]any{"type": "Ready", "status": "False", "reason": "DiskFull", "message": "no space left on /etc", "lastTransitionTime": "2026-11-28T11:45:00Z"}),
		// An older attempt of the same updater on the same node is not shown.
		task("bonn-2", "agent", "aborted", 25*time.Minute),
		task("bonn-2", "agent", "updating", 10*time.Minute, map[string]any{"type": "Ready", "status": "False", "reason": "Downloading", "message": "12 of 40 MiB"}),
	}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()

	var out bytes.Buffer
	if err := describePlan(context.Background(), &out, c, "p1", now); err != nil {
		t.Fatalf("describePlan: %v", err)
	}
	golden := filepath.Join("testdata", "describe_plan.golden")
	if *updateGolden {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -run TestDescribePlanTree -update ./internal/cli to write it)", err)
	}
	if out.String() != string(want) {
		t.Errorf("describe plan printed\n%s\nwant (%s)\n%s", out.String(), golden, want)
	}

	if err := describePlan(context.Background(), &out, c, "nope", now); err == nil {
		t.Error("describe of a missing plan: no error")
	}
}

// stepReader hands out a plan's successive states, one per Get, so the
// watch is stepped without any timing.
type stepReader struct {
	client.Reader
	states []updatev1.InPlaceUpdatePlanStatus
	gets   int
}

func (r *stepReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if err := r.Reader.Get(ctx, key, obj, opts...); err != nil {
		return err
	}
	obj.(*updatev1.InPlaceUpdatePlan).Status = r.states[min(r.gets, len(r.states)-1)]
	r.gets++
	return nil
}

func TestWatchPlan(t *testing.T) {
	plan := &updatev1.InPlaceUpdatePlan{ObjectMeta: metav1.ObjectMeta{Name: "p1"}}
	c := fake.NewClientBuilder().WithScheme(manager.Scheme()).WithObjects(plan).Build()
	updating := updatev1.InPlaceUpdatePlanStatus{UpdateStatus: updatev1.StatusUpdating, CurrentSequence: 1, Nodes: updatev1.NodeSummary{Total: 3, Updating: 1}}
	tests := []struct {
		name  string
		last  updatev1.InPlaceUpdatePlanStatus
		lines int
		err   string
	}{
		{"updated", updatev1.InPlaceUpdatePlanStatus{UpdateStatus: updatev1.StatusUpdated, CurrentSequence: 2, Nodes: updatev1.NodeSummary{Total: 3, Updated: 3}}, 2, ""},
		{"failed", updatev1.InPlaceUpdatePlanStatus{UpdateStatus: updatev1.StatusFailed, CurrentSequence: 1, Nodes: updatev1.NodeSummary{Total: 3, Updated: 1, Failed: 1},
			Failures: []updatev1.NodeFailure{{Node: "n2", Updater: "files", Reason: "DiskFull"}}}, 3, "plan p1 ended failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The same state twice prints one line: lines are changes.
			r := &stepReader{Reader: c, states: []updatev1.InPlaceUpdatePlanStatus{updating, updating, tt.last}}
			var out bytes.Buffer
			err := watchPlan(context.Background(), &out, r, "p1", time.Millisecond, nil)
			if tt.err == "" && err != nil || tt.err != "" && (err == nil || err.Error() != tt.err) {
				t.Errorf("watchPlan = %v, want %q", err, tt.err)
			}
			if got := bytes.Count(out.Bytes(), []byte("\n")); got != tt.lines {
				t.Errorf("printed %d lines, want %d:\n%s", got, tt.lines, out.String())
			}
			if r.gets != 3 {
				t.Errorf("read the plan %d times, want 3 (it stops once the plan ends)", r.gets)
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := &stepReader{Reader: c, states: []updatev1.InPlaceUpdatePlanStatus{updating}}
	if err := watchPlan(ctx, &bytes.Buffer{}, r, "p1", time.Hour, nil); err == nil || !errors.Is(err, context.Canceled) {
		t.Errorf("watch with a cancelled context = %v, want context.Canceled", err)
	}
}

// listHook runs after each List, to change the world between two looks.
type listHook struct {
	client.Client
	after func(n int)
	lists int
}

func (h *listHook) List(ctx context.Context, l client.ObjectList, opts ...client.ListOption) error {
	err := h.Client.List(ctx, l, opts...)
	h.lists++
	h.after(h.lists)
	return err
}

func TestWaitDrained(t *testing.T) {
	ctx := context.Background()
	task := func(ns, name, node string, state batchv1.TaskState) *batchv1.Task {
		return &batchv1.Task{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Status: batchv1.TaskStatus{NodeName: node, State: state}}
	}
	c := fake.NewClientBuilder().WithScheme(manager.Scheme()).WithStatusSubresource(&batchv1.Task{}).WithObjects(
		task("a", "scan", "n1", batchv1.TaskRunning), task("b", "map", "n1", batchv1.TaskRunning),
		task("a", "done", "n1", batchv1.TaskCompleted), task("a", "elsewhere", "n9", batchv1.TaskRunning)).Build()
	finish := func(ns, name string) {
		var tk batchv1.Task
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &tk); err != nil {
			t.Fatal(err)
		}
		tk.Status.State = batchv1.TaskCompleted
		if err := c.Status().Update(ctx, &tk); err != nil {
			t.Fatal(err)
		}
	}
	h := &listHook{Client: c, after: func(n int) {
		switch n {
		case 1:
			finish("b", "map")
		case 2:
			finish("a", "scan")
		}
	}}
	var out bytes.Buffer
	if err := waitDrained(ctx, &out, h, []string{"n1"}, time.Millisecond); err != nil {
		t.Fatalf("waitDrained = %v", err)
	}
	want := "waiting for 2 task(s): a/scan on n1, b/map on n1\nwaiting for 1 task(s): a/scan on n1\nnode/n1 drained\n"
	if out.String() != want {
		t.Errorf("printed\n%s\nwant\n%s", out.String(), want)
	}

	// A task that never ends: the wait ends at its deadline, naming it.
	tctx, cancel := context.WithCancel(ctx)
	cancel()
	err := waitDrained(tctx, &bytes.Buffer{}, c, []string{"n9"}, time.Hour)
	if err == nil || !strings.Contains(err.Error(), "a/elsewhere on n9") || !errors.Is(err, context.Canceled) {
		t.Errorf("waitDrained past its deadline = %v, want the running task named", err)
	}
}
