package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ImagePrePullJobSpec says which images to pull onto which nodes.
// +kubebuilder:validation:XValidation:rule="has(self.nodeNames) != has(self.labelSelector)",message="set exactly one of nodeNames and labelSelector"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.abort) || !oldSelf.abort || (has(self.abort) && self.abort)",message="an aborted job cannot be resumed; create a new one"
type ImagePrePullJobSpec struct {
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

	// images are OCI image references, e.g. registry.example.com/app:v1 or
	// with a @sha256: digest.
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=512
	// +kubebuilder:validation:items:Pattern=`^([a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)*(:[0-9]+)?/)?[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*(:[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127})?(@sha256:[a-f0-9]{64})?$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="images are immutable; create a new job"
	Images []string `json:"images"`

	// imageSecretRef names a Secret of type kubernetes.io/dockerconfigjson
	// with the registry credentials. Hubs send each node only the
	// credentials of the registries its images are on. Both name and
	// namespace are required: the job is cluster-scoped.
	// +optional
	// +kubebuilder:validation:XValidation:rule="has(self.name) && size(self.name) > 0 && has(self.__namespace__) && size(self.__namespace__) > 0",message="imageSecretRef needs a name and a namespace"
	ImageSecretRef *corev1.SecretReference `json:"imageSecretRef,omitempty"`

	// retryTimes is how often a failed pull of one image is retried on a node.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10
	RetryTimes int32 `json:"retryTimes,omitempty"`

	// abort stops dispatching to new nodes; running pulls finish; the job
	// ends Failure. Set by `drover abort`; cannot be undone.
	// +optional
	Abort bool `json:"abort,omitempty"`

	JobExecution `json:",inline"`
}

// ImagePrePullJob pulls images onto many nodes ahead of need.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=ippj,categories=drover
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Total",type=integer,JSONPath=`.status.counts.total`
// +kubebuilder:printcolumn:name="Successful",type=integer,JSONPath=`.status.counts.successful`
// +kubebuilder:printcolumn:name="Failed",type=integer,JSONPath=`.status.counts.failure`
// +kubebuilder:printcolumn:name="Unknown",type=integer,JSONPath=`.status.counts.unknown`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ImagePrePullJob struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ImagePrePullJobSpec `json:"spec"`
	Status NodeJobStatus       `json:"status,omitempty"`
}

// ImagePrePullJobList is a list of ImagePrePullJobs.
//
// +kubebuilder:object:root=true
type ImagePrePullJobList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ImagePrePullJob `json:"items"`
}
