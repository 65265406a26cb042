package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
)

// AgentVersionUpdate is what the built-in agent-version updater does on a
// node: upgrade drover-agent in place through the node-job upgrade path
// (download, sha256 check, swap, restart, health check, rollback).
type AgentVersionUpdate struct {
	// version the agent reports after the update.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^v?[0-9A-Za-z][0-9A-Za-z.+_-]*$`
	Version string `json:"version"`
	// artifact is where the new binary comes from.
	Artifact opsv1.AgentArtifact `json:"artifact"`
	// timeoutSeconds bounds the upgrade on the node (the node job's
	// timeout); 0 means the node job's default.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=86400
	TimeoutSeconds int32 `json:"timeoutSeconds,omitempty"`
}

// AgentVersionUpdateTaskSpec is one node's agent upgrade in a plan.
type AgentVersionUpdateTaskSpec struct {
	AgentVersionUpdate `json:",inline"`
	// updatePhase is written by Drover: updating, or aborting.
	// +optional
	UpdatePhase UpdatePhase `json:"updatePhase,omitempty"`
	// responsibilities are copied from the plan's updater.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	Responsibilities []Responsibility `json:"responsibilities,omitempty"`
}

// AgentVersionUpdateTaskStatus is the UpdaterUpdateTask contract's status.
type AgentVersionUpdateTaskStatus struct {
	// updateStatus: updating, updated, aborting, aborted or failed.
	// +optional
	UpdateStatus UpdateStatus `json:"updateStatus,omitempty"`
	// nodeUpgradeJob is the job doing the upgrade.
	// +optional
	NodeUpgradeJob string `json:"nodeUpgradeJob,omitempty"`
	// conditions: Ready, False with the reason while updating or after a
	// failure.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// AgentVersionUpdateTask is the built-in agent-version updater's task
// (an UpdaterUpdateTask, docs/contracts/updater-update-task.md): Drover's
// in-place update makes one per node from an
// AgentVersionUpdateTaskTemplate, and the updater carries it out with a
// one-node NodeUpgradeJob it owns.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=avut,categories=drover
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.metadata.labels.update\.drover\.io/node-name`
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.spec.version`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.spec.updatePhase`
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.updateStatus`
// +kubebuilder:printcolumn:name="Job",type=string,JSONPath=`.status.nodeUpgradeJob`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type AgentVersionUpdateTask struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec AgentVersionUpdateTaskSpec `json:"spec"`
	// +optional
	Status AgentVersionUpdateTaskStatus `json:"status,omitempty"`
}

// AgentVersionUpdateTaskList is a list of AgentVersionUpdateTasks.
//
// +kubebuilder:object:root=true
type AgentVersionUpdateTaskList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AgentVersionUpdateTask `json:"items"`
}

// AgentVersionUpdateTaskTemplateResource is the template's
// spec.template: what every task made from it gets.
type AgentVersionUpdateTaskTemplateResource struct {
	Spec AgentVersionUpdate `json:"spec"`
}

// AgentVersionUpdateTaskTemplateSpec holds the task template.
type AgentVersionUpdateTaskTemplateSpec struct {
	Template AgentVersionUpdateTaskTemplateResource `json:"template"`
}

// AgentVersionUpdateTaskTemplate is named by a plan's updater
// (updaterUpdateTemplateRef: apiVersion update.drover.io/v1alpha1, kind
// AgentVersionUpdateTaskTemplate, no namespace).
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=avutt,categories=drover
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.spec.template.spec.version`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type AgentVersionUpdateTaskTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec AgentVersionUpdateTaskTemplateSpec `json:"spec"`
}

// AgentVersionUpdateTaskTemplateList is a list of templates.
//
// +kubebuilder:object:root=true
type AgentVersionUpdateTaskTemplateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AgentVersionUpdateTaskTemplate `json:"items"`
}
