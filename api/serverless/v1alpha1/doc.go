// Package v1alpha1 contains the serverless.drover.io API: applications whose
// instances run on fleet nodes and serve sessions, after Fornax (seed 002).
//
//	Application          how an instance runs, and how many to keep
//	 ├── InstanceSlice   the instances of one Application on one node: the
//	 │                   manager writes which to hold (spec), the node's hub
//	 │                   what the agent reports (status, coalesced)
//	 └── ApplicationSession
//	                     one customer's session, bound to one instance
//
// Instances are not objects of their own: an instance changes state on
// every session it serves, and a write per change would not scale to the
// seed's fleets. A slice holds all of an Application's instances on one
// node, so the status of many instances is one write.
//
// Session lifecycle (the seed's):
//
//	Pending ─bind→ Starting ─instance ready→ ReadinessChecking ─SessionReady→ Ready
//	Ready ─client joins→ Live ─delete→ Evacuating ─clients gone→ Terminating → Terminated
//
// Pending: the manager has not bound it yet (spec.instanceName empty).
// Terminated is final; status.reason says why (Closed, OpenTimeout,
// InstanceCrashed, NodeLost, NoCapacity, ApplicationNotFound, …).
//
// +kubebuilder:object:generate=true
// +groupName=serverless.drover.io
package v1alpha1
