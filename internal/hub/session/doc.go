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
//	       New: the stream's first snapshot counts as being built
//	        |
//	        v
//	  +-> Streaming ------------ BeginSnapshot ------------> Building
//	  |   Dispatch/Cancel take the next              (any number at once;
//	  |   revision, are queued, pending              the Dispatches and
//	  |   until acked. Next sends the queue          Cancels taken meanwhile
//	  |   head, the Dispatches behind it             are remembered)
//	  |   joined when batching                             |
//	  |     |                                        EndSnapshot: the snapshot
//	  |   queue full on Dispatch/Cancel              shows them; it is queued,
//	  |     v                                        or waits in the snapshot
//	  |   Resync: Dispatch/Cancel take               slot if the queue is full
//	  |   revisions but are only remembered;         (Next sends it first)
//	  |   once the queue drained Next says                 |
//	  |   Resync --BeginSnapshot--> Building               |
//	  +----------------------------------------------------+
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
