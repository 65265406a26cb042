package liveness

import (
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
		do          string        // "connect", "disconnect", "beat", "tick"
		node        string
		wantOffline []string
		wantRefresh []string
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"a node that heartbeats is never offline", []step{
			{at: 0, do: "connect", node: "a"},
			{at: 4 * time.Minute, do: "beat", node: "a"},
			{at: 8 * time.Minute, do: "beat", node: "a"},
			{at: 9 * time.Minute, do: "tick", wantOffline: []string{}, wantRefresh: []string{}},
		}},
		{"a silent node goes offline after the timeout, once", []step{
			{at: 0, do: "connect", node: "a"},
			{at: 5 * time.Minute, do: "tick", wantOffline: []string{}, wantRefresh: []string{}},
			{at: 5*time.Minute + time.Second, do: "tick", wantOffline: []string{"a"}, wantRefresh: []string{}},
			{at: 6 * time.Minute, do: "tick", wantOffline: []string{}, wantRefresh: []string{}},
		}},
		{"a disconnect alone is not offline: the agent may reconnect elsewhere", []step{
			{at: 0, do: "connect", node: "a"},
			{at: time.Minute, do: "disconnect", node: "a"},
			{at: 2 * time.Minute, do: "tick", wantOffline: []string{}, wantRefresh: []string{}},
			{at: 6*time.Minute + time.Second, do: "tick", wantOffline: []string{"a"}, wantRefresh: []string{}},
		}},
		{"a live node's heartbeat time is refreshed every interval, not every beat", []step{
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
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := New(Options{OfflineTimeout: 5 * time.Minute, RefreshInterval: 10 * time.Minute})
			for i, s := range tt.steps {
				now := t0.Add(s.at)
				switch s.do {
				case "connect":
					tr.Connected(s.node, now)
				case "disconnect":
					tr.Disconnected(s.node)
				case "beat":
					if !tr.Heartbeat(s.node, now) {
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
				}
			}
		})
	}
}

func TestHeartbeatFromUnknownNode(t *testing.T) {
	tr := New(Options{})
	if tr.Heartbeat("ghost", t0) {
		t.Error("Heartbeat(unknown node) = true, want false: a node must open a stream first")
	}
}
