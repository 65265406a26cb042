// Package cgroup contains drover-agent's task attempts: one cgroup per
// attempt, which the attempt's process starts inside, which bounds its
// memory and CPU, and which is killed whole when the attempt stops, so that
// nothing the attempt started (setsid, double forks) outlives it.
//
// # Hierarchies
//
// New reads /proc/self/mountinfo and /proc/self/cgroup and picks one of:
//
//   - v2: a cgroup2 mount whose root offers the memory and cpu controllers.
//     Limits are memory.max, cpu.max and pids.max; the process is started
//     in its cgroup by clone3(CLONE_INTO_CGROUP) (SysProcAttr.UseCgroupFD),
//     and cgroup.kill kills it all at once.
//   - v1: per-controller cgroup (v1) mounts of memory, cpu and freezer
//     (cpuacct and pids used when mounted). Limits are
//     memory.limit_in_bytes (and memory.memsw.limit_in_bytes, so swap does
//     not stand in for memory), cpu.cfs_quota_us/cpu.cfs_period_us and
//     pids.max. The kernel has no clone-into-cgroup for v1, so the process
//     is started through a shim: the agent binary re-executes itself
//     (/proc/self/exe, hidden argument ShimArg), writes its own pid into
//     every cgroup.procs of the attempt (as the agent: those files are
//     root's), drops to the task's uid and gid, and only then execs the
//     task's argv (passed as exec arguments, never through a shell). The task's first
//     instruction already runs inside the cgroups, so no child can fork
//     outside them. Killing freezes the freezer cgroup, SIGKILLs every pid
//     in it, thaws, and repeats until it is empty.
//   - hybrid: v1 controllers and a cgroup2 mount without controllers
//     (/sys/fs/cgroup/unified under systemd's hybrid layout). It works as
//     v1: the v2 side has no memory or cpu controller to limit with.
//
// The attempt's cgroups are created under a parent: by default a "drover"
// child of the agent's own cgroup in each hierarchy (the agent may itself
// sit in a non-root cgroup, a systemd unit or a container's), or the
// configured parent, a path from each hierarchy's root. On v2 the parent's
// ancestors must delegate the controllers (subtree_control); when the
// agent's own cgroup holds processes, the kernel refuses that ("no internal
// processes"), so the agent first moves itself into an "agent" leaf of it.
//
// An attempt's cgroup dirs are what a caller persists (Group.Dirs) to find
// them again after an agent restart (Open).
package cgroup
