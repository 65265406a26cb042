// Package agent is drover-agent: it registers the machine with a hub, keeps
// one stream open to some hub, heartbeats, applies hub->agent state by
// revision (seed 002), records everything in its SQLite DB (package store)
// and reports back through a durable outbox, so a restart resumes where it
// stopped and a re-delivered message has no second effect.
//
// It imports nothing from k8s.io: it must run on small devices, and it only
// ever speaks the agent protocol.
//
// Life of a connection:
//
//	no identity ─► Register (bootstrap token) ─► PENDING … APPROVED ─► identity saved
//	identity ─► GetMessage(last revisions) ─► NodeConfiguration, Snapshot ─► Dispatch/Cancel …
//	         └► heartbeats + outbox (NodeState, Status) over SendMessage
//	stream lost ─► back off, next hub ─► GetMessage again (the hub re-sends a Snapshot)
//
// Work runs beside the connection, one item at a time, except the items of
// a ConcurrentRunner (tasks), which run side by side, each on a goroutine
// of its own: a broken stream neither interrupts nor repeats an item, and
// its status waits in the outbox.
// An item ends once (Succeeded, Failed or Cancelled); a Cancel, or a
// snapshot that no longer lists the item, interrupts its runner, and an
// item the hub dropped is forgotten once its Cancelled status is queued.
package agent
