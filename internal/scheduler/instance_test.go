package scheduler

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
)

func rl(kv ...string) corev1.ResourceList {
	out := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return out
}

func TestReservation(t *testing.T) {
	init, mainT, side := batchv1.LifecycleInit, batchv1.LifecycleMain, batchv1.LifecycleSidecar
	tests := []struct {
		name    string
		members []Member
		want    corev1.ResourceList
	}{
		{"one main holds its own", []Member{{mainT, rl("cpu", "500m")}}, rl("cpu", "500m")},
		{"mains and sidecars add up", []Member{{mainT, rl("cpu", "1", "memory", "1Gi")}, {side, rl("cpu", "250m")}, {mainT, rl("memory", "512Mi")}},
			rl("cpu", "1250m", "memory", "1536Mi")},
		{"a bigger init wins", []Member{{init, rl("cpu", "3")}, {init, rl("cpu", "1")}, {mainT, rl("cpu", "1")}, {side, rl("cpu", "1")}},
			rl("cpu", "3")},
		{"inits do not add up", []Member{{init, rl("cpu", "1")}, {init, rl("cpu", "1")}, {mainT, rl("cpu", "500m")}}, rl("cpu", "1")},
		{"per resource: init's memory, mains' cpu", []Member{{init, rl("memory", "4Gi", "cpu", "100m")}, {mainT, rl("cpu", "2", "memory", "1Gi")}},
			rl("cpu", "2", "memory", "4Gi")},
		{"init only resource", []Member{{init, rl("gpu", "1")}, {mainT, nil}}, rl("gpu", "1")},
		{"nothing asked", []Member{{mainT, nil}, {side, nil}}, rl()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Reservation(tt.members)
			if len(got) != len(tt.want) {
				t.Fatalf("Reservation = %v, want %v", got, tt.want)
			}
			for name, q := range tt.want {
				if g, ok := got[name]; !ok || g.Cmp(q) != 0 {
					t.Errorf("Reservation[%s] = %v, want %v", name, got[name], q)
				}
			}
		})
	}
}

// TestPlaceUnit: an instance goes where every task of it may run, with
// room for its reservation.
func TestPlaceUnit(t *testing.T) {
	nodes := []Node{
		{Name: "a", Phase: fleetv1.FleetNodeOnline, Labels: map[string]string{"arm": "yes"}, Capacity: rl("cpu", "1")},
		{Name: "b", Phase: fleetv1.FleetNodeOnline, Labels: map[string]string{"arm": "yes", "cam": "yes"}, Capacity: rl("cpu", "1")},
		{Name: "c", Phase: fleetv1.FleetNodeOnline, Labels: map[string]string{"arm": "yes", "cam": "yes"}, Capacity: rl("cpu", "4")},
	}
	sel := func(k string) labels.Selector { return labels.SelectorFromSet(labels.Set{k: "yes"}) }
	unit := []Task{{Key: "ns/x-0-cam", Selector: sel("cam"), Access: everyNode.For("ns", nil)}}
	tests := []struct {
		name string
		task Task
		want string
	}{
		{"a sibling's selector rules out a", Task{Key: "ns/x-0-arm", Selector: sel("arm"), Access: everyNode.For("ns", nil), Unit: unit}, "b"},
		{"the reservation needs the big node", Task{Key: "ns/x-0-arm", Selector: sel("arm"), Access: everyNode.For("ns", nil), Unit: unit, Resources: rl("cpu", "2")}, "c"},
		{"a sibling pinned elsewhere fits nowhere", Task{Key: "ns/x-0-arm", Access: everyNode.For("ns", nil), Unit: []Task{{NodeName: "a", Access: everyNode.For("ns", nil)}}, Resources: rl("cpu", "2")}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := New(nodes).Place(tt.task); got.Node != tt.want {
				t.Errorf("Place = %q (%s), want %q", got.Node, got.Message, tt.want)
			}
		})
	}
}
