// Package appctl is the manager's part of serverless applications
// (serverless.drover.io, issue 16): the Application controller.
//
// It decides which instances of each Application exist and writes them to
// one InstanceSlice per (Application, node) — the slice's spec; the node's
// hub writes its status from the agent's reports — and it binds
// ApplicationSessions to instances. The decision (decide) is pure: the
// Application's scaling, the instances as the slices show them, the
// sessions waiting and the time go in; removals, new instances and
// bindings come out. The controller reads caches, places new instances
// with internal/scheduler on granted (internal/tenancy), Online nodes with
// room, exactly as the task scheduler does, and writes.
//
// It is one reconcile per Application and one at a time (Controller.mu),
// shared with Controller.Open, the in-process binding of a session API:
// an instance's room is counted once, with the bindings and slices this
// manager wrote that its cache does not show yet. It is plain
// controller-runtime, not ctrlkit: like the task scheduler it is a
// scheduling loop, and it acts on sessions whose Application does not
// exist.
//
// docs/serverless.md describes the behaviour; the hub's part is
// internal/serverless/apphub, the agent's internal/agent/apps.
package appctl
