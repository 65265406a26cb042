// Package ctrd is drover-containerd, the companion binary through which
// drover-agent runs a task attempt as a containerd container (Task
// spec.driver containerd). It holds the containerd Go client, so that the
// agent does not: the client would take the agent past its 20 MiB bound.
//
// The agent's exec driver (internal/agent/taskexec) starts one companion
// per attempt, as it would start a task's process: in its own process
// group, its stdout and stderr going to the attempt's log shim. The
// companion talks to containerd over its API (not CRI), and its commands
// are:
//
//	run   create the container and its task from a local image, start it,
//	      copy its stdout and stderr to its own, wait for it, write the
//	      result file, delete the task and the container, exit with the
//	      container's exit code
//	wait  the same for a container an earlier companion started (re-attach:
//	      the container lives in containerd, whatever became of that one)
//	kill  send SIGTERM or SIGKILL to a container's task
//	rm    kill a container's task and delete it and the container
//
// Stops never go through the companion's own signals: the agent runs
// `kill` (SIGTERM, then SIGKILL after the kill timeout), so that a
// companion that was itself killed leaves nothing the agent cannot stop.
//
// The result file (Result, JSON) says how the container ended: its exit
// code (128+n after signal n, as containerd reports it), whether the kernel
// OOM-killed in it, or why it never started (Reason: ImageNotFound, ...).
// Its absence after the companion ended means the companion died before
// the container ended.
//
// The container runs the image's entrypoint and cmd (args replace cmd, and
// the entrypoint too when given: an argv, never through a shell), as the
// uid and gid the agent chose (never 0 unless the agent allows root
// tasks), with no capabilities, no new privileges, in private pid, ipc,
// uts, mount and network namespaces (the network namespace has only
// loopback), its memory limit and CPU quota set on its cgroup.
//
// What not: pulls (images are imported or pre-pulled into the namespace);
// mounts of host dirs; stdin.
package ctrd
