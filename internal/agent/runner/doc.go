// Package runner is the agent's action-flow runner: it walks a flow
// (nodejobwire.Flow: each action names the next on success and on failure)
// over a set of actions, records each action's start and end in the agent
// DB, reports each end once, and after a restart resumes the flow from its
// records instead of starting again.
//
// # Why
//
// Node jobs (agent upgrade, image pre-pull) and the features after them
// (in-place update's built-in updaters, applications) all run KubeEdge-style
// action flows whose steps change the machine. An agent may die or re-exec
// itself in the middle of one, so every step must be recorded before and
// after it runs. This package does that once, for every flow.
//
// # The rules
//
// An action's record (store.Action) goes through these states:
//
//	           Start: record Running,            action ends:
//	(no row) ──── then Run ─────────▶ Running ──── record the end ─▶ Succeeded / Failed
//	                                    │  ▲                             │
//	  restart, stop, or a wait found it │  │ Resume (or Run again)       │ report, then
//	                                    └──┘                             ▼ mark Reported
//
// So:
//   - An action that ended is never run again; its end is only reported
//     again if the report did not reach the reporter (a crash between the two).
//   - An action found Running was cut short: the runner calls its Resume
//     (Resumer) or, without one, runs it again (it is safe to repeat). The
//     action decides whether it can go on or fails, which sends the flow to
//     its failure branch (an upgrade cut short before its swap rolls back).
//   - An action that returns an error, or whose ctx ended, records no end:
//     it stays Running for the next run. *Unfinished is the error of an
//     action that goes on outside this process (the agent re-execs itself):
//     Run then returns End{Result: Running}.
//
// Decide is the pure core: given a flow and the records, what is next
// (StartAction, ResumeAction, ReportEnd or Done). Runner.Run is the shell that executes its
// decisions until Done, an error or Unfinished.
//
// # What not
//
// The runner knows no action: what an action does, what its Data holds and
// how a report reads on the wire belong to the feature's package
// (internal/agent/upgrade, internal/agent/prepull). It starts no goroutine.
// It imports nothing from k8s.io (drover-agent links it).
package runner
