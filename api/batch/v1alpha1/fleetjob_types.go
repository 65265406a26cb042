package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// TaskGroupTemplate is one group of a FleetJob.
// +kubebuilder:validation:XValidation:rule="has(self.count) || (has(self.perNode) && self.perNode)",message="count is required unless perNode is true"
// +kubebuilder:validation:XValidation:rule="!(has(self.perNode) && self.perNode) || !has(self.count) || self.count == 0",message="perNode makes one task per matching node: leave count unset (or 0)"
type TaskGroupTemplate struct {
	// name of the group; the TaskGroup is named <job>-<name>.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// count of tasks in the group. Required unless perNode.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	// +optional
	Count int32 `json:"count"`
	// perNode: one task on every matching node (TaskGroupSpec.perNode).
	// +optional
	PerNode  bool         `json:"perNode,omitempty"`
	Template TaskTemplate `json:"template"`
	// tasks is not supported in a FleetJob yet and is refused: it is only
	// here so that the API answers with an error that says so instead of
	// dropping the field.
	// +kubebuilder:validation:XValidation:rule="size(self) == 0",message="taskGroups[].tasks (several tasks per instance) is not supported in a FleetJob yet: create a TaskGroup with spec.tasks instead (a FleetJob's schema would exceed the apiserver's CEL cost budget with 64 groups of 16 task specs)"
	// +optional
	Tasks []runtime.RawExtension `json:"tasks,omitempty"`
}

// FleetJobSpec is a workflow of task groups (K8s4r's Job).
type FleetJobSpec struct {
	// nodeSelector (the seed's robotSelector) applies to every task that
	// has none of its own.
	// +optional
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
	// priority of every task that sets none.
	// +optional
	Priority int32 `json:"priority,omitempty"`
	// restartPolicy of every task that sets none.
	// +kubebuilder:validation:Enum=Never;OnFailure
	// +optional
	RestartPolicy RestartPolicy `json:"restartPolicy,omitempty"`
	// reschedulePolicy of every task that sets none.
	// +kubebuilder:validation:Enum=Never;OnNodeLost
	// +optional
	ReschedulePolicy ReschedulePolicy `json:"reschedulePolicy,omitempty"`
	// activeDeadlineSeconds of every group (from the group's creation,
	// which is the job's unless the group was added later): then its
	// unfinished tasks are deleted and it ends Failed, and so does the
	// job. Unset: no limit.
	// +kubebuilder:validation:Minimum=1
	// +optional
	ActiveDeadlineSeconds *int64 `json:"activeDeadlineSeconds,omitempty"`
	// taskGroups, each made into a TaskGroup owned by this job.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=map
	// +listMapKey=name
	TaskGroups []TaskGroupTemplate `json:"taskGroups"`
}

// GroupSummary is one TaskGroup's phase and counts in its job's status.
type GroupSummary struct {
	Name string `json:"name"`
	// +optional
	Phase GroupPhase `json:"phase,omitempty"`
	// desired is the group's status.desired.
	// +optional
	Desired int32 `json:"desired"`
	// +optional
	Counts TaskCounts `json:"counts,omitempty"`
}

// FleetJobStatus aggregates the job's TaskGroups.
type FleetJobStatus struct {
	// +optional
	Phase GroupPhase `json:"phase,omitempty"`
	// desired is the sum of the groups' desired tasks.
	// +optional
	Desired int32 `json:"desired"`
	// counts over all the job's tasks.
	// +optional
	Counts TaskCounts `json:"counts,omitempty"`
	// +optional
	Groups []GroupSummary `json:"groups,omitempty"`
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// FleetJob is a set of task groups run on fleet nodes (K8s4r's Job).
// +kubebuilder:object:root=true
// +kubebuilder:validation:XValidation:rule="self.spec.taskGroups.all(g, size(self.metadata.name) + size(g.name) <= 247)",message="the job's name and a group's name together make names over 253 characters (TaskGroup <job>-<group>, Task <job>-<group>-<index>): shorten them to 247 together"
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=fj,categories=drover
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.status.desired`,description="the groups' counts, and the matching nodes of perNode groups"
// +kubebuilder:printcolumn:name="Tasks",type=integer,JSONPath=`.status.counts.total`
// +kubebuilder:printcolumn:name="Pending",type=integer,JSONPath=`.status.counts.pending`
// +kubebuilder:printcolumn:name="Active",type=integer,JSONPath=`.status.counts.active`,description="scheduled, dispatching or running"
// +kubebuilder:printcolumn:name="Running",type=integer,JSONPath=`.status.counts.running`,priority=1
// +kubebuilder:printcolumn:name="Completed",type=integer,JSONPath=`.status.counts.completed`
// +kubebuilder:printcolumn:name="Failed",type=integer,JSONPath=`.status.counts.failed`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type FleetJob struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   FleetJobSpec   `json:"spec"`
	Status FleetJobStatus `json:"status,omitempty"`
}

// FleetJobList is a list of FleetJobs.
// +kubebuilder:object:root=true
type FleetJobList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []FleetJob `json:"items"`
}
