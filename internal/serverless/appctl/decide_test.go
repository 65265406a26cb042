package appctl

import (
	"reflect"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	serverlessv1 "github.com/drover-fleet/drover/api/serverless/v1alpha1"
)

var t0 = time.Date(2026, 11, 29, 2, 0, 0, 0, time.UTC)

func scaling(minN, maxN, standby, burst, spi int32) serverlessv1.Scaling {
	return serverlessv1.Scaling{MinInstances: minN, MaxInstances: maxN, StandbyInstances: ptr.To(standby), Burst: burst, SessionsPerInstance: spi,
		IdleInstanceTimeout: metav1.Duration{Duration: 5 * time.Minute}}
}

// inst is a live instance on a ready node, created at t0 plus age.
func inst(name string, state serverlessv1.InstanceState, standby bool, sessions int, created time.Duration) Instance {
	return Instance{Name: name, Node: "n1", Standby: standby, State: state, Sessions: sessions, Created: t0.Add(created), NodeReady: true}
}

func TestDecide(t *testing.T) {
	idleSince := func(i Instance, since time.Time) Instance { i.Since = since; return i }
	lost := func(i Instance) Instance { i.NodeLost, i.NodeReady = true, false; return i }
	notReady := func(i Instance) Instance { i.NodeReady = false; return i }
	tests := []struct {
		name string
		in   Input
		want Decision
	}{{
		name: "empty application: the standby pool is made",
		in:   Input{Now: t0, Scaling: scaling(0, 10, 1, 2, 1)},
		want: Decision{Add: []Add{{Standby: true}}, Want: 1, Missing: 1},
	}, {
		name: "burst bounds how many are created at once",
		in:   Input{Now: t0, Scaling: scaling(5, 10, 1, 2, 1)},
		want: Decision{Add: []Add{{Standby: true}, {Standby: true}}, Want: 5, Missing: 5},
	}, {
		name: "instances not live yet count against burst",
		in: Input{Now: t0, Scaling: scaling(5, 10, 1, 2, 1), Instances: []Instance{
			inst("a", serverlessv1.InstanceCreating, true, 0, 0), inst("b", serverlessv1.InstanceStandby, true, 0, 0)}},
		want: Decision{Add: []Add{{Standby: true}}, Want: 5, Missing: 3},
	}, {
		name: "maxInstances bounds the pool",
		in:   Input{Now: t0, Scaling: scaling(0, 1, 3, 5, 1)},
		want: Decision{Add: []Add{{Standby: true}}, Want: 1, Missing: 1},
	}, {
		name: "a full pool: nothing to do",
		in: Input{Now: t0, Scaling: scaling(0, 10, 1, 2, 1), Instances: []Instance{
			inst("a", serverlessv1.InstanceStandby, true, 0, 0)}},
		want: Decision{Want: 1},
	}, {
		name: "a session takes the standby instance and the pool is refilled",
		in: Input{Now: t0, Scaling: scaling(0, 10, 1, 2, 1), Instances: []Instance{
			inst("a", serverlessv1.InstanceStandby, true, 0, 0)}, Pending: []Pending{{Key: "ns/s1"}}},
		want: Decision{Bind: []Binding{{Session: "ns/s1", Instance: "a"}}, Add: []Add{{Standby: true}}, Want: 1, Missing: 1},
	}, {
		name: "an idle instance is preferred to a standby one",
		in: Input{Now: t0, Scaling: scaling(0, 10, 1, 2, 1), Instances: []Instance{
			inst("a", serverlessv1.InstanceStandby, true, 0, 0), idleSince(inst("b", serverlessv1.InstanceIdle, true, 0, 0), t0)},
			Pending: []Pending{{Key: "ns/s1"}}},
		want: Decision{Bind: []Binding{{Session: "ns/s1", Instance: "b"}}, Want: 1, Requeue: 0},
	}, {
		name: "a full instance is not bound; the cold path adds an active one",
		in: Input{Now: t0, Scaling: scaling(0, 10, 0, 2, 1), Instances: []Instance{
			inst("a", serverlessv1.InstanceRunning, false, 1, 0)}, Pending: []Pending{{Key: "ns/s1"}}},
		want: Decision{Add: []Add{{ForSession: "ns/s1"}}, Bind: []Binding{{Session: "ns/s1", NewIndex: 0}}},
	}, {
		name: "an instance with room under sessionsPerInstance is shared",
		in: Input{Now: t0, Scaling: scaling(0, 10, 0, 2, 2), Instances: []Instance{
			inst("a", serverlessv1.InstanceRunning, false, 1, 0)}, Pending: []Pending{{Key: "ns/s1"}, {Key: "ns/s2"}, {Key: "ns/s3"}, {Key: "ns/s4"}}},
		want: Decision{Add: []Add{{ForSession: "ns/s2"}}, Bind: []Binding{{Session: "ns/s1", Instance: "a"},
			{Session: "ns/s2", NewIndex: 0}, {Session: "ns/s3", NewIndex: 0}}, Requeue: 0,
		// s4: a second new instance
		}.with(func(d *Decision) {
			d.Add = append(d.Add, Add{ForSession: "ns/s4"})
			d.Bind = append(d.Bind, Binding{Session: "ns/s4", NewIndex: 1})
		}),
	}, {
		name: "at maxInstances with no room: NoCapacity",
		in: Input{Now: t0, Scaling: scaling(0, 1, 0, 2, 1), Instances: []Instance{
			inst("a", serverlessv1.InstanceRunning, false, 1, 0)}, Pending: []Pending{{Key: "ns/s1"}}},
		want: Decision{NoCapacity: []string{"ns/s1"}},
	}, {
		name: "a standby instance on a node not ready is not bound",
		in: Input{Now: t0, Scaling: scaling(0, 2, 1, 2, 1), Instances: []Instance{
			notReady(inst("a", serverlessv1.InstanceStandby, true, 0, 0))}, Pending: []Pending{{Key: "ns/s1"}}},
		want: Decision{Add: []Add{{ForSession: "ns/s1"}}, Bind: []Binding{{Session: "ns/s1", NewIndex: 0}}, Want: 1},
	}, {
		name: "an instance the hub reported Terminated is replaced",
		in: Input{Now: t0, Scaling: scaling(0, 10, 1, 2, 1), Instances: []Instance{
			inst("a", serverlessv1.InstanceTerminated, true, 0, 0)}},
		want: Decision{Remove: []Removal{{"a", RemoveTerminated}}, Add: []Add{{Standby: true}}, Want: 1, Missing: 1},
	}, {
		name: "the instances of a lost node are dropped and replaced",
		in: Input{Now: t0, Scaling: scaling(2, 10, 0, 2, 1), Instances: []Instance{
			lost(inst("a", serverlessv1.InstanceRunning, false, 1, 0)), inst("b", serverlessv1.InstanceStandby, true, 0, 0)}},
		want: Decision{Remove: []Removal{{"a", RemoveNodeLost}}, Add: []Add{{Standby: true}}, Want: 2, Missing: 1},
	}, {
		name: "an idle instance waits for its timeout",
		in: Input{Now: t0.Add(time.Minute), Scaling: scaling(0, 10, 0, 2, 1), Instances: []Instance{
			idleSince(inst("a", serverlessv1.InstanceIdle, false, 0, 0), t0)}},
		want: Decision{Requeue: 4 * time.Minute},
	}, {
		name: "an idle instance past its timeout is removed",
		in: Input{Now: t0.Add(5 * time.Minute), Scaling: scaling(0, 10, 0, 2, 1), Instances: []Instance{
			idleSince(inst("a", serverlessv1.InstanceIdle, false, 0, 0), t0)}},
		want: Decision{Remove: []Removal{{"a", RemoveIdle}}},
	}, {
		name: "idle timeout keeps minInstances",
		in: Input{Now: t0.Add(time.Hour), Scaling: scaling(1, 10, 0, 2, 1), Instances: []Instance{
			idleSince(inst("a", serverlessv1.InstanceIdle, false, 0, 0), t0), idleSince(inst("b", serverlessv1.InstanceIdle, false, 0, time.Second), t0)}},
		want: Decision{Remove: []Removal{{"b", RemoveIdle}}, Want: 1},
	}, {
		name: "standby instances beyond the pool are removed, newest first",
		in: Input{Now: t0, Scaling: scaling(0, 10, 1, 2, 1), Instances: []Instance{
			inst("a", serverlessv1.InstanceStandby, true, 0, 0), inst("b", serverlessv1.InstanceStandby, true, 0, time.Second)}},
		want: Decision{Remove: []Removal{{"b", RemoveExcess}}, Want: 1},
	}, {
		name: "daemon: minInstances active instances, within burst",
		in:   Input{Now: t0, Mode: serverlessv1.ModeDaemon, Scaling: scaling(3, 10, 1, 2, 1)},
		want: Decision{Add: []Add{{}, {}}, Want: 3, Missing: 3},
	}, {
		name: "daemon: a lost instance is replaced",
		in: Input{Now: t0, Mode: serverlessv1.ModeDaemon, Scaling: scaling(1, 10, 1, 2, 1), Instances: []Instance{
			lost(inst("a", serverlessv1.InstanceRunning, false, 0, 0))}},
		want: Decision{Remove: []Removal{{"a", RemoveNodeLost}}, Add: []Add{{}}, Want: 1, Missing: 1},
	}, {
		name: "daemon: above minInstances, the newest go",
		in: Input{Now: t0, Mode: serverlessv1.ModeDaemon, Scaling: scaling(1, 10, 1, 2, 1), Instances: []Instance{
			inst("a", serverlessv1.InstanceRunning, false, 0, 0), inst("b", serverlessv1.InstanceRunning, false, 0, time.Second)}},
		want: Decision{Remove: []Removal{{"b", RemoveExcess}}, Want: 1},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := decide(tt.in)
			if !reflect.DeepEqual(normal(got), normal(tt.want)) {
				t.Errorf("decide:\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func (d Decision) with(f func(*Decision)) Decision { f(&d); return d }

// normal makes nil and empty slices equal.
func normal(d Decision) Decision {
	if len(d.Remove) == 0 {
		d.Remove = nil
	}
	if len(d.Add) == 0 {
		d.Add = nil
	}
	if len(d.Bind) == 0 {
		d.Bind = nil
	}
	if len(d.NoCapacity) == 0 {
		d.NoCapacity = nil
	}
	return d
}
