package hub

import (
	"context"
	"fmt"
	"k8s.io/apimachinery/pkg/util/rand"
	"runtime"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/agent"
	"github.com/drover-fleet/drover/internal/fleetnode"
	"github.com/drover-fleet/drover/internal/fleetnode/fleetnodectl"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/scheduler"
	"github.com/drover-fleet/drover/internal/tenancy"
	"github.com/drover-fleet/drover/internal/testenv"
)

// startNodeManager runs the manager's FleetNode controller until the test
// ends: it holds what agents report against what was approved.
func startNodeManager(t *testing.T) {
	t.Helper()
	skip := true
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: testScheme(), Metrics: metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0", Controller: config.Controller{SkipNameValidation: &skip}})
	if err != nil {
		t.Fatal(err)
	}
	r := &fleetnodectl.Reconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("drover-manager")}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
}

// TestAgentLabelsAndCapacityAsApproved: what an agent reports of its labels
// and capacity reaches placement only as approved. An auto-approved node
// carries the labels it registered with; after a restart with other labels
// (one added, one dropped) and a bigger capacity claim, it keeps the
// approved labels and capacity, with conditions and Events saying what
// waits, until it is approved again; an operator's own label stays
// throughout. The scheduler, reading the node, places accordingly.
func TestAgentLabelsAndCapacityAsApproved(t *testing.T) {
	f := newFixture(t, "hub-agent-labels")
	startNodeManager(t)
	h := f.startHub(Options{Name: "hub-agent-labels", Features: feature(nil, &sink{})})
	// A fresh node per run: a FleetNode left by an earlier run (-count)
	// holds another key, which the hub would refuse.
	node := "agent-labels-" + rand.String(5)
	opts := f.agentOpts(node, h, newRunner())
	opts.Labels = map[string]string{"site": "berlin", "kind": "robot"}
	opts.Capacity = map[string]string{"cpu": "1", "gpu": "2"}
	a := f.startAgent(opts)
	waitConnected(t, h, node)

	type want struct {
		labels   map[string]string // must be there
		absent   []string          // must not
		reported map[string]string // status.reportedLabels must have these
		gpu      string            // status.capacity
		labelsOK bool              // LabelsApproved True
		capOK    bool              // CapacityApproved True
	}
	wait := func(what string, w want) *fleetv1.FleetNode {
		t.Helper()
		var fn fleetv1.FleetNode
		testenv.Eventually(t, waitTimeout, what, func(ctx context.Context) (bool, error) {
			if err := f.c.Get(ctx, client.ObjectKey{Name: node}, &fn); err != nil {
				return false, err
			}
			// The failure says which of the three is behind: the agent's
			// report, the approval or the manager's copy into the labels.
			for k, v := range w.labels {
				if fn.Labels[k] != v {
					return false, fmt.Errorf("labels %v (approvedLabels %v, reportedLabels %v, resourceVersion %s)", fn.Labels, fn.Spec.ApprovedLabels, fn.Status.ReportedLabels, fn.ResourceVersion)
				}
			}
			for _, k := range w.absent {
				if _, ok := fn.Labels[k]; ok {
					return false, fmt.Errorf("labels %v, want no %s (approvedLabels %v, reportedLabels %v)", fn.Labels, k, fn.Spec.ApprovedLabels, fn.Status.ReportedLabels)
				}
			}
			for k, v := range w.reported {
				if fn.Status.ReportedLabels[k] != v {
					return false, fmt.Errorf("reportedLabels %v", fn.Status.ReportedLabels)
				}
			}
			if q := fn.Status.Capacity["gpu"]; q.String() != w.gpu {
				return false, fmt.Errorf("capacity %v, want gpu %s", fn.Status.Capacity, w.gpu)
			}
			if !meta.IsStatusConditionPresentAndEqual(fn.Status.Conditions, fleetv1.LabelsApprovedCondition, condStatus(w.labelsOK)) ||
				!meta.IsStatusConditionPresentAndEqual(fn.Status.Conditions, fleetv1.CapacityApprovedCondition, condStatus(w.capOK)) {
				return false, fmt.Errorf("conditions %+v", fn.Status.Conditions)
			}
			return true, nil
		})
		return &fn
	}
	wait("the registered labels and capacity, approved by the token", want{
		labels: map[string]string{"site": "berlin", "kind": "robot", fleetv1.LabelOS: runtime.GOOS}, gpu: "2", labelsOK: true, capOK: true})

	// An operator labels the node by hand.
	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	patch := client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"labels":{"team":"ops"}}}`))
	if err := f.c.Patch(ctx, &fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: node}}, patch); err != nil {
		t.Fatal(err)
	}

	// The agent comes back labelled into the GPU pool, without its site,
	// claiming 8 GPUs.
	a.stop(t)
	opts.Labels = map[string]string{"kind": "robot", "pool": "gpu"}
	opts.Capacity = map[string]string{"cpu": "1", "gpu": "8"}
	f.startAgent(opts)
	fn := wait("the new report held back", want{
		labels: map[string]string{"site": "berlin", "kind": "robot", "team": "ops"}, absent: []string{"pool"},
		reported: map[string]string{"pool": "gpu"}, gpu: "2"})
	c := meta.FindStatusCondition(fn.Status.Conditions, fleetv1.LabelsApprovedCondition)
	if c.Reason != fleetv1.ReasonLabelChangePending || !strings.Contains(c.Message, "pool=gpu (new)") || !strings.Contains(c.Message, "site (removed)") {
		t.Errorf("LabelsApproved %+v, want LabelChangePending naming pool=gpu and site", c)
	}
	if c := meta.FindStatusCondition(fn.Status.Conditions, fleetv1.CapacityApprovedCondition); c.Reason != fleetv1.ReasonCapacityOverApproved ||
		!strings.Contains(c.Message, "gpu: claims 8, approved 2") {
		t.Errorf("CapacityApproved %+v, want CapacityOverApproved naming gpu", c)
	}
	waitEvent(t, f, node, fleetv1.ReasonLabelChangePending)
	waitEvent(t, f, node, fleetv1.ReasonCapacityOverApproved)

	place := func(fn *fleetv1.FleetNode, selector map[string]string, gpus string) scheduler.Result {
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
		return scheduler.New([]scheduler.Node{scheduler.NodeFrom(fn)}).Place(tk)
	}
	if r := place(fn, map[string]string{"pool": "gpu"}, "1"); r.Node != "" {
		t.Errorf("pool=gpu before approval: placed on %s, want nowhere", r.Node)
	}
	if r := place(fn, map[string]string{"kind": "robot"}, "4"); r.Node != "" {
		t.Errorf("4 gpus of 2 approved: placed on %s, want nowhere", r.Node)
	}
	if r := place(fn, map[string]string{"site": "berlin"}, "2"); r.Node != node {
		t.Errorf("site=berlin, 2 gpus: %+v, want node %s", r, node)
	}

	// Approved again, as `drover approve` does. The approval is of the
	// report as read: on a loaded machine a report of the stopped agent can
	// still land after the new one (and the new agent's next report puts
	// it right), so approve once the read shows the new report.
	testenv.Eventually(t, waitTimeout, "the approval of the new report", func(ctx context.Context) (bool, error) {
		var n fleetv1.FleetNode
		if err := f.c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
			return false, err
		}
		if n.Status.ReportedLabels["pool"] != "gpu" {
			return false, fmt.Errorf("reportedLabels %v", n.Status.ReportedLabels)
		}
		before := n.DeepCopy()
		fleetnode.ApproveReported(&n)
		if err := f.c.Patch(ctx, &n, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			return false, err
		}
		return true, nil
	})
	fn = wait("the report approved", want{
		labels: map[string]string{"pool": "gpu", "kind": "robot", "team": "ops"}, absent: []string{"site"}, gpu: "8", labelsOK: true, capOK: true})
	if r := place(fn, map[string]string{"pool": "gpu"}, "4"); r.Node != node {
		t.Errorf("pool=gpu, 4 gpus after approval: %+v, want node %s", r, node)
	}
}

func condStatus(ok bool) metav1.ConditionStatus {
	if ok {
		return metav1.ConditionTrue
	}
	return metav1.ConditionFalse
}

// waitEvent waits for a Warning Event with reason on node.
func waitEvent(t *testing.T, f *fixture, node, reason string) {
	t.Helper()
	testenv.Eventually(t, waitTimeout, "a "+reason+" Event", func(ctx context.Context) (bool, error) {
		var list eventsv1.EventList
		if err := f.c.List(ctx, &list); err != nil {
			return false, err
		}
		for _, e := range list.Items {
			if e.Regarding.Name == node && e.Reason == reason && e.Type == corev1.EventTypeWarning {
				return true, nil
			}
		}
		return false, fmt.Errorf("%d events, none %s on %s", len(list.Items), reason, node)
	})
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
			// refuses those on purpose, and negative quantities; and
			// names no task can request (unprefixed other than cpu,
			// memory, ephemeral-storage, gpu), which the hub still takes
			// from older agents.
			unusable := !strings.Contains(name, "/") && name != "gpu"
			if agentErr != nil && hubErr == nil && !unusable && !strings.HasPrefix(q, "-") && q != "." && q != "e3" {
				t.Errorf("%s=%s: the hub accepts it, the agent refuses it: %v", name, q, agentErr)
			}
		}
	}
}
