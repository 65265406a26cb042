// Package v1alpha1 contains the batch.drover.io API: tasks that run programs
// on fleet nodes, after K8s4r's three-layer model (seed 001).
//
//	FleetJob (the seed's Job; named so `kubectl get jobs` keeps meaning batch/v1)
//	 └── TaskGroup   count tasks from one template, or one per matching node
//	                 (perNode); usable on its own
//	      └── Task   one program on one node at a time
//
// Status cascades upwards: a Task's state is counted into its TaskGroup's
// status, and the TaskGroups' counts into the FleetJob's.
//
// Task state:
//
//	Pending ──► Scheduled ──► Dispatching ──► Running ──► Completed
//	   ▲            │              │             │
//	   │            └──────────────┴─────────────┴──────► Failed
//	   └──── a new attempt (restart policy, node lost) ◄──┘
//
// The manager schedules (Pending → Scheduled, with status.nodeName) and
// decides restarts and reschedules; the hub serving the node sends the task
// (Scheduled → Dispatching) and writes what the agent reports (Running,
// Completed, Failed). Every attempt has its own work id on the agent, so an
// attempt is never run twice.
//
// Nothing in a Task ever passes through a shell: command is an argv vector,
// and a task that wants a shell names it as its command.
//
// +kubebuilder:object:generate=true
// +groupName=batch.drover.io
package v1alpha1
