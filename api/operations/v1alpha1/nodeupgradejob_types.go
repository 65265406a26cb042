package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Actions of an upgrade, in flow order (see internal/nodejob/nodejobwire).
const (
	ActionCheck = "Check"
	// ActionConfirm waits for `drover confirm` (requireConfirmation): its
	// record starts when the node begins to wait and ends when it is
	// confirmed, naming who confirmed.
	ActionConfirm = "Confirm"
	// ActionWaitingConfirmation is what agents before Confirm reported
	// while they waited; still understood.
	ActionWaitingConfirmation = "WaitingConfirmation"
	ActionBackUp              = "BackUp"
	ActionUpgrade             = "Upgrade"
	ActionRollBack            = "RollBack"
	ActionPull                = "Pull"
)

// AgentArtifact is where the new drover-agent binary comes from. The agent
// refuses a download whose SHA-256 differs from sha256.
// +kubebuilder:validation:XValidation:rule="has(self.url) != has(self.image)",message="set exactly one of url and image"
// +kubebuilder:validation:XValidation:rule="!has(self.imageSecretRef) || has(self.image)",message="imageSecretRef is for an image artifact; a url carries no credentials"
type AgentArtifact struct {
	// url of the binary, http or https.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^https?://[A-Za-z0-9._~:/?#\[\]@!&()*+,=%-]+$`
	URL string `json:"url,omitempty"`

	// image is an OCI reference whose single layer is the binary.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:Pattern=`^([a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)*(:[0-9]+)?/)?[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*(:[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127})?(@sha256:[a-f0-9]{64})?$`
	Image string `json:"image,omitempty"`

	// imageSecretRef names a Secret of type kubernetes.io/dockerconfigjson
	// with the credentials of image's registry (absent: anonymous pull).
	// Hubs read it (see config/rbac's drover-hub-image-pull-secrets) and
	// send the nodes only that registry's entry. Both name and namespace
	// are required: the job is cluster-scoped.
	// +optional
	// +kubebuilder:validation:XValidation:rule="has(self.name) && size(self.name) > 0 && has(self.__namespace__) && size(self.__namespace__) > 0",message="imageSecretRef needs a name and a namespace"
	ImageSecretRef *corev1.SecretReference `json:"imageSecretRef,omitempty"`

	// sha256 is the hex SHA-256 digest of the binary.
	// +kubebuilder:validation:Pattern=`^[a-f0-9]{64}$`
	SHA256 string `json:"sha256"`
}

// Confirmation lets waiting nodes go on; written by `drover confirm`.
type Confirmation struct {
	// all confirms every node.
	// +optional
	All bool `json:"all,omitempty"`
	// nodeNames confirms these nodes.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=1000
	// +kubebuilder:validation:items:MaxLength=253
	NodeNames []string `json:"nodeNames,omitempty"`
	// by is who confirmed last, as `drover confirm` found the caller's
	// user name; nodes record it in their Confirm action. It is what the
	// writer says: the apiserver's audit log is the proof.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	By string `json:"by,omitempty"`
}

// NodeUpgradeJobSpec says which nodes run which drover-agent version.
// +kubebuilder:validation:XValidation:rule="has(self.nodeNames) != has(self.labelSelector)",message="set exactly one of nodeNames and labelSelector"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.abort) || !oldSelf.abort || (has(self.abort) && self.abort)",message="an aborted job cannot be resumed; create a new one"
type NodeUpgradeJobSpec struct {
	// nodeNames are FleetNode names. For larger fleets use labelSelector.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=1000
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="nodeNames is immutable; create a new job"
	NodeNames []string `json:"nodeNames,omitempty"`

	// labelSelector matches FleetNode labels.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="labelSelector is immutable; create a new job"
	LabelSelector *metav1.LabelSelector `json:"labelSelector,omitempty"`

	// version is the drover-agent version to run, e.g. v1.2.3.
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^v?[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="version is immutable; create a new job"
	Version string `json:"version"`

	// artifact is the new binary and its digest.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="artifact is immutable; create a new job"
	Artifact AgentArtifact `json:"artifact"`

	// requireConfirmation makes each node wait after its checks until
	// `drover confirm JOB [NODE...]`.
	// +optional
	RequireConfirmation bool `json:"requireConfirmation,omitempty"`

	// confirmed lists the nodes allowed past WaitingConfirmation.
	// +optional
	Confirmed *Confirmation `json:"confirmed,omitempty"`

	// abort stops dispatching to new nodes; running nodes finish or roll
	// back; the job ends Failure. Set by `drover abort`; cannot be undone.
	// +optional
	Abort bool `json:"abort,omitempty"`

	JobExecution `json:",inline"`
}

// NodeUpgradeJob upgrades drover-agent on many nodes.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=nuj,categories=drover
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.spec.version`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Total",type=integer,JSONPath=`.status.counts.total`
// +kubebuilder:printcolumn:name="Successful",type=integer,JSONPath=`.status.counts.successful`
// +kubebuilder:printcolumn:name="Failed",type=integer,JSONPath=`.status.counts.failure`
// +kubebuilder:printcolumn:name="Unknown",type=integer,JSONPath=`.status.counts.unknown`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NodeUpgradeJob struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   NodeUpgradeJobSpec `json:"spec"`
	Status NodeJobStatus      `json:"status,omitempty"`
}

// NodeUpgradeJobList is a list of NodeUpgradeJobs.
//
// +kubebuilder:object:root=true
type NodeUpgradeJobList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeUpgradeJob `json:"items"`
}
