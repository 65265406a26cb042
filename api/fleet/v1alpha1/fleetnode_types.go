package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FleetNodePhase is where a machine is in its life with Drover.
//
//	(register) ──► Pending ──approve──► Online ◄──► Offline
//	                  │                    │
//	                  └──────revoke────────┴──► Revoked
type FleetNodePhase string

const (
	// FleetNodePending: registered with a bootstrap token, not approved yet.
	FleetNodePending FleetNodePhase = "Pending"
	// FleetNodeOnline: approved and connected to a hub that hears its heartbeats.
	FleetNodeOnline FleetNodePhase = "Online"
	// FleetNodeOffline: approved, but no hub heard from it within the offline timeout.
	FleetNodeOffline FleetNodePhase = "Offline"
	// FleetNodeRevoked: its identity was revoked; hubs refuse it.
	FleetNodeRevoked FleetNodePhase = "Revoked"
)

// FleetNodeSpec is what operators decide about a machine.
type FleetNodeSpec struct {
	// approved lets the node obtain a client certificate and receive work.
	// Set by `drover approve NODE` or by an auto-approve bootstrap token.
	// (Defaulted, so that kubectl get shows false rather than nothing.)
	// +kubebuilder:default=false
	// +optional
	Approved bool `json:"approved,omitempty"`

	// revoked refuses the node's connections and work, whatever its certificate.
	// +optional
	Revoked bool `json:"revoked,omitempty"`

	// unschedulable keeps new work off the node.
	// +optional
	Unschedulable bool `json:"unschedulable,omitempty"`

	// approvedLabels are the labels the node may carry from what its agent
	// reports (status.reportedLabels): the manager keeps metadata.labels in
	// step with them, never with the report itself, so a node cannot label
	// itself into a pool. Recorded at approval (`drover approve NODE`, an
	// auto-approve bootstrap token, or the manager when spec.approved is
	// set by hand); a later change of the report waits until approved again
	// (condition LabelsApproved).
	// +optional
	// +kubebuilder:validation:MaxProperties=67
	ApprovedLabels map[string]string `json:"approvedLabels,omitempty"`

	// approvedCapacity is the most the scheduler counts on for each
	// resource, whatever the agent claims (status.reportedCapacity): a
	// resource the node reports beyond it, or that it does not name, is
	// capped in status.capacity (condition CapacityApproved). Recorded with
	// approvedLabels.
	// +optional
	ApprovedCapacity corev1.ResourceList `json:"approvedCapacity,omitempty"`

	// updatePhase is set by the pool running an in-place update on the
	// node (update.drover.io): updating, or aborting to stop it.
	// +optional
	// +kubebuilder:validation:Enum=updating;aborting
	UpdatePhase string `json:"updatePhase,omitempty"`
}

// FleetNodeStatus is what the node and its hub report.
type FleetNodeStatus struct {
	// phase is Pending, Online, Offline or Revoked.
	// +optional
	// +kubebuilder:validation:Enum=Pending;Online;Offline;Revoked
	Phase FleetNodePhase `json:"phase,omitempty"`

	// conditions: Ready (connected and heartbeating) and Approved.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// hub is the name of the hub that holds the node's stream.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Hub string `json:"hub,omitempty"`

	// lastHeartbeatTime is coarse: hubs keep heartbeats in memory and refresh
	// this only every few minutes and on transitions.
	// +optional
	LastHeartbeatTime *metav1.Time `json:"lastHeartbeatTime,omitempty"`

	// connectedTime is when the current hub connection was opened.
	// +optional
	ConnectedTime *metav1.Time `json:"connectedTime,omitempty"`

	// agentVersion is the version the agent reports.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	AgentVersion string `json:"agentVersion,omitempty"`

	// os and arch as the agent reports them (GOOS, GOARCH).
	// +optional
	// +kubebuilder:validation:MaxLength=64
	OS string `json:"os,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Arch string `json:"arch,omitempty"`

	// hostname as the agent reports it.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Hostname string `json:"hostname,omitempty"`

	// capacity is what the scheduler counts on: for each resource the agent
	// reports, the least of its claim and spec.approvedCapacity (set by the
	// manager).
	// +optional
	Capacity corev1.ResourceList `json:"capacity,omitempty"`

	// reportedCapacity is the capacity the agent last reported (cpu,
	// memory, ...): a claim, capped by spec.approvedCapacity into capacity.
	// +optional
	ReportedCapacity corev1.ResourceList `json:"reportedCapacity,omitempty"`

	// reportedLabels are the labels the agent last reported (at registration
	// and on every connect), with fleet.drover.io/os, /arch and /hostname
	// taken from what it reports of its machine. They reach metadata.labels
	// only as approved in spec.approvedLabels.
	// +optional
	// +kubebuilder:validation:MaxProperties=67
	ReportedLabels map[string]string `json:"reportedLabels,omitempty"`

	// certificateExpiry is when the node's client certificate expires.
	// +optional
	CertificateExpiry *metav1.Time `json:"certificateExpiry,omitempty"`

	// certificates are the client certificates hubs signed for the node
	// that may still be valid, the newest last: at most 4, those expired
	// before the newest was signed dropped. A revocation copies them to
	// the revocation list, from which `drover mqtt crl` writes the CRL an
	// external broker checks.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=4
	Certificates []NodeCertificate `json:"certificates,omitempty"`

	// agentRevision is the last agent state revision the hub accepted.
	// +optional
	AgentRevision int64 `json:"agentRevision,omitempty"`

	// observedGeneration is the spec generation the hub last acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// updateStatus is the node's in-place update, aggregated from its
	// updater tasks: updating, updated, aborting, aborted or failed.
	// +optional
	// +kubebuilder:validation:Enum=updating;updated;aborting;aborted;failed
	UpdateStatus string `json:"updateStatus,omitempty"`

	// updateStartTime is when the node's current in-place update started:
	// health checks time it out (NodeHealthCheck inPlaceUpdateTimeout).
	// +optional
	UpdateStartTime *metav1.Time `json:"updateStartTime,omitempty"`

	// updateAttempt is the pick updateStatus is about (<plan>/<attempt>):
	// until the node's update controller answers a new pick, the status
	// left by an earlier one is not taken for this one's.
	// +optional
	// +kubebuilder:validation:MaxLength=300
	UpdateAttempt string `json:"updateAttempt,omitempty"`
}

// NodeCertificate is a client certificate a hub signed for a node.
type NodeCertificate struct {
	// serial is the certificate's serial number, lowercase hex.
	// +kubebuilder:validation:MaxLength=64
	Serial string `json:"serial"`
	// issuer is the common name of the CA that signed it: a CRL is per CA.
	// +kubebuilder:validation:MaxLength=64
	Issuer string `json:"issuer"`
	// notAfter is when it expires.
	NotAfter metav1.Time `json:"notAfter"`
}

// FleetNode is one machine registered with Drover: an edge node, robot,
// bare-metal host or serverless worker running drover-agent.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=fn,categories=drover
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,description="why the node is or is not ready: Connected, Disconnected, HeartbeatTimeout, …"
// +kubebuilder:printcolumn:name="Approved",type=boolean,JSONPath=`.spec.approved`
// +kubebuilder:printcolumn:name="Hub",type=string,JSONPath=`.status.hub`
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.status.agentVersion`
// +kubebuilder:printcolumn:name="OS",type=string,JSONPath=`.status.os`,priority=1
// +kubebuilder:printcolumn:name="Arch",type=string,JSONPath=`.status.arch`
// +kubebuilder:printcolumn:name="Update",type=string,JSONPath=`.status.updateStatus`,priority=1
// +kubebuilder:printcolumn:name="Last-Heartbeat",type=date,JSONPath=`.status.lastHeartbeatTime`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type FleetNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec FleetNodeSpec `json:"spec,omitempty"`
	// +optional
	Status FleetNodeStatus `json:"status,omitempty"`
}

// FleetNodeList is a list of FleetNodes.
//
// +kubebuilder:object:root=true
type FleetNodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []FleetNode `json:"items"`
}
