// Package hub serves agents. A hub is stateless (DESIGN.md principle 1): it
// holds agents' gRPC streams, keeps their heartbeats in memory (package
// liveness), registers nodes and has their certificates signed, pushes
// work with per-node revisions, and writes FleetNode status only on
// transitions.
//
// Keys: a hub holds no CA key and reads no Secret. Its Signer (the
// manager's, internal/signer) signs node certificates and the hub's own,
// checks bootstrap tokens, and checks every node request again itself;
// the hub trusts and serves Drover's CA from the ConfigMap
// drover-ca-bundle (BundleName). Without a Signer, a hub signs with the
// CA Secret itself (tests; `drover hub` without --signer).
//
// Any number of hubs may run against one API. Each holds a Lease named
// drover-hub-<name> in the Drover namespace. Hubs alone write a FleetNode's
// Ready condition and its Online and Offline phases (package fleetnode): a
// live hub claims the nodes still Online at a hub whose Lease expired and
// makes them Offline unless their agents connect again.
//
// Work: the hub carries work for features (Options.Features), each the hub
// side of one kind of work (internal/nodejob/nodejobhub, internal/task/taskhub)
// implementing Feature. A feature owns a set of work uids: it hands the hub
// items with Dispatch (or Call, to wait for the agent's answer) and withdraws
// them with Cancel through the Link it gets in Attach, lists each node's
// items in WorkFor, and follows what agents report about its uids. The hub
// routes each report to the feature that owns its uid and drops (and counts)
// the rest. Dispatch and Cancel are sent once on the node's open stream; a
// node that reconnects gets a snapshot of every feature's list instead of
// the messages it missed, and cancels what the list no longer holds.
// Revisions on a stream are strictly in order; the agent asks for a
// snapshot when it sees a gap. internal/hubsetup builds a hub and its
// features.
//
// What it does not do: decide which node runs what (the manager does), know
// what a feature's work means, or keep anything a restart would lose.
package hub
