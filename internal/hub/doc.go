// Package hub serves agents. A hub is stateless (DESIGN.md principle 1): it
// holds agents' gRPC streams, keeps their heartbeats in memory (package
// liveness), signs certificates for approved nodes, pushes work with
// per-node revisions, and writes FleetNode status only on transitions.
//
// Any number of hubs may run against one API. Each holds a Lease named
// drover-hub-<name> in the Drover namespace; the manager marks a hub's nodes
// Offline only when that Lease has lapsed and no other hub took them over.
//
// What it does not do: decide which node runs what (the manager does), or
// keep anything a restart would lose.
package hub
