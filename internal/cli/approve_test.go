package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
)

// TestPrintNodesWideShowsTheKey: `drover get nodes -o wide` shows the key
// each node registered with, for comparing with what its agent logs.
func TestPrintNodesWideShowsTheKey(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	const key = "3f2a9c0d5e6b7a8190aabbccddeeff00112233445566778899aabbccddeeff00"
	nodes := []fleetv1.FleetNode{
		{ObjectMeta: metav1.ObjectMeta{Name: "edge-1", CreationTimestamp: metav1.NewTime(now.Add(-time.Hour)),
			Annotations: map[string]string{fleetv1.AnnotationRegistrationKey: key}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "edge-0", CreationTimestamp: metav1.NewTime(now.Add(-time.Hour))}},
	}
	var out bytes.Buffer
	printNodes(&out, nodes, now, true)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.HasSuffix(lines[0], "KEY-SHA256") || !strings.HasSuffix(lines[1], "<not recorded>") || !strings.HasSuffix(lines[2], key) {
		t.Errorf("got\n%s", out.String())
	}
	out.Reset()
	printNodes(&out, nodes, now, false)
	if strings.Contains(out.String(), "KEY") {
		t.Errorf("the narrow list shows keys:\n%s", out.String())
	}
}

// TestApproveAcceptsWhatTheAgentReports: approving a node approves the
// labels and capacity its agent reports; approving it again accepts a
// later change and says what it was.
func TestApproveAcceptsWhatTheAgentReports(t *testing.T) {
	s := runtime.NewScheme()
	if err := fleetv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	n := &fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: "edge-1"}, Status: fleetv1.FleetNodeStatus{
		ReportedLabels:   map[string]string{"site": "berlin"},
		ReportedCapacity: corev1.ResourceList{"gpu": resource.MustParse("2")},
	}}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(n).WithStatusSubresource(n).Build()
	cmd := &cobra.Command{}
	var out bytes.Buffer
	cmd.SetOut(&out)
	get := func() *fleetv1.FleetNode {
		var got fleetv1.FleetNode
		if err := c.Get(t.Context(), client.ObjectKey{Name: "edge-1"}, &got); err != nil {
			t.Fatal(err)
		}
		return &got
	}
	if err := approve(t.Context(), c, []string{"edge-1"}, cmd); err != nil {
		t.Fatal(err)
	}
	if got := get(); !got.Spec.Approved || got.Spec.ApprovedLabels["site"] != "berlin" || got.Spec.ApprovedCapacity.Name("gpu", resource.DecimalSI).String() != "2" {
		t.Errorf("spec after approve = %+v, want approved with site=berlin and 2 gpus", got.Spec)
	}
	if strings.Contains(out.String(), "now approved") {
		t.Errorf("a first approval lists changes:\n%s", out.String())
	}

	// The agent reports more.
	got := get()
	got.Status.ReportedLabels = map[string]string{"site": "berlin", "pool": "gpu"}
	got.Status.ReportedCapacity = corev1.ResourceList{"gpu": resource.MustParse("8")}
	if err := c.Status().Update(t.Context(), got); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := approve(t.Context(), c, []string{"edge-1"}, cmd); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "pool=gpu (new)") || !strings.Contains(out.String(), "gpu: claims 8, approved 2") {
		t.Errorf("approving again printed\n%s\nwant the label change and the capacity claim", out.String())
	}
	if got := get(); got.Spec.ApprovedLabels["pool"] != "gpu" || got.Spec.ApprovedCapacity.Name("gpu", resource.DecimalSI).String() != "8" {
		t.Errorf("spec after approving again = %+v, want pool=gpu and 8 gpus", got.Spec)
	}
}

// TestPrintNodesShowsPendingChanges: `drover get nodes` says when an
// approved node's agent reports more than was approved.
func TestPrintNodesShowsPendingChanges(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	n := fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: "edge-1", CreationTimestamp: metav1.NewTime(now)},
		Spec: fleetv1.FleetNodeSpec{Approved: true},
		Status: fleetv1.FleetNodeStatus{Conditions: []metav1.Condition{
			{Type: fleetv1.LabelsApprovedCondition, Status: metav1.ConditionFalse, Reason: fleetv1.ReasonLabelChangePending},
			{Type: fleetv1.CapacityApprovedCondition, Status: metav1.ConditionTrue, Reason: fleetv1.ReasonAsApproved}}}}
	var out bytes.Buffer
	printNodes(&out, []fleetv1.FleetNode{n}, now, false)
	if !strings.Contains(out.String(), "edge-1   <none>   true(labels pending)   ") {
		t.Errorf("got\n%s", out.String())
	}
}
