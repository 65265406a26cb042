package fleetnode

import (
	"maps"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
)

// TestApplyApprovedLabels covers the rules of metadata.labels against the
// approved labels: approved keys follow the approval, operators' keys stay.
func TestApplyApprovedLabels(t *testing.T) {
	ann := func(keys string) map[string]string { return map[string]string{fleetv1.AnnotationAgentLabels: keys} }
	tests := []struct {
		name        string
		labels      map[string]string
		annotations map[string]string
		approved    map[string]string
		wantLabels  map[string]string
		wantAnn     string
		wantChanged bool
	}{
		{
			name:        "new node",
			approved:    map[string]string{"site": "berlin", "kind": "robot", fleetv1.LabelOS: "linux"},
			wantLabels:  map[string]string{"site": "berlin", "kind": "robot", fleetv1.LabelOS: "linux"},
			wantAnn:     "fleet.drover.io/os,kind,site",
			wantChanged: true,
		},
		{
			name:        "nothing approved",
			wantAnn:     "",
			wantChanged: true,
		},
		{
			name:        "another approval: added, updated, removed",
			labels:      map[string]string{"site": "berlin", "kind": "robot", "team": "ops"},
			annotations: ann("kind,site"),
			approved:    map[string]string{"kind": "drone", "zone": "z1"},
			wantLabels:  map[string]string{"kind": "drone", "zone": "z1", "team": "ops"},
			wantAnn:     "kind,zone",
			wantChanged: true,
		},
		{
			name:        "an operator's label keeps its value and stays the operator's",
			labels:      map[string]string{"kind": "robot", "zone": "manual"},
			annotations: ann("kind"),
			approved:    map[string]string{"kind": "robot", "zone": "z1"},
			wantLabels:  map[string]string{"kind": "robot", "zone": "manual"},
			wantAnn:     "kind",
			wantChanged: false,
		},
		{
			name:        "an approved label an operator edited follows the approval again",
			labels:      map[string]string{"kind": "edited"},
			annotations: ann("kind"),
			approved:    map[string]string{"kind": "robot"},
			wantLabels:  map[string]string{"kind": "robot"},
			wantAnn:     "kind",
			wantChanged: true,
		},
		{
			name:        "approved labels made by an older hub: those with the approved value are the agent's",
			labels:      map[string]string{"kind": "robot", "team": "ops", "rack": "hand"},
			approved:    map[string]string{"kind": "robot", "rack": "r1"},
			wantLabels:  map[string]string{"kind": "robot", "team": "ops", "rack": "hand"},
			wantAnn:     "kind",
			wantChanged: true,
		},
		{
			name:        "nothing changed",
			labels:      map[string]string{"kind": "robot", "team": "ops"},
			annotations: ann("kind"),
			approved:    map[string]string{"kind": "robot"},
			wantLabels:  map[string]string{"kind": "robot", "team": "ops"},
			wantAnn:     "kind",
			wantChanged: false,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := &fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: maps.Clone(tc.labels), Annotations: maps.Clone(tc.annotations)}}
			n.Spec.ApprovedLabels = tc.approved
			// What the agent reports does not matter: only the approval.
			n.Status.ReportedLabels = map[string]string{"pool": "gpu"}
			if changed := ApplyApprovedLabels(n); changed != tc.wantChanged {
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

func labelsC(st metav1.ConditionStatus, reason, msg string) metav1.Condition {
	return cond(fleetv1.LabelsApprovedCondition, st, reason, msg)
}

func withLabels(approved, reported map[string]string, conds ...metav1.Condition) *fleetv1.FleetNode {
	n := node(online, "hub-a", conds...)
	n.Spec.ApprovedLabels, n.Status.ReportedLabels = approved, reported
	return n
}

func TestSetLabelsApproval(t *testing.T) {
	asApproved := labelsC(isTrue, fleetv1.ReasonAsApproved, "the agent reports the approved labels")
	pendingMsg := "the agent reports labels that are not approved: kind=drone (was robot), pool=gpu (new), site (removed); " +
		"the node keeps its approved labels until `drover approve n1`"
	pendingC := labelsC(isFalse, fleetv1.ReasonLabelChangePending, pendingMsg)
	approved := map[string]string{"kind": "robot", "site": "berlin"}
	changed := map[string]string{"kind": "drone", "pool": "gpu"}
	set := func(n *fleetv1.FleetNode) Change { return SetLabelsApproval(n, now) }
	unapproved := withLabels(nil, changed)
	unapproved.Spec.Approved = false
	runSetterTests(t, []setterTest{
		{name: "the approved labels reported: True, unannounced",
			node: withLabels(approved, maps.Clone(approved)), set: set,
			wantPhase: online, wantHub: "hub-a", wantConds: []metav1.Condition{asApproved}},
		{name: "other labels reported: a warning listing the changes",
			node: withLabels(approved, changed, asApproved), set: set,
			wantPhase: online, wantHub: "hub-a", wantConds: []metav1.Condition{pendingC}, wantEvent: fleetv1.ReasonLabelChangePending, wantType: warnT},
		{name: "the same changes again: no change",
			node: withLabels(approved, changed, pendingC), set: set,
			wantPhase: online, wantHub: "hub-a", wantConds: []metav1.Condition{pendingC}, wantUnchanged: true},
		{name: "the changes approved: announced",
			node: withLabels(changed, maps.Clone(changed), pendingC), set: set,
			wantPhase: online, wantHub: "hub-a", wantConds: []metav1.Condition{asApproved}, wantEvent: fleetv1.ReasonAsApproved, wantType: normalT},
		{name: "a node that reported nothing yet is left alone",
			node: withLabels(approved, nil), set: set, wantPhase: online, wantHub: "hub-a", wantUnchanged: true},
		{name: "an unapproved node is left alone",
			node: unapproved, set: set, wantPhase: online, wantHub: "hub-a", wantUnchanged: true},
	})
}

func res(kv ...string) corev1.ResourceList {
	out := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return out
}

func TestSetCapacity(t *testing.T) {
	for _, tt := range []struct {
		name               string
		approved, reported corev1.ResourceList
		legacy             corev1.ResourceList // status.capacity as an older hub wrote it
		unapproved         bool
		want               corev1.ResourceList
		wantReason         string // of CapacityApproved; "" for none
		wantMsg            string
		wantEvent          string
	}{
		{name: "within the approval", approved: res("cpu", "4", "gpu", "2"), reported: res("cpu", "2", "gpu", "2"),
			want: res("cpu", "2", "gpu", "2"), wantReason: fleetv1.ReasonAsApproved},
		{name: "over the approval: capped and flagged", approved: res("cpu", "4", "gpu", "2"), reported: res("cpu", "4", "gpu", "8", "fpga", "1"),
			want: res("cpu", "4", "gpu", "2"), wantReason: fleetv1.ReasonCapacityOverApproved, wantEvent: fleetv1.ReasonCapacityOverApproved,
			wantMsg: "fpga: claims 1, none approved, gpu: claims 8, approved 2"},
		{name: "an unapproved node counts on nothing, unflagged", unapproved: true, reported: res("cpu", "4"), want: nil},
		{name: "a node from an older hub: its capacity is the claim", approved: res("cpu", "4"), legacy: res("cpu", "8"),
			want: res("cpu", "4"), wantReason: fleetv1.ReasonCapacityOverApproved, wantEvent: fleetv1.ReasonCapacityOverApproved, wantMsg: "cpu: claims 8, approved 4"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n := node(online, "hub-a")
			n.Spec.Approved = !tt.unapproved
			n.Spec.ApprovedCapacity, n.Status.ReportedCapacity = tt.approved, tt.reported
			if tt.legacy != nil {
				n.Status.Capacity = tt.legacy
			}
			c := SetCapacity(n, now)
			if !capacityEqual(n.Status.Capacity, tt.want) {
				t.Errorf("capacity %v, want %v", n.Status.Capacity, tt.want)
			}
			got := meta.FindStatusCondition(n.Status.Conditions, fleetv1.CapacityApprovedCondition)
			switch {
			case tt.wantReason == "" && got != nil:
				t.Errorf("CapacityApproved %+v, want none", got)
			case tt.wantReason != "" && (got == nil || got.Reason != tt.wantReason || !strings.Contains(got.Message, tt.wantMsg)):
				t.Errorf("CapacityApproved %+v, want %s with %q", got, tt.wantReason, tt.wantMsg)
			}
			if c.Event.Reason != tt.wantEvent {
				t.Errorf("event %+v, want %q", c.Event, tt.wantEvent)
			}
			// A second pass changes nothing.
			if again := SetCapacity(n, now); again.Changed {
				t.Errorf("second SetCapacity changed the node: %+v", again)
			}
		})
	}
}

func TestAdoptReported(t *testing.T) {
	reported := func() *fleetv1.FleetNode {
		n := node(online, "hub-a")
		n.Status.ReportedLabels = map[string]string{"site": "berlin"}
		n.Status.ReportedCapacity = res("cpu", "2")
		return n
	}
	n := reported()
	if !AdoptReported(n) || n.Spec.ApprovedLabels["site"] != "berlin" || n.Spec.ApprovedCapacity.Cpu().String() != "2" {
		t.Errorf("a node approved by hand: AdoptReported left spec %+v, want the reports approved", n.Spec)
	}
	// A node an older hub wrote: the agent's labels only, the claim in
	// capacity. The reserved keys come from the facts, as a new hub reports
	// them, so that its first report is no change.
	n = node(online, "hub-a")
	n.Status.OS, n.Status.ReportedLabels, n.Status.Capacity = "linux", map[string]string{"site": "berlin"}, res("cpu", "2")
	if !AdoptReported(n) || !maps.Equal(n.Spec.ApprovedLabels, map[string]string{"site": "berlin", fleetv1.LabelOS: "linux"}) || n.Spec.ApprovedCapacity.Cpu().String() != "2" {
		t.Errorf("a node from an older hub: AdoptReported left spec %+v", n.Spec)
	}
	SetReported(n, &Info{OS: "linux", Labels: map[string]string{"site": "berlin"}, Capacity: res("cpu", "2")})
	if c := SetLabelsApproval(n, now); len(LabelChanges(n)) != 0 || !c.Event.IsZero() {
		t.Errorf("a new hub's first report of an adopted node: changes %v, event %+v; want none", LabelChanges(n), c.Event)
	}
	n = reported()
	n.Spec.Approved = false
	if AdoptReported(n) {
		t.Error("AdoptReported approved the reports of an unapproved node")
	}
	n = reported()
	n.Spec.ApprovedLabels = map[string]string{"site": "paris"}
	if AdoptReported(n) || n.Spec.ApprovedLabels["site"] != "paris" {
		t.Error("AdoptReported replaced an approval")
	}
	// Once the manager has recorded what was approved (here: nothing), a
	// report waits for an operator.
	n = reported()
	SetLabelsApproval(n, now)
	n.Status.ReportedLabels = map[string]string{"pool": "gpu"}
	n.Spec.ApprovedLabels, n.Spec.ApprovedCapacity = nil, nil
	if AdoptReported(n) {
		t.Error("AdoptReported approved a report after LabelsApproved was recorded")
	}
}
