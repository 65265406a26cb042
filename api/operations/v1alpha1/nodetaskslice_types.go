package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Labels on every NodeTaskSlice, to list a job's slices.
const (
	LabelJobKind = "operations.drover.io/job-kind"
	LabelJobName = "operations.drover.io/job-name"
	LabelJobUID  = "operations.drover.io/job-uid"
)

// MaxNodesPerSlice bounds NodeTaskSlice.Nodes. The manager also sizes slices
// by the job's worst-case entry so that no slice exceeds 1 MiB.
const MaxNodesPerSlice = 1000

// JobReference names the job a slice belongs to.
type JobReference struct {
	// +kubebuilder:validation:Enum=NodeUpgradeJob;ImagePrePullJob
	Kind string `json:"kind"`
	// +kubebuilder:validation:MaxLength=253
	Name string    `json:"name"`
	UID  types.UID `json:"uid"`
}

// NodeTaskSlice holds the per-node detail of one job for a fixed set of
// nodes. It is owned by its job (deleted with it) and written in batches by
// the hubs that serve those nodes.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=nts,categories=drover
// +kubebuilder:printcolumn:name="Kind",type=string,JSONPath=`.job.kind`
// +kubebuilder:printcolumn:name="Job",type=string,JSONPath=`.job.name`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NodeTaskSlice struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// job this slice belongs to.
	Job JobReference `json:"job"`

	// nodes are the detail of each node in this slice. The list is atomic
	// for server-side field tracking: only Drover writes it, always whole,
	// and tracking each entry's fields made every write of a 150-node slice
	// cost the apiserver about 300 ms and the object a large managedFields.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=1000
	Nodes []NodeTaskStatus `json:"nodes"`
}

// NodeTaskSliceList is a list of NodeTaskSlices.
//
// +kubebuilder:object:root=true
type NodeTaskSliceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeTaskSlice `json:"items"`
}
