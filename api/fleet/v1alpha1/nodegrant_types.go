package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NodeGrant gives namespaces the right to run code on some nodes: the
// fleet's tenancy policy, as Nomad's namespaces and node pools or
// Kubernetes' namespace node selectors. It fails closed: a namespace no
// NodeGrant names runs nothing on any node. A namespace named by several
// grants reaches the union of what they grant; each piece of work must be
// allowed by one grant as a whole (its node, its user and group, its
// working dir).
//
// Enforced at admission for every kind that runs code on nodes (Tasks,
// TaskGroups, FleetJobs), and again by the scheduler, which places work
// only on nodes a grant of its namespace selects.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=ng,categories=drover
// +kubebuilder:printcolumn:name="Namespaces",type=string,JSONPath=`.spec.namespaces`
// +kubebuilder:printcolumn:name="Nodes",type=string,JSONPath=`.spec.nodeSelector`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NodeGrant struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec NodeGrantSpec `json:"spec"`
}

// NodeGrantSpec says which namespaces reach which nodes, and as whom.
// +kubebuilder:validation:XValidation:rule="size(self.namespaces) > 0 || has(self.namespaceSelector)",message="name the namespaces the grant applies to: namespaces or namespaceSelector"
type NodeGrantSpec struct {
	// namespaces the grant applies to, by name.
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +listType=set
	// +optional
	Namespaces []string `json:"namespaces,omitempty"`

	// namespaceSelector applies the grant to namespaces by label too.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`

	// nodeSelector chooses the granted nodes by their labels; {} grants
	// every node.
	NodeSelector metav1.LabelSelector `json:"nodeSelector"`

	// runAs is the users and groups work may run as on those nodes. Unset:
	// only the node's own unprivileged task user.
	// +optional
	RunAs *RunAsPolicy `json:"runAs,omitempty"`

	// hostDirs are absolute directories on the node (and everything under
	// them) that a task may name as its workingDir. Unset: a task works only
	// inside its attempt's own directory.
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=4096
	// +kubebuilder:validation:items:Pattern=`^/[^\x00\n]*$`
	// +kubebuilder:validation:items:XValidation:rule="!(self.endsWith('/..') || self.contains('/../'))",message="hostDirs are clean absolute paths: no '..' segments"
	// +listType=set
	// +optional
	HostDirs []string `json:"hostDirs,omitempty"`
}

// RunAsPolicy is the uid and gid ranges work may ask for. A range that
// holds 0 allows root.
type RunAsPolicy struct {
	// users: the uids a task may set as securityContext.runAsUser.
	// +kubebuilder:validation:MaxItems=16
	// +optional
	Users []IDRange `json:"users,omitempty"`
	// groups: the gids a task may run as (securityContext.runAsGroup, or
	// its runAsUser when that is unset). Unset: the same ranges as users.
	// +kubebuilder:validation:MaxItems=16
	// +optional
	Groups []IDRange `json:"groups,omitempty"`
}

// IDRange is the ids from min to max, both included.
// +kubebuilder:validation:XValidation:rule="self.min <= self.max",message="min must not be above max"
type IDRange struct {
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4294967294
	Min int64 `json:"min"`
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4294967294
	Max int64 `json:"max"`
}

// NodeGrantList is a list of NodeGrants.
// +kubebuilder:object:root=true
type NodeGrantList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeGrant `json:"items"`
}
