// Package session is one agent's stream on a hub as a pure state machine:
// the hub->agent queue and its revisions, the envelopes not acked yet, the
// snapshots that replace the agent's view, and the agent->hub bookkeeping
// (its report revisions, the envelope ids already received). A Machine is
// stepped by events (Dispatch, Cancel, BeginSnapshot/EndSnapshot, Next,
// Ack, Received, Status, NodeState, Close) and answers with what to put on
// the stream and with verdicts. It starts no goroutine, holds no lock,
// reads no clock and does no I/O: the hub (package hub) keeps one per open
// stream behind its own mutex, wakes the stream's goroutine when something
// was queued, and does the sending.
//
// The hub->agent side goes through these states:
//
//	            New (the stream's first snapshot is counted as being built)
//	             |
//	             v
//	+------> Streaming <-------------------------------+
//	|       Dispatch/Cancel: next revision, queued,    |
//	|       pending until acked; Next sends the queue  |
//	|       head (queued Dispatches joined into one    |
//	|       batch when the agent names dispatch-batch) |
//	|            |                          |          |
//	|  queue full on Dispatch/Cancel   BeginSnapshot   |
//	|            v                          v          |
//	|        Resync                    Building -------+ EndSnapshot: the
//	|  Dispatch/Cancel take revisions  (any number at    snapshot shows the
//	|  but are only remembered; once   once; what is     Dispatches/Cancels
//	|  the queue drained Next says     queued meanwhile  queued since the
//	|  Resync: the hub builds a        is remembered)    build began; if the
//	|  snapshot, which carries them         |            queue is full it
//	+--------- BeginSnapshot ---------------+            waits in the snapshot
//	                                                     slot and Next sends
//	                                                     it before the queue
//
//	any state --Close(reason)--> Closed: every event is refused with
//	ErrClosed and Next says Closed; a second snapshot meeting a full queue
//	(the slot taken) also closes, with "send queue full".
//
// Rules kept visible in the code:
//   - Revisions on the stream are strictly consecutive: taking a revision
//     and queuing are one step (an event), so the agent never sees a gap
//     that is not there. A stream continues from the revision the agent last
//     applied, so nothing sent before its first snapshot looks stale.
//   - An envelope that breaks the protocol (malformed, larger than
//     protocol.MaxEnvelopeBytes) is refused and uses up no revision.
//   - An ack settles the envelope it names, and a batch's ack settles every
//     envelope the batch joined. An acked snapshot settles everything sent
//     before it: the agent never acks what a gap made it skip.
//   - A snapshot is the node's whole state after every revision taken
//     before it: the list the hub built (outside the Machine, while events
//     go on) changed by the Dispatches and Cancels queued since the build
//     began, or not queued at all because the queue was full.
//   - Envelope ids the agent sends are remembered (the last SeenLimit of
//     them) so that a re-send is answered as a duplicate; heartbeats and
//     log chunks are not passed to Received, so an idle stream remembers
//     nothing new.
//   - Agent reports follow protocol.Tracker: a Status applies at the next
//     revision, a NodeState replaces everything older.
package session
