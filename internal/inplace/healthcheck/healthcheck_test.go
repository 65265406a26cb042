package healthcheck

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
)

var now = time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)

func ago(d time.Duration) time.Time { return now.Add(-d) }

func readyFor(status metav1.ConditionStatus, d time.Duration) []metav1.Condition {
	return []metav1.Condition{{Type: "Ready", Status: status, LastTransitionTime: metav1.NewTime(ago(d))}}
}

func spec(mut func(*updatev1.NodeHealthCheckSpec)) updatev1.NodeHealthCheckSpec {
	s := updatev1.NodeHealthCheckSpec{
		UnhealthyConditions:  []updatev1.UnhealthyCondition{{Type: "Ready", Status: metav1.ConditionFalse, Timeout: metav1.Duration{Duration: 5 * time.Minute}}},
		InitializeTimeout:    &metav1.Duration{Duration: 10 * time.Minute},
		InPlaceUpdateTimeout: &metav1.Duration{Duration: 30 * time.Minute},
	}
	if mut != nil {
		mut(&s)
	}
	return s
}

func TestVerdicts(t *testing.T) {
	tests := []struct {
		name       string
		node       Node
		wantHealth bool
		wantUpdate bool
		wantReason string
	}{
		{"healthy", Node{Initialized: true, Conditions: readyFor(metav1.ConditionTrue, time.Hour)}, true, false, updatev1.ReasonHealthy},
		{"Ready False within its timeout is healthy", Node{Initialized: true, Conditions: readyFor(metav1.ConditionFalse, 4*time.Minute)}, true, false, updatev1.ReasonHealthy},
		{"Ready False past its timeout is unhealthy", Node{Initialized: true, Conditions: readyFor(metav1.ConditionFalse, 5*time.Minute)}, false, false, updatev1.ReasonConditionTimeout},
		{"updating and offline within inPlaceUpdateTimeout: healthy, in update", Node{Initialized: true, Conditions: readyFor(metav1.ConditionFalse, 20*time.Minute), UpdateStatus: updatev1.StatusUpdating, UpdateStarted: ago(29 * time.Minute)}, true, true, updatev1.ReasonUpdating},
		{"updating longer than inPlaceUpdateTimeout: unhealthy", Node{Initialized: true, UpdateStatus: updatev1.StatusUpdating, UpdateStarted: ago(30 * time.Minute)}, false, false, updatev1.ReasonUpdateTimeout},
		{"an updater's terminal failure: unhealthy", Node{Initialized: true, UpdateStatus: updatev1.StatusFailed, UpdateReason: "updater files failed"}, false, false, updatev1.ReasonUpdaterFailed},
		{"new node not initialised past initializeTimeout", Node{Created: ago(11 * time.Minute)}, false, false, updatev1.ReasonInitializeTimeout},
		{"new node initialising and updating gets initializeTimeout + inPlaceUpdateTimeout", Node{Created: ago(39 * time.Minute), UpdateStatus: updatev1.StatusUpdating, UpdateStarted: ago(39 * time.Minute)}, true, true, updatev1.ReasonUpdating},
		{"... and no more", Node{Created: ago(40 * time.Minute), UpdateStatus: updatev1.StatusUpdating, UpdateStarted: ago(40 * time.Minute)}, false, false, updatev1.ReasonUpdateTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Evaluate(spec(nil), []Node{tt.node}, now)
			if err != nil {
				t.Fatal(err)
			}
			v := r.Nodes[0]
			if v.Healthy != tt.wantHealth || v.InUpdate != tt.wantUpdate || v.Reason != tt.wantReason {
				t.Errorf("Evaluate() = healthy %v inUpdate %v reason %q (%s), want %v %v %q", v.Healthy, v.InUpdate, v.Reason, v.Message, tt.wantHealth, tt.wantUpdate, tt.wantReason)
			}
		})
	}
}

func TestRemediationCount(t *testing.T) {
	healthy := Node{Initialized: true, Conditions: readyFor(metav1.ConditionTrue, time.Hour)}
	sick := Node{Initialized: true, Conditions: readyFor(metav1.ConditionFalse, time.Hour)}
	updating := Node{Initialized: true, UpdateStatus: updatev1.StatusUpdating, UpdateStarted: ago(time.Minute)}
	pct := func(s string) *intstr.IntOrString { v := intstr.FromString(s); return &v }
	count := func(i int32) *intstr.IntOrString { v := intstr.FromInt32(i); return &v }
	tests := []struct {
		name        string
		mut         func(*updatev1.NodeHealthCheckSpec)
		nodes       []Node
		wantAllowed bool
		wantCount   int
	}{
		{"default 100%: all may be remediated", nil, []Node{healthy, sick, sick}, true, 1},
		{"count: 1 unhealthy of maxUnhealthy 2", func(s *updatev1.NodeHealthCheckSpec) { s.MaxUnhealthy = count(2) }, []Node{healthy, healthy, sick}, true, 1},
		{"percentages round down: 40% of 4 is 1", func(s *updatev1.NodeHealthCheckSpec) { s.MaxUnhealthy = pct("40%") }, []Node{healthy, healthy, sick, sick}, false, 0},
		{"updating nodes count against remediation", func(s *updatev1.NodeHealthCheckSpec) { s.MaxUnhealthy = count(2) }, []Node{updating, updating, sick, healthy}, false, 0},
		{"RemediationCount = max − unhealthy − inUpdate", func(s *updatev1.NodeHealthCheckSpec) { s.MaxUnhealthy = count(3) }, []Node{updating, sick, healthy}, true, 1},
		{"unhealthyRange within", func(s *updatev1.NodeHealthCheckSpec) { s.UnhealthyRange = "[1-2]" }, []Node{sick, healthy, healthy}, true, 1},
		{"unhealthyRange below min", func(s *updatev1.NodeHealthCheckSpec) { s.UnhealthyRange = "[2-3]" }, []Node{sick, healthy}, false, 2},
		{"unhealthyRange above max", func(s *updatev1.NodeHealthCheckSpec) { s.UnhealthyRange = "[0-1]" }, []Node{sick, updating}, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Evaluate(spec(tt.mut), tt.nodes, now)
			if err != nil {
				t.Fatal(err)
			}
			if r.Allowed != tt.wantAllowed || r.RemediationsAllowed != tt.wantCount {
				t.Errorf("Evaluate() = allowed %v count %d (%s), want %v %d", r.Allowed, r.RemediationsAllowed, r.Why, tt.wantAllowed, tt.wantCount)
			}
		})
	}
}

func TestNextCheckIsTheEarliestDeadline(t *testing.T) {
	r, err := Evaluate(spec(nil), []Node{
		{Initialized: true, UpdateStatus: updatev1.StatusUpdating, UpdateStarted: ago(25 * time.Minute)},
		{Initialized: true, Conditions: readyFor(metav1.ConditionFalse, 2*time.Minute)},
	}, now)
	if err != nil {
		t.Fatal(err)
	}
	if want := now.Add(3 * time.Minute); !r.NextCheck.Equal(want) {
		t.Errorf("NextCheck = %v, want %v", r.NextCheck, want)
	}
}

func TestParseRange(t *testing.T) {
	for _, bad := range []string{"1-2", "[2-1]", "[a-b]"} {
		if _, _, err := ParseRange(bad); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("ParseRange(%q) error = %v, want one naming it", bad, err)
		}
	}
}
