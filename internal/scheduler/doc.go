// Package scheduler decides where batch Tasks run. It is pure: it reads
// snapshots of FleetNodes and Tasks handed to it and returns decisions; the
// manager's scheduling loop (internal/task/taskctl) reads the API and
// writes the decisions.
//
// A Cluster holds, per node, what the tasks holding it (Scheduled,
// Dispatching, Running) use, and per TaskGroup how many of its tasks each
// node holds. Place filters the nodes for one task:
//
//   - spec.nodeName, if set, leaves only that node;
//   - a NodeGrant of the task's namespace must select the node and allow
//     the task's user, group and working dir as a whole (Task.Access,
//     internal/tenancy; the caller compiles the grants, and a task without
//     an Access fits nowhere). The policy is checked before the node's
//     state, so a namespace's messages count the nodes it is not granted
//     without saying what they are doing;
//   - the node must be Online and not unschedulable;
//   - its labels must match the task's nodeSelector;
//   - its capacity minus what its tasks hold must cover the task's resources;
//   - the task's spread constraint: no topology domain may hold more than
//     maxSkew more of the group's tasks than the emptiest eligible domain;
//
// then picks the least loaded of the nodes left and counts the task
// against it, so the next Place sees it. A task that fits nowhere gets a
// message in kube-scheduler's words ("0/5 nodes are available: 2 Offline,
// 1 insufficient cpu."). When the policy alone rules the task out (its
// nodeName is not granted, or its namespace may run that work nowhere),
// Result.Denied says so in the policy's words.
//
// Sort orders pending tasks: higher priority first, then older first.
package scheduler
