package liveness

import (
	"cmp"
	"reflect"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)

func names(s []Silent) []string {
	out := []string{}
	for _, x := range s {
		out = append(out, x.Node)
	}
	return out
}

func TestTick(t *testing.T) {
	type step struct {
		at          time.Duration // since t0
		do          string        // "connect", "disconnect", "beat", "adopt", "tick"
		node        string
		wantOffline []string
		wantRefresh []string
		// wantUnconnected is checked when not nil.
		wantUnconnected []string
	}
	tests := []struct {
		name    string
		refresh time.Duration // default 10m
		steps   []step
	}{
		{"a node that heartbeats is never offline", 0, []step{
			{at: 0, do: "connect", node: "a"},
			{at: 4 * time.Minute, do: "beat", node: "a"},
			{at: 8 * time.Minute, do: "beat", node: "a"},
			{at: 9 * time.Minute, do: "tick", wantOffline: []string{}, wantRefresh: []string{}},
		}},
		{"a silent node goes offline after the timeout, once", 0, []step{
			{at: 0, do: "connect", node: "a"},
			{at: 5 * time.Minute, do: "tick", wantOffline: []string{}, wantRefresh: []string{}},
			{at: 5*time.Minute + time.Second, do: "tick", wantOffline: []string{"a"}, wantRefresh: []string{}},
			{at: 6 * time.Minute, do: "tick", wantOffline: []string{}, wantRefresh: []string{}},
		}},
		{"a disconnect alone is not offline: the agent may reconnect elsewhere", 0, []step{
			{at: 0, do: "connect", node: "a"},
			{at: time.Minute, do: "disconnect", node: "a"},
			{at: 2 * time.Minute, do: "tick", wantOffline: []string{}, wantRefresh: []string{}},
			{at: 6*time.Minute + time.Second, do: "tick", wantOffline: []string{"a"}, wantRefresh: []string{}},
		}},
		{"a live node's heartbeat time is refreshed every interval, not every beat", 0, []step{
			{at: 0, do: "connect", node: "a"},
			{at: 0, do: "connect", node: "b"},
			{at: 3 * time.Minute, do: "beat", node: "a"},
			{at: 3 * time.Minute, do: "beat", node: "b"},
			{at: 6 * time.Minute, do: "beat", node: "a"},
			{at: 6 * time.Minute, do: "beat", node: "b"},
			{at: 9 * time.Minute, do: "beat", node: "a"},
			{at: 9 * time.Minute, do: "beat", node: "b"},
			{at: 10 * time.Minute, do: "tick", wantOffline: []string{}, wantRefresh: []string{"a", "b"}},
			{at: 11 * time.Minute, do: "tick", wantOffline: []string{}, wantRefresh: []string{}},
		}},
		{"an adopted node that never connects is Unconnected after the grace, then Offline", 0, []step{
			{at: 0, do: "adopt", node: "a"},
			{at: 59 * time.Second, do: "tick", wantOffline: []string{}, wantRefresh: []string{}, wantUnconnected: []string{}},
			{at: time.Minute, do: "tick", wantOffline: []string{}, wantRefresh: []string{}, wantUnconnected: []string{"a"}},
			{at: 2 * time.Minute, do: "tick", wantOffline: []string{}, wantRefresh: []string{}, wantUnconnected: []string{}},
			{at: 5*time.Minute + time.Second, do: "tick", wantOffline: []string{"a"}, wantRefresh: []string{}, wantUnconnected: []string{}},
		}},
		{"an adopted node that connects is tracked as any other", 0, []step{
			{at: 0, do: "adopt", node: "a"},
			{at: 30 * time.Second, do: "connect", node: "a"},
			{at: 2 * time.Minute, do: "tick", wantOffline: []string{}, wantRefresh: []string{}, wantUnconnected: []string{}},
			{at: 5 * time.Minute, do: "beat", node: "a"},
			{at: 9 * time.Minute, do: "beat", node: "a"},
			{at: 10*time.Minute + 30*time.Second, do: "tick", wantOffline: []string{}, wantRefresh: []string{"a"}, wantUnconnected: []string{}},
		}},
		{"adopting a node already connected changes nothing", 0, []step{
			{at: 0, do: "connect", node: "a"},
			{at: 4 * time.Minute, do: "adopt", node: "a"},
			{at: 5*time.Minute + time.Second, do: "tick", wantOffline: []string{"a"}, wantRefresh: []string{}, wantUnconnected: []string{}},
		}},
		{"an adopted node's heartbeat time is not refreshed", time.Minute, []step{
			{at: 0, do: "adopt", node: "a"},
			{at: 4 * time.Minute, do: "tick", wantOffline: []string{}, wantRefresh: []string{}, wantUnconnected: []string{"a"}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := New(Options{OfflineTimeout: 5 * time.Minute, RefreshInterval: cmp.Or(tt.refresh, 10*time.Minute)})
			for i, s := range tt.steps {
				now := t0.Add(s.at)
				switch s.do {
				case "connect":
					tr.Connected(s.node, now)
				case "disconnect":
					tr.Disconnected(s.node)
				case "adopt":
					tr.Adopt(s.node, now)
				case "beat":
					if known, _ := tr.Heartbeat(s.node, now); !known {
						t.Fatalf("step %d: Heartbeat(%s) = false, want true", i, s.node)
					}
				case "tick":
					d := tr.Tick(now)
					if got := names(d.Offline); !reflect.DeepEqual(got, s.wantOffline) {
						t.Errorf("step %d: Tick(+%v).Offline = %v, want %v", i, s.at, got, s.wantOffline)
					}
					if got := names(d.Refresh); !reflect.DeepEqual(got, s.wantRefresh) {
						t.Errorf("step %d: Tick(+%v).Refresh = %v, want %v", i, s.at, got, s.wantRefresh)
					}
					if got := names(d.Unconnected); s.wantUnconnected != nil && !reflect.DeepEqual(got, s.wantUnconnected) {
						t.Errorf("step %d: Tick(+%v).Unconnected = %v, want %v", i, s.at, got, s.wantUnconnected)
					}
				}
			}
		})
	}
}

func TestHeartbeatFromUnknownNode(t *testing.T) {
	tr := New(Options{})
	if known, _ := tr.Heartbeat("ghost", t0); known {
		t.Error("Heartbeat(unknown node) = true, want false: a node must open a stream first")
	}
}

// TestLate: a connected node silent past LateAfter is reported Late once,
// and is back with its next heartbeat; a disconnected or adopted one is
// not Late (it is already marked otherwise).
func TestLate(t *testing.T) {
	tr := New(Options{OfflineTimeout: 5 * time.Minute, LateAfter: 90 * time.Second})
	tr.Connected("a", t0)
	tr.Connected("gone", t0)
	tr.Disconnected("gone")
	tr.Adopt("adopted", t0)
	late := func(at time.Duration, want ...string) {
		t.Helper()
		if want == nil {
			want = []string{}
		}
		if got := names(tr.Tick(t0.Add(at)).Late); !reflect.DeepEqual(got, want) {
			t.Errorf("Tick(+%v).Late = %v, want %v", at, got, want)
		}
	}
	late(90 * time.Second)
	late(91*time.Second, "a")
	late(2 * time.Minute) // once
	if known, back := tr.Heartbeat("a", t0.Add(150*time.Second)); !known || !back || !tr.Late("a") {
		t.Errorf("Heartbeat after Late = %v, %v; want known and back, still Late until Responding", known, back)
	}
	if _, back := tr.Heartbeat("a", t0.Add(155*time.Second)); !back {
		t.Error("a heartbeat before Responding is not back: a failed write would leave the node unschedulable")
	}
	tr.Responding("a")
	if _, back := tr.Heartbeat("a", t0.Add(160*time.Second)); back || tr.Late("a") {
		t.Error("a heartbeat after Responding is back again")
	}
	late(251*time.Second, "a") // silent again
}
