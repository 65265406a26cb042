package hub

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/agent"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/scheduler"
	"github.com/drover-fleet/drover/internal/tenancy"
	"github.com/drover-fleet/drover/internal/testenv"
)

// TestSyncLabels covers the rules of metadata.labels against what the
// agent reports: agent keys follow the agent, operators' keys stay, the
// hub's own keys follow the NodeInfo fields.
func TestSyncLabels(t *testing.T) {
	ann := func(keys string) map[string]string { return map[string]string{fleetv1.AnnotationAgentLabels: keys} }
	tests := []struct {
		name        string
		labels      map[string]string
		annotations map[string]string
		reported    map[string]string // status.reportedLabels before
		info        *agentv1.NodeInfo
		wantLabels  map[string]string
		wantAnn     string
		wantChanged bool
	}{
		{
			name:        "new node",
			info:        &agentv1.NodeInfo{Labels: map[string]string{"site": "berlin", "kind": "robot"}, Os: "linux", Arch: "arm64", Hostname: "edge-1"},
			wantLabels:  map[string]string{"site": "berlin", "kind": "robot", fleetv1.LabelOS: "linux", fleetv1.LabelArch: "arm64", fleetv1.LabelHostname: "edge-1"},
			wantAnn:     "kind,site",
			wantChanged: true,
		},
		{
			name:        "new node without labels",
			info:        &agentv1.NodeInfo{},
			wantAnn:     "",
			wantChanged: true,
		},
		{
			name:        "restart with other labels: added, updated, removed",
			labels:      map[string]string{"site": "berlin", "kind": "robot", "team": "ops"},
			annotations: ann("kind,site"),
			info:        &agentv1.NodeInfo{Labels: map[string]string{"kind": "drone", "zone": "z1"}},
			wantLabels:  map[string]string{"kind": "drone", "zone": "z1", "team": "ops"},
			wantAnn:     "kind,zone",
			wantChanged: true,
		},
		{
			name:        "an operator's label keeps its value and stays the operator's",
			labels:      map[string]string{"kind": "robot", "zone": "manual"},
			annotations: ann("kind"),
			info:        &agentv1.NodeInfo{Labels: map[string]string{"kind": "robot", "zone": "z1"}},
			wantLabels:  map[string]string{"kind": "robot", "zone": "manual"},
			wantAnn:     "kind",
			wantChanged: false,
		},
		{
			name:        "an agent label an operator edited follows the agent again",
			labels:      map[string]string{"kind": "edited"},
			annotations: ann("kind"),
			info:        &agentv1.NodeInfo{Labels: map[string]string{"kind": "robot"}},
			wantLabels:  map[string]string{"kind": "robot"},
			wantAnn:     "kind",
			wantChanged: true,
		},
		{
			name:        "an agent label an operator deleted comes back",
			labels:      map[string]string{},
			annotations: ann("kind"),
			info:        &agentv1.NodeInfo{Labels: map[string]string{"kind": "robot"}},
			wantLabels:  map[string]string{"kind": "robot"},
			wantAnn:     "kind",
			wantChanged: true,
		},
		{
			name:        "no labels any more",
			labels:      map[string]string{"kind": "robot", "team": "ops"},
			annotations: ann("kind"),
			info:        &agentv1.NodeInfo{},
			wantLabels:  map[string]string{"team": "ops"},
			wantAnn:     "",
			wantChanged: true,
		},
		{
			name:        "the hub's own keys follow NodeInfo, not the agent's labels",
			labels:      map[string]string{fleetv1.LabelOS: "linux", fleetv1.LabelHostname: "old"},
			annotations: ann(""),
			info:        &agentv1.NodeInfo{Labels: map[string]string{fleetv1.LabelOS: "plan9", fleetv1.LabelArch: "z80"}, Os: "linux", Hostname: "new"},
			wantLabels:  map[string]string{fleetv1.LabelOS: "linux", fleetv1.LabelHostname: "new"},
			wantAnn:     "",
			wantChanged: true,
		},
		{
			name:        "a node from an older hub: keys equal to the reported labels were the agent's",
			labels:      map[string]string{"site": "berlin", "kind": "robot", "team": "ops", "rack": "hand"},
			reported:    map[string]string{"site": "berlin", "kind": "robot", "rack": "r1"},
			info:        &agentv1.NodeInfo{Labels: map[string]string{"kind": "robot", "zone": "z1", "rack": "r2"}},
			wantLabels:  map[string]string{"kind": "robot", "zone": "z1", "team": "ops", "rack": "hand"},
			wantAnn:     "kind,zone",
			wantChanged: true,
		},
		{
			name:        "nothing changed",
			labels:      map[string]string{"kind": "robot", fleetv1.LabelOS: "linux"},
			annotations: ann("kind"),
			info:        &agentv1.NodeInfo{Labels: map[string]string{"kind": "robot"}, Os: "linux"},
			wantLabels:  map[string]string{"kind": "robot", fleetv1.LabelOS: "linux"},
			wantAnn:     "kind",
			wantChanged: false,
		},
		{
			name:        "no info",
			labels:      map[string]string{"kind": "robot"},
			annotations: ann("kind"),
			wantLabels:  map[string]string{"kind": "robot"},
			wantAnn:     "kind",
			wantChanged: false,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := &fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: maps.Clone(tc.labels), Annotations: maps.Clone(tc.annotations)}}
			n.Status.ReportedLabels = tc.reported
			changed := syncLabels(n, tc.info)
			if changed != tc.wantChanged {
				t.Errorf("changed %v, want %v", changed, tc.wantChanged)
			}
			if !maps.Equal(n.Labels, tc.wantLabels) {
				t.Errorf("labels %v, want %v", n.Labels, tc.wantLabels)
			}
			if got := n.Annotations[fleetv1.AnnotationAgentLabels]; got != tc.wantAnn {
				t.Errorf("annotation %q, want %q", got, tc.wantAnn)
			}
		})
	}
}

// TestAgentLabelsAndCapacityReachScheduler: an agent restarted with other
// labels moves its FleetNode's metadata.labels with it (an operator's label
// stays), and an extended resource it reports lands in status.capacity; the
// scheduler, which reads both, places tasks accordingly.
func TestAgentLabelsAndCapacityReachScheduler(t *testing.T) {
	f := newFixture(t, "hub-agent-labels")
	h := f.startHub(Options{Name: "hub-agent-labels", Features: feature(nil, &sink{})})
	const node = "agent-labels-node"
	opts := f.agentOpts(node, h, newRunner())
	opts.Labels = map[string]string{"site": "berlin", "kind": "robot"}
	opts.Capacity = map[string]string{"cpu": "1", "gpu": "2"}
	a := f.startAgent(opts)
	waitConnected(t, h, node)

	get := func(ctx context.Context) (*fleetv1.FleetNode, error) {
		var fn fleetv1.FleetNode
		return &fn, f.c.Get(ctx, client.ObjectKey{Name: node}, &fn)
	}
	waitLabels := func(what string, want map[string]string, wantAnn string) *fleetv1.FleetNode {
		t.Helper()
		var fn *fleetv1.FleetNode
		testenv.Eventually(t, waitTimeout, what, func(ctx context.Context) (bool, error) {
			var err error
			if fn, err = get(ctx); err != nil {
				return false, err
			}
			for k, v := range want {
				if fn.Labels[k] != v {
					return false, fmt.Errorf("labels %v", fn.Labels)
				}
			}
			if got := fn.Annotations[fleetv1.AnnotationAgentLabels]; got != wantAnn {
				return false, fmt.Errorf("annotation %q, want %q", got, wantAnn)
			}
			if fn.Status.Phase != fleetv1.FleetNodeOnline {
				return false, fmt.Errorf("phase %q", fn.Status.Phase)
			}
			// Labels are patched before the connect's status write, which
			// carries what the agent reported: wait for that too.
			if !maps.Equal(fn.Status.ReportedLabels, opts.Labels) {
				return false, fmt.Errorf("reportedLabels %v, want %v", fn.Status.ReportedLabels, opts.Labels)
			}
			return true, nil
		})
		return fn
	}
	fn := waitLabels("first labels", map[string]string{"site": "berlin", "kind": "robot"}, "kind,site")
	if q, want := fn.Status.Capacity["gpu"], resource.MustParse("2"); q.Cmp(want) != 0 {
		t.Errorf("capacity gpu %s, want 2 (capacity %v)", q.String(), fn.Status.Capacity)
	}

	// An operator labels the node by hand, one key the agent will report later.
	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	patch := client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"labels":{"team":"ops","rack":"r1"}}}`))
	if err := f.c.Patch(ctx, &fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: node}}, patch); err != nil {
		t.Fatal(err)
	}
	writesBefore := h.counter(t, "drover_hub_api_writes_total", "labels")

	a.stop(t)
	opts.Labels = map[string]string{"kind": "robot", "zone": "z1", "rack": "r9"}
	f.startAgent(opts)
	fn = waitLabels("labels after the restart", map[string]string{"kind": "robot", "zone": "z1", "team": "ops", "rack": "r1"}, "kind,zone")
	if _, ok := fn.Labels["site"]; ok {
		t.Errorf("label site still there after the agent stopped reporting it: %v", fn.Labels)
	}
	if !maps.Equal(fn.Status.ReportedLabels, opts.Labels) {
		t.Errorf("reportedLabels %v, want %v", fn.Status.ReportedLabels, opts.Labels)
	}
	if got := h.counter(t, "drover_hub_api_writes_total", "labels") - writesBefore; got != 1 {
		t.Errorf("label writes for the restart: %v, want 1", got)
	}

	c := scheduler.New([]scheduler.Node{scheduler.NodeFrom(fn)})
	place := func(selector map[string]string, gpus string) scheduler.Result {
		t.Helper()
		tk, err := scheduler.TaskFrom(&batchv1.Task{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "t"},
			Spec: batchv1.TaskSpec{
				NodeSelector: &metav1.LabelSelector{MatchLabels: selector},
				Resources:    corev1.ResourceList{"gpu": resource.MustParse(gpus)},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		// The node is granted to the task's namespace: only its labels
		// and capacity are tested here.
		p, _ := tenancy.Compile([]fleetv1.NodeGrant{{ObjectMeta: metav1.ObjectMeta{Name: "all"}, Spec: fleetv1.NodeGrantSpec{Namespaces: []string{"ns"}}}})
		tk.Access = p.For("ns", nil)
		return c.Place(tk)
	}
	if r := place(map[string]string{"zone": "z1"}, "1"); r.Node != node {
		t.Errorf("zone z1, 1 gpu: %+v, want node %s", r, node)
	}
	if r := place(map[string]string{"site": "berlin"}, "1"); r.Node != "" {
		t.Errorf("site berlin: placed on %s, want nowhere", r.Node)
	}
	if r := place(map[string]string{"kind": "robot"}, "2"); r.Node != "" {
		t.Errorf("2 more gpus with 1 held of 2: placed on %s, want nowhere", r.Node)
	}
}

// TestAgentCapacityRulesMatchHub: what drover-agent's --capacity accepts
// (checked without k8s.io) the hub accepts too, and the other way round
// for non-negative quantities, so an agent never starts with capacity that
// would get it refused at registration (the agent is stricter only about
// negative quantities and apimachinery's oddities "." and "e3").
func TestAgentCapacityRulesMatchHub(t *testing.T) {
	names := []string{"gpu", "nvidia.com/gpu", "a_b.c-d", "x", "-gpu", "gpu-", "my gpu", "Example.com/gpu", "/gpu", "a/b/c", "a..b/gpu", "example.com/", strings.Repeat("g", 63), strings.Repeat("g", 64)}
	quantities := []string{"0", "1", "2.", ".5", "1.5", "500m", "100n", "3u", "8Ki", "8Mi", "8Gi", "1Ti", "1Pi", "1Ei", "1k", "1M", "1G", "1T", "1P", "1E", "1e3", "12E-2", "1e+2",
		"", "-1", "one", "8GB", "8gi", "8K", "1 2", "1e", "e3", ".", "0x10", "1.2.3", "1Ki2"}
	for _, name := range names {
		for _, q := range quantities {
			_, agentErr := agent.ParseCapacity(name + "=" + q)
			hubErr := validateInfo(&agentv1.NodeInfo{Capacity: map[string]string{name: q}})
			if agentErr == nil && hubErr != nil {
				t.Errorf("%s=%s: the agent accepts it, the hub refuses it: %v", name, q, hubErr)
			}
			// apimachinery also reads "." and "e3" (as 0): the agent
			// refuses those on purpose, and negative quantities.
			if agentErr != nil && hubErr == nil && !strings.HasPrefix(q, "-") && q != "." && q != "e3" {
				t.Errorf("%s=%s: the hub accepts it, the agent refuses it: %v", name, q, agentErr)
			}
		}
	}
}
