// Package taskctl is the manager's side of batch.drover.io: FleetJob →
// TaskGroup → Task (K8s4r's three layers, seed 001).
//
//   - FleetJobReconciler makes a job's TaskGroups and sums their status;
//   - TaskGroupReconciler makes a group's Tasks and counts their states: count
//     of them, or for a perNode group one pinned to each FleetNode that its
//     template's nodeSelector matches and a NodeGrant of its namespace
//     allows (it watches FleetNodes for that; see pernode.go);
//   - Scheduler is one loop for all Pending tasks: it orders them (priority,
//     then age) and places them with internal/scheduler, Pending → Scheduled
//     with status.nodeName and status.attempt, only on nodes a NodeGrant of
//     the task's namespace selects and that allows the task's user, group
//     and workingDir (internal/tenancy; the admission webhook checks the
//     same, and the scheduler checks again, failing closed);
//   - TaskReconciler reacts to what hubs write: a Failed attempt restarts
//     under restartPolicy OnFailure after its backoff; an attempt whose node
//     goes Offline, or that its Online node did not start within the
//     dispatch timeout, is recorded in the history and, under
//     reschedulePolicy OnNodeLost, made again as a new attempt elsewhere.
//
// Tenancy: the scheduler watches NodeGrants and namespaces' labels (a
// grant may choose namespaces by label), so a task waiting for a grant is
// placed once one is made; it waits with reason NotGranted and the
// policy's words when the policy alone keeps it off every node (its
// nodeName is not granted, or no grant allows its user, group or dir).
// Like kube's requiredDuringSchedulingIgnoredDuringExecution, a grant
// removed or narrowed does not stop work already placed: the policy is
// checked when an attempt is placed, and a new attempt (a restart, a
// reschedule) is placed afresh under the grants then in force. A TaskGroup
// whose Tasks the API refuses (the tenancy webhook's Forbidden, a schema's
// Invalid), or a FleetJob whose TaskGroups it refuses, says so with a
// CreateFailed condition (shown by `kubectl describe`, the job shows its
// groups' too) and a FailedCreate Event, and asks again after a minute or
// as soon as a NodeGrant or the namespace's labels change, not in a hot
// error loop.
//
// The manager never writes Dispatching, Running or Completed: the hub
// serving the node does, always for the attempt in status.attempt. A new
// attempt has a new work id, so the hub's work list for the old node no
// longer holds the old attempt and the agent cancels it if the node comes
// back: an attempt is never run twice.
//
// A group's phase is Running once any of its tasks is placed on a node
// (Scheduled or later); a perNode group waits Pending while no node matches
// rather than ending with zero tasks. A task asking for more of its group on
// one node than its maxPerNode allows waits with reason InsufficientNodes;
// one whose resources are not valid (a name that is neither standard nor
// domain-prefixed, a negative quantity: stored before the admission policy)
// waits with reason InvalidResources.
//
// Events: Scheduled, FailedScheduling, InsufficientNodes, InvalidResources
// and NotGranted (once per distinct message) on Tasks; BackOff, NodeLost, DispatchTimeout and
// AttemptsExhausted when an attempt ends; Running, Completed and Failed on
// TaskGroups and FleetJobs when their phase changes, and FailedCreate when
// the API refuses what they create; GrantsNothing on a NodeGrant whose
// selectors do not parse. Metrics (controller-runtime's registry):
// drover_tasks_scheduled_total, drover_tasks_unschedulable_total,
// drover_task_restarts_total, drover_task_reschedules_total{reason},
// drover_tasks_failed_total{reason}, drover_scheduler_pending_tasks,
// drover_scheduler_not_granted_tasks and
// drover_scheduler_loop_duration_seconds.
//
// A multi-task group (spec.tasks) has instances of several tasks: the
// controller makes an instance's Tasks at once, gated (spec.schedulingGates)
// behind its inits, and steps them with the pure stepInstance (sequence.go);
// the scheduler places an instance as one unit holding its reservation
// (instances.go, scheduler.Reservation). Events: InitFailed and
// SidecarStopped on the group.
//
// A deleted job's groups and a deleted group's tasks are deleted by these
// controllers as well as by the garbage collector, so that they go even
// where none runs.
package taskctl

//go:generate go run github.com/drover-fleet/drover/cmd/ctrlkit gen -o zz_generated.task.ctrlkit.go task.ctrlkit
//go:generate go run github.com/drover-fleet/drover/cmd/ctrlkit gen -o zz_generated.taskgroup.ctrlkit.go taskgroup.ctrlkit
//go:generate go run github.com/drover-fleet/drover/cmd/ctrlkit gen -o zz_generated.fleetjob.ctrlkit.go fleetjob.ctrlkit
