package scheduler

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/tenancy"
)

func res(kv ...string) corev1.ResourceList {
	out := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return out
}

func online(name string, capacity corev1.ResourceList, labels map[string]string) Node {
	return Node{Name: name, Phase: fleetv1.FleetNodeOnline, Capacity: capacity, Labels: labels}
}

func task(key string, mutate func(*batchv1.Task)) Task {
	t := &batchv1.Task{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: key, Labels: map[string]string{batchv1.LabelTaskGroup: "g"}}}
	if mutate != nil {
		mutate(t)
	}
	out, err := TaskFrom(t)
	if err != nil {
		panic(err)
	}
	out.Access = everyNode.For(t.Namespace, nil)
	return out
}

// everyNode grants namespace ns every node, as its task user: the policy
// of the tests that are not about tenancy.
var everyNode = policy(fleetv1.NodeGrant{ObjectMeta: metav1.ObjectMeta{Name: "all"},
	Spec: fleetv1.NodeGrantSpec{Namespaces: []string{"ns"}}})

func policy(grants ...fleetv1.NodeGrant) *tenancy.Policy {
	p, errs := tenancy.Compile(grants)
	if len(errs) > 0 {
		panic(fmt.Sprint(errs))
	}
	return p
}

func TestPlace(t *testing.T) {
	type held struct {
		task Task
		node string
	}
	tests := []struct {
		name    string
		nodes   []Node
		held    []held
		task    Task
		want    string // node, or "" and then message
		message string
	}{
		{
			name:  "selector",
			nodes: []Node{online("a", nil, map[string]string{"site": "x"}), online("b", nil, map[string]string{"site": "y"})},
			task: task("t", func(t *batchv1.Task) {
				t.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"site": "y"}}
			}),
			want: "b",
		},
		{
			name:  "nodeName pins",
			nodes: []Node{online("a", nil, nil), online("b", nil, nil), online("c", nil, nil)},
			task:  task("t", func(t *batchv1.Task) { t.Spec.NodeName = "c" }),
			want:  "c",
		},
		{
			name:  "capacity minus what is held",
			nodes: []Node{online("a", res("cpu", "2"), nil), online("b", res("cpu", "4"), nil)},
			held:  []held{{task("h1", func(t *batchv1.Task) { t.Spec.Resources = res("cpu", "3500m") }), "b"}},
			task:  task("t", func(t *batchv1.Task) { t.Spec.Resources = res("cpu", "1") }),
			want:  "a",
		},
		{
			name:    "a resource the node does not report is missing",
			nodes:   []Node{online("a", res("cpu", "2"), nil)},
			task:    task("t", func(t *batchv1.Task) { t.Spec.Resources = res("nvidia.com/gpu", "1") }),
			message: "0/1 nodes are available: 1 insufficient nvidia.com/gpu.",
		},
		{
			name:  "least loaded wins",
			nodes: []Node{online("a", res("cpu", "4", "memory", "4Gi"), nil), online("b", res("cpu", "4", "memory", "4Gi"), nil)},
			held:  []held{{task("h1", func(t *batchv1.Task) { t.Spec.Resources = res("memory", "1Gi") }), "a"}},
			task:  task("t", func(t *batchv1.Task) { t.Spec.Resources = res("cpu", "1") }),
			want:  "b",
		},
		{
			name:  "without resources, fewest tasks wins",
			nodes: []Node{online("a", nil, nil), online("b", nil, nil)},
			held:  []held{{task("h1", nil), "a"}},
			task:  task("t", nil),
			want:  "b",
		},
		{
			name: "spread over a label within maxSkew",
			nodes: []Node{
				online("a1", res("cpu", "8"), map[string]string{"zone": "a"}),
				online("a2", res("cpu", "8"), map[string]string{"zone": "a"}),
				online("b1", res("cpu", "1"), map[string]string{"zone": "b"}),
			},
			// zone a already holds one of the group's tasks, zone b none:
			// a second in zone a would make the skew 2.
			held: []held{{task("h1", nil), "a1"}},
			task: task("t", func(t *batchv1.Task) {
				t.Spec.Spread = &batchv1.SpreadConstraint{TopologyKey: "zone", MaxSkew: 1}
				t.Spec.Resources = res("cpu", "100m")
			}),
			want: "b1",
		},
		{
			name: "spread counts only the task's own group",
			nodes: []Node{
				online("a1", nil, map[string]string{"zone": "a"}),
				online("b1", nil, map[string]string{"zone": "b"}),
			},
			held: []held{
				{task("other", func(t *batchv1.Task) { t.Labels[batchv1.LabelTaskGroup] = "other" }), "b1"},
				{task("other2", func(t *batchv1.Task) { t.Labels[batchv1.LabelTaskGroup] = "other" }), "b1"},
				{task("h1", nil), "b1"},
			},
			task: task("t", func(t *batchv1.Task) { t.Spec.Spread = &batchv1.SpreadConstraint{TopologyKey: "zone", MaxSkew: 1} }),
			want: "a1",
		},
		{
			name: "spread blocks when the emptier domain is full",
			nodes: []Node{
				online("a1", res("cpu", "8"), map[string]string{"zone": "a"}),
				online("b1", res("cpu", "1"), map[string]string{"zone": "b"}),
				online("nolabel", res("cpu", "8"), nil),
			},
			held: []held{
				{task("h1", func(t *batchv1.Task) { t.Spec.Resources = res("cpu", "1") }), "a1"},
				{task("h2", func(t *batchv1.Task) { t.Spec.Resources = res("cpu", "1") }), "b1"},
				{task("h3", func(t *batchv1.Task) { t.Spec.Resources = res("cpu", "1") }), "a1"},
			},
			task: task("t", func(t *batchv1.Task) {
				t.Spec.Spread = &batchv1.SpreadConstraint{TopologyKey: "zone", MaxSkew: 1}
				t.Spec.Resources = res("cpu", "1")
			}),
			message: "0/3 nodes are available: 1 did not satisfy spread constraint, 1 insufficient cpu, 1 missing label zone.",
		},
		{
			name: "reasons message",
			nodes: []Node{
				{Name: "off1", Phase: fleetv1.FleetNodeOffline},
				{Name: "off2", Phase: fleetv1.FleetNodeOffline},
				online("other1", res("cpu", "8"), map[string]string{"site": "other"}),
				online("other2", res("cpu", "8"), nil),
				online("small", res("cpu", "1"), map[string]string{"site": "here"}),
			},
			task: task("t", func(t *batchv1.Task) {
				t.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"site": "here"}}
				t.Spec.Resources = res("cpu", "2")
			}),
			message: "0/5 nodes are available: 2 Offline, 2 did not match nodeSelector, 1 insufficient cpu.",
		},
		{
			name: "unschedulable, pending and pinned elsewhere",
			nodes: []Node{
				{Name: "cordoned", Phase: fleetv1.FleetNodeOnline, Unschedulable: true},
				{Name: "new", Phase: fleetv1.FleetNodePending},
				online("free", nil, nil),
			},
			task:    task("t", func(t *batchv1.Task) { t.Spec.NodeName = "cordoned" }),
			message: "0/3 nodes are available: 2 did not match nodeName, 1 unschedulable.",
		},
		{
			name: "preferred nodes outweigh load",
			nodes: []Node{online("a", res("cpu", "4"), map[string]string{"gpu": "yes"}), online("b", res("cpu", "4"), map[string]string{"site": "x"}),
				online("c", res("cpu", "4"), map[string]string{"gpu": "yes", "site": "x"}), online("d", res("cpu", "4"), nil)},
			held: []held{{task("h1", func(t *batchv1.Task) { t.Spec.Resources = res("cpu", "2") }), "c"}},
			task: task("t", func(t *batchv1.Task) {
				t.Spec.Resources = res("cpu", "1")
				t.Spec.PreferredNodes = []batchv1.PreferredNodeTerm{
					{Weight: 10, Selector: metav1.LabelSelector{MatchLabels: map[string]string{"gpu": "yes"}}},
					{Weight: 5, Selector: metav1.LabelSelector{MatchLabels: map[string]string{"site": "x"}}},
				}
			}),
			want: "c", // 15, though the most loaded
		},
		{
			name:  "a preferred node that does not fit loses to one that does",
			nodes: []Node{online("a", res("cpu", "1"), map[string]string{"gpu": "yes"}), online("b", res("cpu", "4"), nil)},
			task: task("t", func(t *batchv1.Task) {
				t.Spec.Resources = res("cpu", "2")
				t.Spec.PreferredNodes = []batchv1.PreferredNodeTerm{{Weight: 100, Selector: metav1.LabelSelector{MatchLabels: map[string]string{"gpu": "yes"}}}}
			}),
			want: "b",
		},
		{
			name: "a disconnected node takes no new work",
			nodes: []Node{{Name: "gone", Phase: fleetv1.FleetNodeOnline, Disconnected: true},
				{Name: "busy", Phase: fleetv1.FleetNodeOnline, Capacity: res("cpu", "1")}},
			held:    []held{{task("h1", func(t *batchv1.Task) { t.Spec.Resources = res("cpu", "1") }), "busy"}},
			task:    task("t", func(t *batchv1.Task) { t.Spec.Resources = res("cpu", "1") }),
			message: "0/2 nodes are available: 1 Disconnected, 1 insufficient cpu.",
		},
		{
			name:  "maxPerNode skips a node holding as many of the group",
			nodes: []Node{online("a", nil, nil), online("b", nil, nil)},
			held:  []held{{task("h1", nil), "a"}, {task("h2", nil), "b"}, {task("h3", nil), "b"}},
			task:  task("t", func(t *batchv1.Task) { t.Spec.MaxPerNode = ptr.To[int32](2) }),
			want:  "a",
		},
		{
			name:    "maxPerNode with every node full: insufficient nodes",
			nodes:   []Node{online("a", nil, nil), online("b", nil, nil), {Name: "c", Phase: fleetv1.FleetNodeOffline}},
			held:    []held{{task("h1", nil), "a"}, {task("h2", nil), "b"}},
			task:    task("t", func(t *batchv1.Task) { t.Spec.MaxPerNode = ptr.To[int32](1) }),
			message: "insufficient nodes for maxPerNode=1: 0/3 nodes are available: 2 already hold maxPerNode of the group's tasks, 1 Offline.",
		},
		{
			name:  "maxPerNode counts only the task's own group",
			nodes: []Node{online("a", nil, nil)},
			held: []held{{task("h1", func(t *batchv1.Task) {
				t.Labels[batchv1.LabelTaskGroup] = "other"
			}), "a"}},
			task: task("t", func(t *batchv1.Task) { t.Spec.MaxPerNode = ptr.To[int32](1) }),
			want: "a",
		},
		{
			name:  "maxPerNode does not bind a task of no group",
			nodes: []Node{online("a", nil, nil)},
			held:  []held{{task("h1", func(t *batchv1.Task) { t.Labels = nil }), "a"}},
			task: task("t", func(t *batchv1.Task) {
				t.Labels = nil
				t.Spec.MaxPerNode = ptr.To[int32](1)
			}),
			want: "a",
		},
		{
			name:    "no nodes",
			task:    task("t", nil),
			message: "0/0 nodes are available: no FleetNodes.",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := New(tt.nodes)
			for _, h := range tt.held {
				c.Hold(h.task, h.node)
			}
			got := c.Place(tt.task)
			if got.Node != tt.want {
				t.Fatalf("node = %q, want %q (message %q)", got.Node, tt.want, got.Message)
			}
			if tt.want == "" && got.Message != tt.message {
				t.Errorf("message = %q\nwant      %q", got.Message, tt.message)
			}
		})
	}
}

// Placing holds: a node filled by earlier placements takes no more, and the
// group's tasks spread one per node with maxSkew 1.
func TestPlaceAccountsForEarlierPlacements(t *testing.T) {
	c := New([]Node{online("a", res("cpu", "2"), nil), online("b", res("cpu", "2"), nil)})
	got := map[string]int{}
	for i := range 5 {
		r := c.Place(task(fmt.Sprintf("t%d", i), func(t *batchv1.Task) {
			t.Spec.Resources = res("cpu", "1")
			t.Spec.Spread = &batchv1.SpreadConstraint{MaxSkew: 1}
		}))
		got[r.Node]++
		if i == 4 && r.Message != "0/2 nodes are available: 2 insufficient cpu." {
			t.Errorf("fifth task: %q", r.Message)
		}
	}
	if got["a"] != 2 || got["b"] != 2 || got[""] != 1 {
		t.Errorf("placements = %v, want 2 on each node and 1 unplaced", got)
	}
}

func TestSort(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	mk := func(key string, prio int32, age time.Duration) Task {
		return Task{Key: key, Priority: prio, Created: t0.Add(-age)}
	}
	tasks := []Task{mk("low-old", 0, time.Hour), mk("high-new", 10, 0), mk("b-same", 0, time.Minute), mk("a-same", 0, time.Minute), mk("high-old", 10, time.Hour)}
	Sort(tasks)
	var got []string
	for _, x := range tasks {
		got = append(got, x.Key)
	}
	want := "[high-old high-new low-old a-same b-same]"
	if fmt.Sprint(got) != want {
		t.Errorf("order = %v, want %s", got, want)
	}
}

func TestTaskFromRejectsABadSelector(t *testing.T) {
	bad := &batchv1.Task{Spec: batchv1.TaskSpec{NodeSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "k", Operator: "Sideways"}}}}}
	if _, err := TaskFrom(bad); err == nil {
		t.Error("TaskFrom accepted an invalid selector")
	}
}

func TestTaskFromChecksResources(t *testing.T) {
	for _, tc := range []struct {
		name      string
		resources corev1.ResourceList
		wantErr   string // "" accepts
	}{
		{name: "standard and extended", resources: res("cpu", "1", "memory", "1Gi", "ephemeral-storage", "1Gi", "gpu", "1", "example.com/fpga", "2")},
		{name: "negative", resources: res("cpu", "-100"), wantErr: "spec.resources[cpu] is negative (-100)"},
		{name: "misspelt", resources: res("cpu", "1", "memroy", "1Gi"), wantErr: `spec.resources[memroy]: "memroy" is not a resource name`},
		{name: "unprefixed extended", resources: res("fpga", "1"), wantErr: "spec.resources[fpga]"},
		{name: "reserved prefix", resources: res("kubernetes.io/fpga", "1"), wantErr: "spec.resources[kubernetes.io/fpga]"},
	} {
		tk := &batchv1.Task{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "t"}, Spec: batchv1.TaskSpec{Resources: tc.resources}}
		_, err := TaskFrom(tk)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%s: %v, want accepted", tc.name, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrInvalidResources)):
			t.Errorf("%s: %v, want ErrInvalidResources saying %q", tc.name, err, tc.wantErr)
		}
	}
}

// maxPerNode 1 with more tasks than nodes: one per node, the rest
// unplaced as insufficient nodes (before, two landed on one node).
func TestPlaceMaxPerNode(t *testing.T) {
	c := New([]Node{online("a", nil, nil), online("b", nil, nil)})
	got := map[string]int{}
	for i := range 3 {
		r := c.Place(task(fmt.Sprintf("t%d", i), func(t *batchv1.Task) { t.Spec.MaxPerNode = ptr.To[int32](1) }))
		got[r.Node]++
		if r.Node == "" && !r.InsufficientNodes {
			t.Errorf("task %d unplaced without InsufficientNodes: %q", i, r.Message)
		}
	}
	if got["a"] != 1 || got["b"] != 1 || got[""] != 1 {
		t.Errorf("placements = %v, want 1 on each node and 1 unplaced", got)
	}
}

func TestNodeFromReadsDisconnected(t *testing.T) {
	n := &fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Status: fleetv1.FleetNodeStatus{Phase: fleetv1.FleetNodeOnline,
		Conditions: []metav1.Condition{{Type: fleetv1.ReadyCondition, Status: metav1.ConditionUnknown, Reason: fleetv1.ReasonDisconnected}}}}
	if !NodeFrom(n).Disconnected {
		t.Error("Ready Unknown/Disconnected not read as disconnected")
	}
	n.Status.Conditions[0].Status, n.Status.Conditions[0].Reason = metav1.ConditionTrue, fleetv1.ReasonConnected
	if NodeFrom(n).Disconnected {
		t.Error("Ready True read as disconnected")
	}
}
