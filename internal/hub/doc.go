// Package hub serves agents. A hub is stateless (DESIGN.md principle 1): it
// holds agents' gRPC streams, keeps their heartbeats in memory (package
// liveness), signs certificates for approved nodes, pushes work with
// per-node revisions, and writes FleetNode status only on transitions.
//
// Any number of hubs may run against one API. Each holds a Lease named
// drover-hub-<name> in the Drover namespace. Hubs alone write a FleetNode's
// Ready condition and its Online and Offline phases (package fleetnode): a
// live hub claims the nodes still Online at a hub whose Lease expired and
// makes them Offline unless their agents connect again.
//
// Work: components that decide what a node runs hand the hub items with
// Dispatch and withdraw them with Cancel, list each node's items through
// Options.Work (a WorkSource), and follow what agents report through
// Options.Status (a StatusSink). Dispatch and Cancel are sent once on the
// node's open stream; a node that reconnects gets a snapshot of its
// WorkSource list instead of the messages it missed, and cancels what the
// list no longer holds. Revisions on a stream are strictly in order; the
// agent asks for a snapshot when it sees a gap.
//
// What it does not do: decide which node runs what (the manager does), or
// keep anything a restart would lose.
package hub
