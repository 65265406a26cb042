// Package fleetnode holds every change of a FleetNode's status, as pure
// setters: each takes the node and its inputs (the time, the hub's name,
// what the agent reported), changes the node in memory, and returns a
// Change saying whether anything changed and which Event, if any, announces
// it. Callers read the node, call one setter and patch the status with an
// optimistic lock; a conflict means reading again and calling the setter
// again, which then sees what the other writer did.
//
// Each part of the status has one owner:
//
//	                 owner     setters
//	Approved         manager   SetApproved, SetAwaitingApproval, SetRevoked
//	phase Pending    manager   SetPending
//	phase Revoked    manager   SetRevoked, SetUnrevoked
//	LabelsApproved   manager   SetLabelsApproval
//	CapacityApproved,manager   SetCapacity
//	capacity
//	metadata.labels  manager   ApplyApprovedLabels (from spec.approvedLabels)
//	spec.approved*   operators ApproveReported (`drover approve`); the manager
//	                           only AdoptReported, once, for a node approved by hand
//	Ready, hub,      hubs      SetRegistered, SetConnected, SetDisconnected,
//	phase Online,              SetUnconnected, SetNotResponding, SetResponding,
//	phase Offline,             SetHeartbeat, SetHeartbeatTimeout, SetHubLost,
//	reported facts,            SetReported, SetCertificate
//	reportedLabels,
//	reportedCapacity
//
// The Ready condition and the phase go together on the hubs' side:
//
//	Connected/MovedHub (True, Online) ──stream ends──► Disconnected (Unknown, Online)
//	        │  ▲                                              │
//	  silent│  │heard from                   offline timeout  │
//	        ▼  │                                              ▼
//	NotResponding (Unknown, Online) ──offline timeout──► HeartbeatTimeout (False, Offline)
//	                                                          ▲
//	its hub's Lease expired ──► HubLost (Unknown, Online) ────┘ (another hub claimed it)
//
// A hub never changes the phase of a node whose spec says revoked: the
// manager made it Revoked. It only sets Ready False, reason Revoked, when it
// closes such a node's stream.
//
// Conditions are compared in tests without LastTransitionTime, as
// cluster-api's condition tests do: the setters keep it when a condition's
// status does not change (meta.SetStatusCondition).
//
// The package does no I/O, reads no clock and imports no client.
package fleetnode
