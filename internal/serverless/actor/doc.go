// Package actor holds the agent's Pod (instance) and Session actors of
// seed 002 (Fornax): pure state machines, with no I/O, no goroutine and no
// clock of their own.
//
// An actor is stepped: Step(now, msg) takes one message (a command from the
// hub, an event from the instance runtime or the session service, or a Tick
// of the clock) and returns the Effects it decided on: commands to the
// instance runtime (start, freeze, thaw, stop), commands to the instance's
// session service (SessionStart, SessionClose), messages to other actors
// (a pod telling its sessions that it is evacuating or gone) and state
// reports for the hub. Deadline tells when the actor next wants a Tick; the
// caller (the node actor, next session) owns the timers, the runtime, the
// DB and the hub connection, and feeds their results back as messages.
// This is the etcd raft shape: the tests script messages and a fake clock
// (internal/clock/clocktest) and read the effects, with no sleeps.
//
// The states and transitions are the seed's diagrams; those the seed leaves
// out are named (Transition* constants) and listed in README.md.
package actor
