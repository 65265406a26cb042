// Package liveness keeps agents' heartbeats in a hub's memory and decides when
// the API must hear about one: a node going Offline, or the coarse
// lastHeartbeatTime needing a refresh. A restarted hub adopts the nodes the
// API still shows Online at it, so that one that never comes back goes
// Offline too. Heartbeats end here (DESIGN.md
// principle 3): the API sees transitions, not each heartbeat.
//
// Tracker is pure: time comes in as arguments, decisions come out as return
// values; it starts no goroutines and does no I/O. It is not safe for
// concurrent use; the hub guards it with a mutex.
package liveness
