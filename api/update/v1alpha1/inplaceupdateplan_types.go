package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SelectResource is which part of a node a responsibility changes (the
// seed's InfraMachine, Machine and Bootstrap).
//
// +kubebuilder:validation:Enum=NodeImage;NodeSpec;Configuration
type SelectResource string

const (
	// SelectNodeImage: the node's OS and image facts (InfraMachine).
	SelectNodeImage SelectResource = "NodeImage"
	// SelectNodeSpec: the FleetNode's spec, agent version and labels (Machine).
	SelectNodeSpec SelectResource = "NodeSpec"
	// SelectConfiguration: the node's configuration files (Bootstrap).
	SelectConfiguration SelectResource = "Configuration"
)

// Responsibility is one change an updater owns.
type Responsibility struct {
	// path of the changed field, e.g. /spec/agentVersion or /files/etc/app.conf.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	Path string `json:"path"`
	// selectResource is the part of the node the path is in.
	SelectResource SelectResource `json:"selectResource"`
	// value is the target value.
	// +optional
	// +kubebuilder:validation:MaxLength=65536
	Value string `json:"value,omitempty"`
}

// Updater is one updater of a plan.
type Updater struct {
	// name of the updater; labels its tasks.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9]([-a-zA-Z0-9._]*[a-zA-Z0-9])?$`
	Name string `json:"name"`
	// updaterUpdateTemplateRef names the template its tasks are made from:
	// a task of kind <template kind without "Template"> with the template's
	// spec.template.spec (Cluster API's template convention).
	UpdaterUpdateTemplateRef ObjectRef `json:"updaterUpdateTemplateRef"`
	// sequence orders updaters on a node: they run one after another, the
	// lowest first.
	// +kubebuilder:validation:Minimum=1
	Sequence int32 `json:"sequence"`
	// responsibilities are the changes this updater owns.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	Responsibilities []Responsibility `json:"responsibilities,omitempty"`
}

// PlanPool is one pool of a plan.
type PlanPool struct {
	// name of the NodePool.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// sequence orders pools: all pools of one sequence number update
	// together, after every lower sequence is updated.
	// +kubebuilder:validation:Minimum=1
	Sequence int32 `json:"sequence"`
}

// InPlaceUpdatePlanSpec is the blueprint of an in-place update.
//
// +kubebuilder:validation:XValidation:rule="self.pools.all(p, self.pools.filter(q, q.name == p.name).size() == 1)",message="spec.pools names a pool twice",fieldPath=".pools"
type InPlaceUpdatePlanSpec struct {
	// updatePhase is updating, or aborting to stop the plan.
	// +kubebuilder:default=updating
	// +optional
	UpdatePhase UpdatePhase `json:"updatePhase,omitempty"`
	// pools to update, with their sequence numbers.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	Pools []PlanPool `json:"pools"`
	// updaters run on each node, one after another by sequence.
	// (A messageExpression naming them costs more than the apiserver's CEL
	// budget allows for this schema; the plan controller names them.)
	// +kubebuilder:validation:XValidation:rule="self.all(u, self.exists_one(v, v.sequence == u.sequence))",message="two updaters share a sequence number: updaters on a node run one after another, give each its own"
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	Updaters []Updater `json:"updaters"`
	// maxInFlight caps the nodes updating at once across the plan; 0 means
	// only the pools' strategies limit it.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MaxInFlight int32 `json:"maxInFlight,omitempty"`
}

// PoolUpdate is a pool's state in the plan.
type PoolUpdate struct {
	// name of the pool.
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// sequence of the pool.
	Sequence int32 `json:"sequence"`
	// updateStatus of the pool in this plan; empty until its sequence starts.
	// +optional
	UpdateStatus UpdateStatus `json:"updateStatus,omitempty"`
	// nodes, updatedNodes: the pool's counts.
	// +optional
	Nodes int32 `json:"nodes"`
	// +optional
	UpdatedNodes int32 `json:"updatedNodes"`
}

// NodeFailure is a node whose update failed.
type NodeFailure struct {
	// node is the FleetNode's name.
	// +kubebuilder:validation:MaxLength=253
	Node string `json:"node"`
	// updater that failed.
	// +kubebuilder:validation:MaxLength=63
	Updater string `json:"updater,omitempty"`
	// reason the task gave.
	// +kubebuilder:validation:MaxLength=256
	Reason string `json:"reason,omitempty"`
	// message the task gave.
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
}

// NodeSummary counts the plan's nodes by update status.
type NodeSummary struct {
	// +optional
	Total int32 `json:"total"`
	// +optional
	Updating int32 `json:"updating"`
	// +optional
	Updated int32 `json:"updated"`
	// +optional
	Aborting int32 `json:"aborting"`
	// +optional
	Aborted int32 `json:"aborted"`
	// +optional
	Failed int32 `json:"failed"`
}

// InPlaceUpdatePlanStatus is the plan's progress.
type InPlaceUpdatePlanStatus struct {
	// updateStatus is the plan's: updating, updated, aborting, aborted or failed.
	// +optional
	UpdateStatus UpdateStatus `json:"updateStatus,omitempty"`
	// currentSequence is the pool sequence running now.
	// +optional
	CurrentSequence int32 `json:"currentSequence,omitempty"`
	// pools: each pool's state.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	Pools []PoolUpdate `json:"pools,omitempty"`
	// nodes counts the plan's nodes by status.
	// +optional
	Nodes NodeSummary `json:"nodes,omitempty"`
	// failures: at most 16 failed nodes, the first ones.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	Failures []NodeFailure `json:"failures,omitempty"`
	// conditions: one SequenceNUpdate per pool sequence, and Failed.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=70
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// observedGeneration is the generation last acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// InPlaceUpdatePlan updates pools of FleetNodes in place: pool sequences in
// order, nodes by each pool's strategy, updaters on a node one after
// another (Cluster API's InPlaceUpdatePlan).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=iup;plan,categories=drover
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.spec.updatePhase`
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.updateStatus`
// +kubebuilder:printcolumn:name="Sequence",type=integer,JSONPath=`.status.currentSequence`
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.status.nodes.total`
// +kubebuilder:printcolumn:name="Updated",type=integer,JSONPath=`.status.nodes.updated`
// +kubebuilder:printcolumn:name="Failed",type=integer,JSONPath=`.status.nodes.failed`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Failed")].message`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type InPlaceUpdatePlan struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec InPlaceUpdatePlanSpec `json:"spec"`
	// +optional
	Status InPlaceUpdatePlanStatus `json:"status,omitempty"`
}

// InPlaceUpdatePlanList is a list of InPlaceUpdatePlans.
//
// +kubebuilder:object:root=true
type InPlaceUpdatePlanList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []InPlaceUpdatePlan `json:"items"`
}
