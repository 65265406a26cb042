// Package apps is drover-agent's node actor for serverless applications
// (serverless.drover.io, issue 16, seed 002): it runs the work items of
// types appwire.TypeInstance (the seed's PodCreate; a cancel is
// PodTerminate) and appwire.TypeSession (SessionStart; a cancel is
// SessionClose).
//
// One Node owns the Pod and Session actors (internal/serverless/actor) of
// every instance and session of the node, under one lock. It steps them
// with messages and its clock (one timer, for the nearest deadline of any
// actor), routes their ToPod/ToSession messages between them, and carries
// out their effects:
//
//   - StartInstance: the instance's session socket is served first
//     (internal/agent/sessionsvc; its path is in the instance's
//     environment), then the process runtime (internal/agent/instance)
//     starts it and probes it (the spec's liveness and readiness): the pod
//     hears Started, then Live, or StartFailed. The pid, start time and
//     cgroup are recorded in the agent's DB (Store) before Live. Its
//     process ending at any time is Exited (the actor's Crash).
//   - FreezeInstance / ThawInstance: the cgroup freezer (standby,
//     activation). A freeze that fails is FreezeFailed; a thaw that fails
//     is Exited.
//   - StopInstance: SIGTERM, SIGKILL after StopGrace, its cgroup killed
//     and removed, its port released, its socket removed: Stopped.
//   - SendSessionStart / SendSessionClose: through the session service;
//     the session metadata file (instance.WriteSessionFile) is rewritten
//     before each SessionStart and after each session ends. The service's
//     callbacks (SessionReady, heartbeats, client join/leave, ...) come
//     back as Session actor messages.
//   - PodReport / SessionReport: the item's progress report (reason: the
//     state; message: appwire.InstanceReport / SessionReport JSON with the
//     port, sessions, clients, flag, ready time, and the instance's cgroup
//     CPU and memory usage at each state change).
//   - Forget: the item ends: an instance Succeeded when it was deleted,
//     else Failed with the actor's reason (crash, start failure,
//     timeouts); a session Succeeded when closed, else Failed.
//
// Runtime operations of one instance run in order on a queue of its own
// (a thaw never overtakes a freeze), outside the lock; a stop first ends
// a start or a liveness wait in progress.
//
// A session for an instance this node does not run ends at once, Failed,
// InstanceGone, unless the instance's work item is in the agent's DB and
// not over (its item and the session's run on goroutines of their own,
// so the session may come first): it waits for the instance then. A
// session bound to an instance that is still Creating binds at once (the
// actor's cold path) and hears InstanceReady when the instance is live.
//
// # Restarts
//
// Re-attach after an agent restart is not done: the instance runtime
// cannot adopt a running instance (its port, cgroup handle and session
// service state are the old process's), and the session service's
// streams broke with the old agent. When the agent stops, the items stay
// Running in its DB and their processes go on; at its next start Resume
// stops what is left of each instance (its process and its cgroup,
// thawed first if frozen, found by the recorded pid and start time) and
// ends it Failed, AgentRestarted, and each session Failed, InstanceGone.
// The hub then replaces the instances.
package apps
