package fleetnode

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
)

const (
	online  = fleetv1.FleetNodeOnline
	offline = fleetv1.FleetNodeOffline
	pending = fleetv1.FleetNodePending
	normalT = corev1.EventTypeNormal
	warnT   = corev1.EventTypeWarning
	unknown = metav1.ConditionUnknown
	isTrue  = metav1.ConditionTrue
	isFalse = metav1.ConditionFalse
)

var (
	since     = now.Add(-time.Minute)
	revokedAt = func(hub string) metav1.Condition {
		return readyC(isFalse, fleetv1.ReasonRevoked, "the node's identity was revoked; hub "+hub+" closed its stream and hubs refuse it")
	}
	hubLostAtB = readyC(unknown, fleetv1.ReasonHubLost, "hub hub-a stopped renewing its Lease and the agent has not reconnected; hub hub-b took the node over at 2026-11-23T13:00:00Z: Offline after 5m0s unless it connects")
)

func TestHubSetters(t *testing.T) {
	disconnected := readyC(unknown, fleetv1.ReasonDisconnected, "the agent's stream to hub hub-a ended at 2026-11-23T13:00:00Z; Offline after 5m0s unless it reconnects")
	notResponding := readyC(unknown, fleetv1.ReasonNotResponding, "nothing from the agent since 2026-11-23T12:59:00Z though its stream to hub hub-a is open; Offline after 5m0s unless it is heard from")
	runSetterTests(t, []setterTest{
		// Registration.
		{name: "a registered node is not connected yet and has no phase (Pending is the manager's)",
			node: node("", ""), set: func(n *fleetv1.FleetNode) Change { return SetRegistered(n, now, nil) },
			wantConds: []metav1.Condition{readyC(isFalse, fleetv1.ReasonNotConnected, "the agent has not opened a stream yet")}},

		// Connect.
		{name: "a first connect makes the node Online at the hub and is announced",
			node: node(pending, "", readyC(isFalse, fleetv1.ReasonNotConnected, "x")), set: connect("hub-a"),
			wantPhase: online, wantHub: "hub-a", wantConds: []metav1.Condition{readyC(isTrue, fleetv1.ReasonConnected, "connected to hub hub-a")},
			wantEvent: fleetv1.ReasonConnected, wantType: normalT},
		{name: "a reconnect to the same hub while Ready is written but not announced",
			node: connectedAt("hub-a"), set: connect("hub-a"),
			wantPhase: online, wantHub: "hub-a", wantConds: []metav1.Condition{readyC(isTrue, fleetv1.ReasonConnected, "connected to hub hub-a")}},
		{name: "a return after a disconnect is announced",
			node: node(online, "hub-a", disconnected), set: connect("hub-a"),
			wantPhase: online, wantHub: "hub-a", wantConds: []metav1.Condition{readyC(isTrue, fleetv1.ReasonConnected, "connected to hub hub-a")},
			wantEvent: fleetv1.ReasonConnected, wantType: normalT},
		{name: "a move from another hub while Online is MovedHub, not a flap",
			node: node(online, "hub-a", disconnected), set: connect("hub-b"),
			wantPhase: online, wantHub: "hub-b", wantConds: []metav1.Condition{readyC(isTrue, fleetv1.ReasonMovedHub, "moved from hub hub-a to hub hub-b")},
			wantEvent: fleetv1.ReasonMovedHub, wantType: normalT},
		{name: "a move away from a hub that claimed the node from a lost hub says so",
			node: node(online, "hub-b", hubLostAtB), set: connect("hub-c"),
			wantPhase: online, wantHub: "hub-c", wantConds: []metav1.Condition{readyC(isTrue, fleetv1.ReasonMovedHub, "moved from hub hub-b to hub hub-c (hub hub-b had taken the node over from a lost hub)")},
			wantEvent: fleetv1.ReasonMovedHub, wantType: normalT},
		{name: "a connect after Offline is Connected, not MovedHub",
			node: node(offline, "hub-a", readyC(isFalse, fleetv1.ReasonHeartbeatTimeout, "x")), set: connect("hub-b"),
			wantPhase: online, wantHub: "hub-b", wantConds: []metav1.Condition{readyC(isTrue, fleetv1.ReasonConnected, "connected to hub hub-b")},
			wantEvent: fleetv1.ReasonConnected, wantType: normalT},
		{name: "a revoked node is never connected (the hub refused it before)",
			node: revoked(node(fleetv1.FleetNodeRevoked, "hub-a")), set: connect("hub-a"),
			wantPhase: fleetv1.FleetNodeRevoked, wantHub: "hub-a", wantUnchanged: true},

		// Disconnect.
		{name: "a stream that ends makes Ready Unknown, the node still Online",
			node: connectedAt("hub-a"), set: func(n *fleetv1.FleetNode) Change { return SetDisconnected(n, "hub-a", now, timeout) },
			wantPhase: online, wantHub: "hub-a", wantConds: []metav1.Condition{disconnected},
			wantEvent: fleetv1.ReasonDisconnected, wantType: normalT},
		{name: "a disconnect from a hub the node left changes nothing",
			node: connectedAt("hub-b"), set: func(n *fleetv1.FleetNode) Change { return SetDisconnected(n, "hub-a", now, timeout) },
			wantPhase: online, wantHub: "hub-b", wantConds: []metav1.Condition{readyC(isTrue, fleetv1.ReasonConnected, "connected to hub hub-b")}, wantUnchanged: true},
		{name: "a disconnect of a node already Unknown changes nothing",
			node: node(online, "hub-a", notResponding), set: func(n *fleetv1.FleetNode) Change { return SetDisconnected(n, "hub-a", now, timeout) },
			wantPhase: online, wantHub: "hub-a", wantConds: []metav1.Condition{notResponding}, wantUnchanged: true},
		{name: "a revoked node's closed stream makes Ready False, Revoked, and leaves the manager's phase",
			node: revoked(connectedAt("hub-a")), set: func(n *fleetv1.FleetNode) Change { return SetDisconnected(n, "hub-a", now, timeout) },
			wantPhase: online, wantHub: "hub-a", wantConds: []metav1.Condition{revokedAt("hub-a")}},
		{name: "so does it on a node the manager already made Revoked",
			node:      revoked(node(fleetv1.FleetNodeRevoked, "hub-a", readyC(isTrue, fleetv1.ReasonConnected, "connected to hub hub-a"))),
			set:       func(n *fleetv1.FleetNode) Change { return SetDisconnected(n, "hub-a", now, timeout) },
			wantPhase: fleetv1.FleetNodeRevoked, wantHub: "hub-a", wantConds: []metav1.Condition{revokedAt("hub-a")}},

		// Adopted after a restart, not connected within the grace.
		{name: "an adopted node that has not connected is Disconnected",
			node: connectedAt("hub-a"), set: func(n *fleetv1.FleetNode) Change { return SetUnconnected(n, "hub-a", since, now, timeout) },
			wantPhase: online, wantHub: "hub-a",
			wantConds: []metav1.Condition{readyC(unknown, fleetv1.ReasonDisconnected, "not connected since hub hub-a restarted at 2026-11-23T12:59:00Z; Offline after 5m0s unless it reconnects")},
			wantEvent: fleetv1.ReasonDisconnected, wantType: normalT},
		{name: "a node claimed from a lost hub keeps saying HubLost",
			node: node(online, "hub-b", hubLostAtB), set: func(n *fleetv1.FleetNode) Change { return SetUnconnected(n, "hub-b", since, now, timeout) },
			wantPhase: online, wantHub: "hub-b", wantConds: []metav1.Condition{hubLostAtB}, wantUnchanged: true},

		// Silence on an open stream.
		{name: "a connected node silent for a few heartbeats is NotResponding",
			node: connectedAt("hub-a"), set: func(n *fleetv1.FleetNode) Change { return SetNotResponding(n, "hub-a", since, now, timeout) },
			wantPhase: online, wantHub: "hub-a", wantConds: []metav1.Condition{notResponding},
			wantEvent: fleetv1.ReasonNotResponding, wantType: warnT},
		{name: "a node not Ready is not marked NotResponding",
			node: node(online, "hub-a", disconnected), set: func(n *fleetv1.FleetNode) Change { return SetNotResponding(n, "hub-a", since, now, timeout) },
			wantPhase: online, wantHub: "hub-a", wantConds: []metav1.Condition{disconnected}, wantUnchanged: true},
		{name: "a node heard from again gets its Ready reason back",
			node: node(online, "hub-a", notResponding),
			set: func(n *fleetv1.FleetNode) Change {
				prev := readyC(isTrue, fleetv1.ReasonMovedHub, "moved from hub hub-x to hub hub-a")
				return SetResponding(n, "hub-a", &prev, now)
			},
			wantPhase: online, wantHub: "hub-a",
			wantConds: []metav1.Condition{readyC(isTrue, fleetv1.ReasonMovedHub, "moved from hub hub-x to hub hub-a (heard from again after a silence)")},
			wantEvent: fleetv1.ReasonConnected, wantType: normalT},
		{name: "without the reason from before (a restart), it is Connected, and the note is not repeated",
			node: node(online, "hub-a", notResponding),
			set: func(n *fleetv1.FleetNode) Change {
				prev := readyC(isTrue, fleetv1.ReasonConnected, "connected to hub hub-a (heard from again after a silence)")
				if c := SetResponding(n.DeepCopy(), "hub-a", nil, now); !c.Changed {
					t.Error("SetResponding(nil prev) changed nothing")
				}
				return SetResponding(n, "hub-a", &prev, now)
			},
			wantPhase: online, wantHub: "hub-a",
			wantConds: []metav1.Condition{readyC(isTrue, fleetv1.ReasonConnected, "connected to hub hub-a (heard from again after a silence)")},
			wantEvent: fleetv1.ReasonConnected, wantType: normalT},
		{name: "a node that is not NotResponding has nothing to undo",
			node: connectedAt("hub-a"), set: func(n *fleetv1.FleetNode) Change { return SetResponding(n, "hub-a", nil, now) },
			wantPhase: online, wantHub: "hub-a", wantConds: []metav1.Condition{readyC(isTrue, fleetv1.ReasonConnected, "connected to hub hub-a")}, wantUnchanged: true},

		// Offline.
		{name: "a silent node goes Offline after the timeout",
			node: node(online, "hub-a", disconnected), set: func(n *fleetv1.FleetNode) Change { return SetHeartbeatTimeout(n, "hub-a", since, false, now) },
			wantPhase: offline, wantHub: "hub-a", wantConds: []metav1.Condition{readyC(isFalse, fleetv1.ReasonHeartbeatTimeout, "no heartbeat since 2026-11-23T12:59:00Z")},
			wantEvent: fleetv1.ReasonHeartbeatTimeout, wantType: warnT},
		{name: "an adopted node goes Offline counted from the restart",
			node: node(online, "hub-a", disconnected), set: func(n *fleetv1.FleetNode) Change { return SetHeartbeatTimeout(n, "hub-a", since, true, now) },
			wantPhase: offline, wantHub: "hub-a",
			wantConds: []metav1.Condition{readyC(isFalse, fleetv1.ReasonHeartbeatTimeout, "not connected since hub hub-a restarted at 2026-11-23T12:59:00Z (last heartbeat on record: none)")},
			wantEvent: fleetv1.ReasonHeartbeatTimeout, wantType: warnT},
		{name: "a node claimed from a lost hub goes Offline counted from the claim",
			node: node(online, "hub-b", hubLostAtB), set: func(n *fleetv1.FleetNode) Change { return SetHeartbeatTimeout(n, "hub-b", since, true, now) },
			wantPhase: offline, wantHub: "hub-b",
			wantConds: []metav1.Condition{readyC(isFalse, fleetv1.ReasonHeartbeatTimeout, "not connected since hub hub-b took it over from a lost hub at 2026-11-23T12:59:00Z (last heartbeat on record: none)")},
			wantEvent: fleetv1.ReasonHeartbeatTimeout, wantType: warnT},
		{name: "a node another hub holds now is not made Offline",
			node: connectedAt("hub-b"), set: func(n *fleetv1.FleetNode) Change { return SetHeartbeatTimeout(n, "hub-a", since, false, now) },
			wantPhase: online, wantHub: "hub-b", wantConds: []metav1.Condition{readyC(isTrue, fleetv1.ReasonConnected, "connected to hub hub-b")}, wantUnchanged: true},
		{name: "a revoked node keeps the manager's phase: only Ready goes False",
			node: revoked(node(fleetv1.FleetNodeRevoked, "hub-a", disconnected)), set: func(n *fleetv1.FleetNode) Change { return SetHeartbeatTimeout(n, "hub-a", since, false, now) },
			wantPhase: fleetv1.FleetNodeRevoked, wantHub: "hub-a", wantConds: []metav1.Condition{revokedAt("hub-a")}},

		// A lost hub's node.
		{name: "a live hub claims a node Online at a lost hub: HubLost, announced",
			node: connectedAt("hub-a"), set: func(n *fleetv1.FleetNode) Change { return SetHubLost(n, "hub-b", "hub-a", now, timeout) },
			wantPhase: online, wantHub: "hub-b", wantConds: []metav1.Condition{hubLostAtB},
			wantEvent: fleetv1.ReasonHubLost, wantType: warnT},
		{name: "a second hub claiming after the first changes nothing",
			node: node(online, "hub-b", hubLostAtB), set: func(n *fleetv1.FleetNode) Change { return SetHubLost(n, "hub-c", "hub-a", now, timeout) },
			wantPhase: online, wantHub: "hub-b", wantConds: []metav1.Condition{hubLostAtB}, wantUnchanged: true},
		{name: "a node that moved on is not claimed",
			node: connectedAt("hub-c"), set: func(n *fleetv1.FleetNode) Change { return SetHubLost(n, "hub-b", "hub-a", now, timeout) },
			wantPhase: online, wantHub: "hub-c", wantConds: []metav1.Condition{readyC(isTrue, fleetv1.ReasonConnected, "connected to hub hub-c")}, wantUnchanged: true},
		{name: "an Offline node is not claimed",
			node: node(offline, "hub-a"), set: func(n *fleetv1.FleetNode) Change { return SetHubLost(n, "hub-b", "hub-a", now, timeout) },
			wantPhase: offline, wantHub: "hub-a", wantUnchanged: true},
		{name: "a hub does not claim its own nodes",
			node: connectedAt("hub-a"), set: func(n *fleetv1.FleetNode) Change { return SetHubLost(n, "hub-a", "hub-a", now, timeout) },
			wantPhase: online, wantHub: "hub-a", wantConds: []metav1.Condition{readyC(isTrue, fleetv1.ReasonConnected, "connected to hub hub-a")}, wantUnchanged: true},
		{name: "a revoked node is not claimed",
			node: revoked(connectedAt("hub-a")), set: func(n *fleetv1.FleetNode) Change { return SetHubLost(n, "hub-b", "hub-a", now, timeout) },
			wantPhase: online, wantHub: "hub-a", wantConds: []metav1.Condition{readyC(isTrue, fleetv1.ReasonConnected, "connected to hub hub-a")}, wantUnchanged: true},

		// Heartbeat refresh.
		{name: "the coarse heartbeat time of a node at another hub is not refreshed",
			node: connectedAt("hub-b"), set: func(n *fleetv1.FleetNode) Change { return SetHeartbeat(n, "hub-a", now) },
			wantPhase: online, wantHub: "hub-b", wantConds: []metav1.Condition{readyC(isTrue, fleetv1.ReasonConnected, "connected to hub hub-b")}, wantUnchanged: true},
	})
}

func connect(hub string) func(*fleetv1.FleetNode) Change {
	return func(n *fleetv1.FleetNode) Change { return SetConnected(n, hub, now, nil) }
}

func TestSetConnectedRecordsTheConnection(t *testing.T) {
	n := node(pending, "")
	n.Generation = 3
	SetConnected(n, "hub-a", now.Add(500*time.Millisecond), &Info{AgentVersion: "v2"})
	s := n.Status
	if !s.ConnectedTime.Time.Equal(now) || !s.LastHeartbeatTime.Time.Equal(now) || s.ObservedGeneration != 3 || s.AgentVersion != "v2" {
		t.Errorf("status after SetConnected = connected %v, heartbeat %v, observedGeneration %d, version %q; want %v, %v, 3, v2",
			s.ConnectedTime, s.LastHeartbeatTime, s.ObservedGeneration, s.AgentVersion, now, now)
	}
}

func TestSetHeartbeat(t *testing.T) {
	n := connectedAt("hub-a")
	if c := SetHeartbeat(n, "hub-a", now.Add(time.Millisecond)); !c.Changed || !n.Status.LastHeartbeatTime.Time.Equal(now) {
		t.Errorf("SetHeartbeat() = %+v, lastHeartbeatTime %v; want a change to %v", c, n.Status.LastHeartbeatTime, now)
	}
	if c := SetHeartbeat(n, "hub-a", now); c.Changed {
		t.Error("SetHeartbeat() of the same second changed the node")
	}
}
