// Package store is drover-agent's durable memory: one SQLite file holding the
// node's identity (key, certificate, CA, last hub), the two revision counters
// of the agent protocol, the work items the hub delivered with their phases,
// the state of each action of a work item's flow (node jobs: Check, BackUp,
// Upgrade, ...; written before and after each action so that a restart
// resumes or rolls back instead of repeating it), and an outbox of
// agent->hub messages that must survive a restart until the hub acks them.
//
// # Why
//
// Seed 002 ("NodeAgentDB", "Node revision number") has the agent keep its
// revision and its work in its own SQLite DB so that a restarted agent resumes
// where it stopped instead of re-registering as a brand-new node. Delivery is
// made idempotent here: PutWork, ApplyDispatch and ApplySnapshot never touch a
// uid they already hold, so a re-sent Dispatch or Snapshot cannot start work
// twice, and the revision moves in the same transaction as the work.
//
// # How
//
// Following kine, the driver is pure-Go modernc.org/sqlite (CGO_ENABLED=0)
// and tests use real files in t.TempDir(). The file is in WAL mode with
// synchronous=FULL (agents lose power; the write rate is tiny), foreign keys
// on and a busy timeout. Writes go through a pool of exactly one connection
// whose transactions BEGIN IMMEDIATE, so writers in this process queue in
// database/sql instead of failing with SQLITE_BUSY, and another process
// waits on the busy timeout rather than deadlocking on a lock upgrade. Reads
// use a separate query_only pool, which WAL lets run beside the writer.
//
// The schema is versioned by migrations/NNNN_name.sql files embedded in the
// binary and recorded in schema_migrations; each runs in its own transaction.
// Open refuses a database whose version is newer than the binary knows.
//
// # What not
//
// The store decides nothing: revision ordering is internal/protocol's
// Tracker, and phases are free text owned by the agent's runner. It keeps no
// history (seed 002 chooses full sync over a backlog) and is not shared with
// the hub. It must never import k8s.io/* or sigs.k8s.io/*, because
// drover-agent links it.
package store
