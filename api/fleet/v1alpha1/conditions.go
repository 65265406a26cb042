package v1alpha1

// FleetNode's Ready condition and its reasons.
const (
	// ReadyCondition is True while a hub holds the node's stream and hears its heartbeats.
	ReadyCondition = "Ready"

	// ReasonConnected: the agent opened a stream to a hub.
	ReasonConnected = "Connected"
	// ReasonMovedHub: the agent reconnected to another hub before the offline timeout.
	ReasonMovedHub = "MovedHub"
	// ReasonDisconnected (Ready Unknown, the node still Online): the
	// agent's stream to its hub ended; the node goes Offline after the
	// offline timeout unless it reconnects. No new work is placed on it
	// meanwhile.
	ReasonDisconnected = "Disconnected"
	// ReasonNotResponding (Ready Unknown, the node still Online): its
	// stream looks open but nothing came from it for a few heartbeat
	// intervals; as Disconnected, no new work is placed on it, and it goes
	// Offline after the offline timeout unless it is heard from.
	ReasonNotResponding = "NotResponding"
	// ReasonHeartbeatTimeout: no heartbeat within the offline timeout.
	ReasonHeartbeatTimeout = "HeartbeatTimeout"
	// ReasonHubLost (Ready Unknown, the node still Online): the node's hub
	// stopped renewing its Lease and the agent has not reconnected; a live
	// hub took the node over and makes it Offline after the offline timeout
	// unless it connects somewhere.
	ReasonHubLost = "HubLost"
	// ReasonRevoked: the node's identity was revoked (Approved False, set by
	// the manager; Ready False once its hub closed its stream).
	ReasonRevoked = "Revoked"
	// ReasonNotConnected: registered; the agent has not opened a stream yet.
	ReasonNotConnected = "NotConnected"
)

// FleetNode's Approved condition and its reasons.
const (
	// ApprovedCondition is True once the node may have a certificate and work.
	ApprovedCondition = "Approved"

	// ReasonAwaitingApproval: registered; waiting for `drover approve` or an auto-approve token.
	ReasonAwaitingApproval = "AwaitingApproval"
	// ReasonAutoApproved: approved by the bootstrap token's auto-approve policy.
	ReasonAutoApproved = "AutoApproved"
	// ReasonApproved: approved by an operator.
	ReasonApproved = "ApprovedByOperator"
)

// FleetNode's LabelsApproved and CapacityApproved conditions (the
// manager's) and their reasons: what the agent reports against what was
// approved (spec.approvedLabels, spec.approvedCapacity).
const (
	// LabelsApprovedCondition is True while the labels the agent reports are
	// the approved ones; False, reason LabelChangePending, while a change
	// waits for `drover approve NODE` (the node keeps its approved labels).
	LabelsApprovedCondition = "LabelsApproved"
	// CapacityApprovedCondition is True while no resource the agent reports
	// exceeds the approved capacity; False, reason CapacityOverApproved,
	// while one does (the scheduler counts on the approved amount only).
	CapacityApprovedCondition = "CapacityApproved"

	// ReasonAsApproved: what the agent reports is what was approved.
	ReasonAsApproved = "AsApproved"
	// ReasonLabelChangePending: the agent reports labels other than the
	// approved ones; the change waits for `drover approve NODE`.
	ReasonLabelChangePending = "LabelChangePending"
	// ReasonCapacityOverApproved: the agent claims more of a resource than
	// was approved; the scheduler counts on the approved amount.
	ReasonCapacityOverApproved = "CapacityOverApproved"
)

// Labels and annotations Drover sets.
const (
	// LabelHostname mirrors the reported hostname.
	LabelHostname = "fleet.drover.io/hostname"
	// LabelOS and LabelArch mirror GOOS and GOARCH.
	LabelOS   = "fleet.drover.io/os"
	LabelArch = "fleet.drover.io/arch"
	// AnnotationBootstrapToken records the id of the token a node registered with.
	AnnotationBootstrapToken = "fleet.drover.io/bootstrap-token-id"
	// AnnotationAutoApprovedBy names the bootstrap token whose auto-approve
	// policy set spec.approved when the hub created the node; the manager
	// reads it to record the Approved condition as AutoApproved rather than
	// an operator's approval.
	AnnotationAutoApprovedBy = "fleet.drover.io/auto-approved-by"
	// AnnotationRegistrationKey records the SHA-256 of the public key the
	// node first registered with: a registration under the same name with
	// another key (another machine) is refused until the FleetNode is
	// deleted.
	AnnotationRegistrationKey = "fleet.drover.io/registration-key-sha256"
	// AnnotationAgentLabels lists, sorted and comma-separated, the keys of
	// metadata.labels the manager last set from spec.approvedLabels (as
	// kubectl's last-applied does): a key no longer approved is removed only
	// if it is listed here, so labels added with kubectl stay.
	AnnotationAgentLabels = "fleet.drover.io/agent-labels"
)
