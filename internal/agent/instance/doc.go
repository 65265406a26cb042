// Package instance is drover-agent's process runtime for serverless
// instances (seed 002's "CRI" for the process runtime): it starts an
// Application's argv as an instance, probes it, freezes it as a standby
// and thaws it on activation, and stops it. The Pod actor
// (internal/serverless/actor) decides; this package does.
//
// An instance is a task attempt of the exec driver (internal/agent/taskexec):
// the same argv without a shell, minimal environment, unprivileged user,
// own 0700 dir under the work root, artifacts checked by sha256, bounded
// logs through the log shim, and its own cgroup (internal/agent/cgroup),
// killed whole when it stops. On top of that:
//
//   - Ports: every instance gets its own host port from the node's range
//     (Ports), passed in DROVER_PORT; the instances of a node never collide.
//   - Probes: liveness and readiness, each an exec argv (as the instance's
//     user, in its dir and cgroup), a TCP connect or an HTTP GET to its port,
//     with a timeout per try (WaitLive polls them).
//   - Standby = started, live, then frozen with the cgroup freezer (v1
//     freezer.state or v2 cgroup.freeze, whichever the node has): a frozen
//     instance uses no CPU and keeps its memory, so activation (Thaw) is a
//     write to the cgroup, not a start. Seed 002's Quark runtime instead
//     pauses a container at its entry point, before it initialises; here the
//     instance has initialised and passed liveness before it is frozen. A
//     frozen instance is not probed (a probe would hang): its liveness
//     (Alive) is its process and its cgroup existing.
//   - The session metadata file: JSON with the Application's and the
//     sessions' data, in the instance's dir (DROVER_SESSION_FILE), the
//     agent's and read-only (0444), replaced atomically on every change.
//
// Standby needs cgroups (the agent runs as root on a node with cgroup v1's
// freezer controller or cgroup v2).
package instance
