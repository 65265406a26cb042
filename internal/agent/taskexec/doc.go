// Package taskexec is drover-agent's exec driver for tasks (batch.drover.io,
// seed 001): it runs one attempt of a task as a process and tells how it
// ended, in the terms of the hub-agent contract (internal/task/taskwire).
//
// # What it does
//
// An attempt is the argv of its spec, run with os/exec and never through a
// shell, in its own process group, as its user (below), with a minimal
// environment (PATH, HOME = its own dir, DROVER_TASK_NAME,
// DROVER_TASK_NAMESPACE, DROVER_TASK_ATTEMPT) plus the spec's env. Its
// working dir is its own dir <work dir>/<work id>, a relative dir inside
// that one (created, its user's; os.Root refuses a symlink that leaves
// it), or the spec's absolute dir as it is. Its artifacts are fetched over
// http(s) before it starts, checked against their sha256, written inside
// the working dir (an os.Root refuses any path that would leave it,
// symlinks included) and given to its user. An artifact over Options.MaxArtifactBytes fails the attempt
// before it starts; the size is checked against Content-Length and counted
// while downloading (the header may be missing or false, and the transport
// decodes gzip), and the partial file is removed. stdout and stderr go to
// <state dir>/tasks/<work id>/stdout.log and stderr.log, through the
// attempt's log shim (see Logs): the task writes its logs without being
// able to open them, or anything else in the state dir.
//
// # Users and dirs
//
// An agent running as root runs each attempt as the spec's RunAsUser and
// RunAsGroup: unset user, Options.TaskUser (drover-agent --task-user,
// default nobody, else 65534:65534); unset group, the uid when RunAsUser
// is set, else the task user's group. Supplementary groups are cleared.
// uid or gid 0 fails the attempt with taskwire.ReasonRunAs unless
// Options.AllowRoot (drover-agent --allow-root-tasks): the agent checks
// it whatever the cluster's policy (NodeGrants) allowed. An agent that is
// not root cannot switch: attempts run as the agent's uid and gid, and
// one that asks for another user fails with ReasonRunAs, saying so.
//
// The state dir (the agent's DB and keys, the tasks' logs) is the agent's,
// 0700; the logs' root StateDir/tasks is 0700 too. The attempts' own dirs
// are outside it, in the work root (Options.WorkDir, default
// <state dir>-work), which is 0711: a task reaches its own dir by name and
// lists nothing. Each attempt's dir is 0700 and its user's, so a task
// running as another uid neither reads nor lists it. Tasks that run as
// the same uid are not isolated from each other (they may signal and
// trace each other, as any processes of one user may): give tenants
// different uids. Every dir above the work root must let the task users
// through (o+x); Prepare checks it and says what to change.
//
// A timeout sends SIGTERM to the group, then SIGKILL after the kill timeout;
// the attempt ends Failed with reason "timeout" and exit code 143 (it ended
// after SIGTERM) or 137 (it needed SIGKILL). A cancel does the same and ends
// Cancelled. When the command itself ends, whatever it left running in its
// group is killed: the group is the attempt's lifetime, so nothing it started
// holds on to resources the scheduler believes free.
//
// # Cgroups
//
// With Options.Cgroups (package cgroup) each attempt also runs in a cgroup
// of its own, named by its work id, created before it starts and entered
// before its first instruction (clone into the cgroup on v2, the agent's
// start shim on v1). The spec's MemoryBytes and CPUMillis (the task's
// resources) are its memory limit and CPU quota. Wherever the group is
// killed above, the cgroup is killed too: every process in it, whatever
// group or session it moved to (setsid, double forks), when the command
// ends, times out or is cancelled. An attempt over its memory limit is
// OOM-killed by the kernel and ends Failed with reason
// taskwire.ReasonOOMKilled and exit code 137, unless its command exited 0.
// When the attempt has ended its cgroup is removed. Info.Cgroup holds the
// cgroup's dirs, so that Adopt finds it again after a restart (even one
// without cgroups). Without Options.Cgroups, process groups are all there
// is: a process that leaves its group outlives its attempt.
//
// # Goroutines: one monitor for all processes
//
// The driver runs one goroutine, the monitor, whatever the number of
// processes (the seed's N+1 design, minus the N): Start and Adopt create no
// goroutine. The monitor
//
//   - learns that children ended from SIGCHLD (os/signal, whose delivery
//     goroutine is one per program) and reaps them with waitid/wait4 on their
//     own pids, never wait(-1), so it does not steal the exit of a process
//     another part of the agent started;
//   - kills a finished command's leftover group members between seeing it
//     exit (waitid WNOWAIT, the pid still held by the zombie) and reaping it,
//     so the group id cannot have been reused by then;
//   - enforces timeouts and kill timeouts with one timer set to the nearest
//     deadline;
//   - reaps the log shims (below) by pid, and ends an attempt only once
//     its shim has written all its output (or 5s after its process ended,
//     when something it started still holds its stdout or stderr);
//   - watches processes it did not start (see Adopt) by polling every
//     Options.PollInterval.
//
// # Logs
//
// The task's stdout and stderr are pipes. Their read ends are held by the
// attempt's log shim: drover-agent re-executed (/proc/self/exe, hidden
// first argument LogShimArg), started just before the task. It copies
// each pipe to its file, and before a write to a file that holds
// Options.MaxLogBytes it renames it to <name>.1 (replacing the older one)
// and starts a new one: neither file ever holds more than the bound, at
// any time, however fast the task writes, so an attempt's logs take at
// most 4 x MaxLogBytes on disk. A file is filled to the bound, so a line
// may straddle the two files. The shim ends when both pipes are closed:
// the task and everything it started that kept them have ended (with
// cgroups, killing the attempt's cgroup closes them).
//
// Why a process, not the agent: a pipe to the agent would break at an
// agent restart, and kill the task with SIGPIPE; the shim does not depend
// on the agent, and keeps the logs flowing and bounded while no agent
// runs. Its two goroutines are its own (the agent's one monitor stays
// one). It runs as the agent's user, in its own session, outside the
// attempt's group and cgroup: the task cannot signal or trace it (another
// uid, unless the task runs as root: Options.AllowRoot), killing the attempt's processes does not cut its output short,
// and its memory (a few MiB per running attempt) is not charged to the
// task's limit. Info holds its pid and start time; after a restart the
// agent re-executed (an upgrade) it is still the agent's child and is
// reaped, otherwise init reaps it. Costs: a task's stdout is a pipe, not
// a file (it cannot seek it, and a full disk or a slow one makes it block
// or lose output rather than the agent), and a reader following a log
// that is rotated twice between two of its looks misses the middle file.
//
// An attempt an older agent started (its Info names no shim) writes its
// files itself, O_APPEND: the monitor rotates them by copy-truncate when
// it polls, as that agent did (see rotate), so they may grow past the
// bound by what is written in one poll interval.
//
// # Task dirs
//
// When an attempt's process has ended (or the attempt ended before it
// started), the driver writes EndedFile with the time into its task dir
// (its logs' dir; the attempt's own dir under the work root goes with it).
// A second goroutine, the collector, runs GC at the start and every
// Options.GCInterval: it removes a task dir whose attempt ended more than
// Options.Retention ago, and only then: an attempt whose work the hub no
// longer holds (it finished, or was stopped because the hub dropped it)
// keeps its logs for the same period, so that `drover logs` still finds
// them. A dir without the mark is never removed: its process may run,
// perhaps started by an earlier agent process and not adopted yet. Neither
// is the dir of an attempt being prepared or running.
// A dir is renamed to .gc-<id> under the driver's lock before it is
// removed, so an attempt cannot start in it meanwhile; a removal cut short
// is finished by the next pass. A working dir named by the spec is not the
// driver's and stays.
//
// # Restarts
//
// A process outlives the agent (it is in its own group, and the driver's
// Close leaves it running). Info is what the caller persists to find it
// again: pid, start time in clock ticks (/proc/<pid>/stat field 22, so a
// reused pid is not mistaken for it), deadline and log dir. Adopt watches it
// again. If the agent re-executed itself (an upgrade keeps the pid), the
// process is still its child and its exit code is known. Otherwise no one
// can learn the exit code of a process that is not one's child: the attempt
// ends Failed with reason wire.ReasonLost and a message saying the exit code
// is unknown. A timeout still applies to an adopted process.
//
// Process groups do not leave a cgroup: under systemd, the agent's unit
// needs KillMode=process (or mixed), or stopping the agent kills its tasks
// and the next start reports them lost. (The attempts' own cgroups are
// children of the agent's by default, so the same holds for them.)
//
// # Containers
//
// An attempt whose spec names driver containerd (Options.Containerd) runs
// the same way, but its process is the drover-containerd companion
// (package ctrd), as the agent's user and outside any cgroup of the
// agent's: it creates and starts the container (as the attempt's user,
// with the spec's limits on containerd's cgroup), copies its output to the
// log shim, and writes ResultFile in the task dir. The monitor never
// signals the companion: SIGTERM and SIGKILL go to the container through
// `drover-containerd kill`, and the result is read from ResultFile with
// the exec rules (timeout 143/137, OOMKilled 137). A companion that ends
// without a result has its container removed (ReasonLost); Adopt of an
// attempt whose companion is gone with no result starts a new companion
// (`wait`) that re-attaches to the container. No containerd (no socket, no
// companion) fails Prepare with taskwire.ReasonDriverUnavailable.
//
// # What not
//
// No resource limits without cgroups, no user switching without root (nor
// users allocated per attempt: tasks of one uid share it), no stdin. Linux
// only.
package taskexec
