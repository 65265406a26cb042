package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AnswerStatus is an updater's answer to an ExternalUpdateRequest.
//
// +kubebuilder:validation:Enum=accept;reject;error
type AnswerStatus string

const (
	// AnswerAccept: the updater takes the paths it lists.
	AnswerAccept AnswerStatus = "accept"
	// AnswerReject: the updater takes nothing of this change.
	AnswerReject AnswerStatus = "reject"
	// AnswerError: the updater could not decide; the request fails.
	AnswerError AnswerStatus = "error"
)

// UpdaterRegistrationSpec says how Drover asks an updater about a pool's
// template change (the seed's "Lifecycle Runtime hook"). Exactly one of
// claims, http or answerInStatus.
//
// +kubebuilder:validation:XValidation:rule="[has(self.claims), has(self.http), has(self.answerInStatus) && self.answerInStatus].filter(b, b).size() == 1",message="set exactly one of claims, http and answerInStatus"
type UpdaterRegistrationSpec struct {
	// sequence orders this updater's tasks on a node (lowest first); two
	// registrations with one sequence cannot both update one change.
	// +kubebuilder:validation:Minimum=1
	Sequence int32 `json:"sequence"`
	// updaterUpdateTemplateRef is the template the updater's tasks are
	// made from, unless its answer names another.
	// +optional
	UpdaterUpdateTemplateRef *ObjectRef `json:"updaterUpdateTemplateRef,omitempty"`
	// claims answers for the updater without asking it: it accepts every
	// changed path that starts with one of these prefixes (e.g.
	// /spec/agentVersion for the built-in agent-version updater,
	// /files/etc/ for a configuration updater).
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=1024
	// +kubebuilder:validation:items:Pattern=`^/`
	Claims []string `json:"claims,omitempty"`
	// http: Drover POSTs the request to this hook and reads the answer.
	// +optional
	HTTP *HTTPHook `json:"http,omitempty"`
	// answerInStatus: the updater watches ExternalUpdateRequests and
	// writes its answer into status.answers itself.
	// +optional
	AnswerInStatus bool `json:"answerInStatus,omitempty"`
}

// HTTPHook is where an updater answers update requests.
type HTTPHook struct {
	// url of the hook: https, or http to a loopback address (tests, a
	// sidecar).
	// +kubebuilder:validation:MinLength=8
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^https?://`
	URL string `json:"url"`
	// caBundle (PEM) verifies the hook's serving certificate; empty uses
	// the system roots.
	// +optional
	CABundle []byte `json:"caBundle,omitempty"`
	// timeoutSeconds bounds one call. Default 10.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=30
	TimeoutSeconds int32 `json:"timeoutSeconds,omitempty"`
}

// UpdaterRegistration registers an in-place updater for update requests
// (as Cluster API's ExtensionConfig registers runtime extensions).
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=updreg,categories=drover
// +kubebuilder:printcolumn:name="Sequence",type=integer,JSONPath=`.spec.sequence`
// +kubebuilder:printcolumn:name="Hook",type=string,JSONPath=`.spec.http.url`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type UpdaterRegistration struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec UpdaterRegistrationSpec `json:"spec"`
}

// UpdaterRegistrationList is a list of UpdaterRegistrations.
//
// +kubebuilder:object:root=true
type UpdaterRegistrationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []UpdaterRegistration `json:"items"`
}

// ExternalUpdateRequestSpec is a pool's template change, as updaters see
// it: what changes, on how many nodes.
type ExternalUpdateRequestSpec struct {
	// pool whose template changed.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Pool string `json:"pool"`
	// revision of the pool's template the request is for.
	// +kubebuilder:validation:MaxLength=64
	Revision string `json:"revision"`
	// changes: the union of what the template changes on the pool's
	// nodes. Nodes already at the target are not counted.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	Changes []Responsibility `json:"changes,omitempty"`
	// nodes is how many nodes need the change.
	// +optional
	Nodes int32 `json:"nodes"`
}

// UpdaterAnswer is one updater's answer.
type UpdaterAnswer struct {
	// updaterName is the UpdaterRegistration's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	UpdaterName string `json:"updaterName"`
	// status: accept, reject or error.
	Status AnswerStatus `json:"status"`
	// message says why.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
	// responsibilities are the changed paths the updater takes.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=1024
	Responsibilities []string `json:"responsibilities,omitempty"`
	// updateTaskTemplateRef overrides the registration's template.
	// +optional
	UpdateTaskTemplateRef *ObjectRef `json:"updateTaskTemplateRef,omitempty"`
}

// RequestPhase is where an update request is.
//
// +kubebuilder:validation:Enum=Pending;Planned;Updated;Failed;Superseded
type RequestPhase string

const (
	// RequestPending: waiting for answers.
	RequestPending RequestPhase = "Pending"
	// RequestPlanned: every change is claimed; status.plan runs it.
	RequestPlanned RequestPhase = "Planned"
	// RequestUpdated: the change set was empty on every node.
	RequestUpdated RequestPhase = "Updated"
	// RequestFailed: a change unclaimed, claimed twice, an updater's error
	// or no answer in time (the reason says which).
	RequestFailed RequestPhase = "Failed"
	// RequestSuperseded: the pool's template changed again first.
	RequestSuperseded RequestPhase = "Superseded"
)

// ExternalUpdateRequestStatus holds the answers and the outcome.
type ExternalUpdateRequestStatus struct {
	// phase: Pending, Planned, Updated, Failed or Superseded.
	// +optional
	Phase RequestPhase `json:"phase,omitempty"`
	// answers, one per updater.
	// +optional
	// +listType=map
	// +listMapKey=updaterName
	// +kubebuilder:validation:MaxItems=32
	Answers []UpdaterAnswer `json:"answers,omitempty"`
	// plan made from the answers.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Plan string `json:"plan,omitempty"`
	// conditions: Ready (True once planned or updated; False with the
	// reason).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ExternalUpdateRequest asks the registered updaters who takes which part
// of a pool's template change; Drover's topology controller makes one per
// change and, once every change is claimed, the InPlaceUpdatePlan.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=eur,categories=drover
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.pool`
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.spec.nodes`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Plan",type=string,JSONPath=`.status.plan`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ExternalUpdateRequest struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec ExternalUpdateRequestSpec `json:"spec"`
	// +optional
	Status ExternalUpdateRequestStatus `json:"status,omitempty"`
}

// ExternalUpdateRequestList is a list of ExternalUpdateRequests.
//
// +kubebuilder:object:root=true
type ExternalUpdateRequestList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ExternalUpdateRequest `json:"items"`
}
