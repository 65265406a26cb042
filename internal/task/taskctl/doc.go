// Package taskctl is the manager's side of batch.drover.io: FleetJob →
// TaskGroup → Task (K8s4r's three layers, seed 001).
//
//   - FleetJobReconciler makes a job's TaskGroups and sums their status;
//   - TaskGroupReconciler makes a group's Tasks and counts their states;
//   - Scheduler is one loop for all Pending tasks: it orders them (priority,
//     then age) and places them with internal/scheduler, Pending → Scheduled
//     with status.nodeName and status.attempt;
//   - TaskReconciler reacts to what hubs write: a Failed attempt restarts
//     under restartPolicy OnFailure after its backoff; an attempt whose node
//     goes Offline, or that its Online node did not start within the
//     dispatch timeout, is recorded in the history and, under
//     reschedulePolicy OnNodeLost, made again as a new attempt elsewhere.
//
// The manager never writes Dispatching, Running or Completed: the hub
// serving the node does, always for the attempt in status.attempt. A new
// attempt has a new work id, so the hub's work list for the old node no
// longer holds the old attempt and the agent cancels it if the node comes
// back: an attempt is never run twice.
//
// Events: Scheduled and FailedScheduling (once per distinct message) on
// Tasks; BackOff, NodeLost, DispatchTimeout and AttemptsExhausted when an
// attempt ends; Running, Completed and Failed on TaskGroups and FleetJobs
// when their phase changes. Metrics (controller-runtime's registry):
// drover_tasks_scheduled_total, drover_tasks_unschedulable_total,
// drover_task_restarts_total, drover_task_reschedules_total{reason},
// drover_tasks_failed_total{reason}, drover_scheduler_pending_tasks and
// drover_scheduler_loop_duration_seconds.
//
// A deleted job's groups and a deleted group's tasks are deleted by these
// controllers as well as by the garbage collector, so that they go even
// where none runs.
package taskctl
