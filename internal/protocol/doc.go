// Package protocol holds the rules of the Drover agent protocol that both the
// hub and drover-agent must agree on: revision tracking, envelope validation,
// and the wire encoding of an agentv1.Envelope.
//
// # What
//
// A Tracker follows one node's revision stream (hub->agent Snapshot, Dispatch
// and Cancel; agent->hub NodeState and Status). Each incoming revision gets a
// Verdict:
//
//	rev == last+1  Apply      apply the message and advance
//	rev == last    Duplicate  already applied: ack again, change nothing
//	rev <  last    Stale      older than what we have: discard
//	rev >  last+1  Gap        a message was missed: ask for a full sync,
//	                          do not advance
//
// A full sync (a Snapshot from the hub, a NodeState from the agent) resets the
// tracker to the sender's revision with Tracker.Reset.
//
//	  Step(n+1): Apply, last = n+1
//	   +-----+
//	   |     v
//	[ last = n ] --- Step(> n+1): Gap ---> ask for a full sync
//	  ^   |                                        |
//	  |   +-- Step(<= n): Duplicate / Stale        |
//	  |                                            |
//	  +---- Reset(r > n): Apply, last = r <--------+
//
// Validate checks every field an envelope carries against the limits in this
// package (sizes, names, the kind/payload pairing) so that a transport or a
// handler never sees a half-formed message. Decode and Encode wrap proto
// (un)marshalling with the same checks and the MaxEnvelopeBytes limit.
//
// # Why
//
// The revision rule comes from the Fornax node-agent design (seed 002, "Node
// revision number"): the receiver compares the revision in each message with
// the last one it applied, and a gap makes it ask for the whole state instead
// of a backlog. Keeping the rule here, pure and table-tested, means the hub,
// the agent and the simulator cannot drift apart.
//
// # What not
//
// Like etcd-io/raft's core, this package does no I/O, starts no goroutines and
// never reads the clock: callers feed revisions in and act on the verdicts
// (persisting, acking, requesting a full sync). It does not know about gRPC,
// MQTT or SQLite, and it must never import k8s.io/* or sigs.k8s.io/*, because
// drover-agent links it.
package protocol
