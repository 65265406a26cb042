package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Labels the manager sets on what it creates.
const (
	LabelFleetJob  = "batch.drover.io/fleetjob"
	LabelTaskGroup = "batch.drover.io/taskgroup"
	LabelIndex     = "batch.drover.io/index"
	// LabelNode is on the tasks of a perNode group: the node the task is
	// for (cut to a label value; the task's spec.nodeName is the whole name).
	LabelNode = "batch.drover.io/node"
	// LabelInstance is on every task of a multi-task group (spec.tasks):
	// the instance (<group>-<index> or <group>-<node>, cut to a label
	// value) whose members are placed together on one node.
	LabelInstance = "batch.drover.io/instance"
	// LabelMember is the name of the spec.tasks entry a task was made from.
	LabelMember = "batch.drover.io/member"
	// LabelLifecycle is that entry's lifecycle: Init, Main or Sidecar.
	LabelLifecycle = "batch.drover.io/lifecycle"
)

// TaskLifecycle is the role of a task in a multi-task group's instance,
// as Nomad's lifecycle hooks: Init tasks (Nomad's prestart) run one after
// the other, each to success, before the others start; Main tasks are the
// work; Sidecar tasks run beside the mains and are stopped when every main
// has ended.
// +kubebuilder:validation:Enum=Init;Main;Sidecar
type TaskLifecycle string

const (
	LifecycleInit    TaskLifecycle = "Init"
	LifecycleMain    TaskLifecycle = "Main"
	LifecycleSidecar TaskLifecycle = "Sidecar"
)

// Reasons of a multi-task group's instances and members.
const (
	// ReasonInitFailed: an init task failed for good; the instance ends
	// Failed and its other tasks never start.
	ReasonInitFailed = "InitFailed"
	// ReasonSidecarStopped: a sidecar was stopped because every main task
	// of its instance ended. Not a failure.
	ReasonSidecarStopped = "SidecarStopped"
	// ReasonWaitingForInit: a task waits for its instance's init tasks.
	ReasonWaitingForInit = "WaitingForInit"
)

// MaxGroupTasks bounds spec.tasks (and so the CEL cost of the schema).
const MaxGroupTasks = 16

// GroupTask is one task of each instance of a multi-task group.
type GroupTask struct {
	// name of the task in the group; each instance's task is named
	// <group>-<index>-<name> (or <group>-<node>-<name> for perNode).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// lifecycle is Init, Main (the default) or Sidecar.
	// +kubebuilder:default=Main
	// +optional
	Lifecycle TaskLifecycle `json:"lifecycle,omitempty"`
	// metadata of the task: labels and annotations.
	// +optional
	Metadata TemplateMetadata `json:"metadata,omitempty"`
	Spec     TaskSpec         `json:"spec"`
}

// Role is t's lifecycle, Main when unset.
func (t *GroupTask) Role() TaskLifecycle {
	if t.Lifecycle == "" {
		return LifecycleMain
	}
	return t.Lifecycle
}

// GroupPhase is where a TaskGroup or FleetJob is as a whole.
// +kubebuilder:validation:Enum=Pending;Running;Completed;Failed
type GroupPhase string

const (
	// GroupPending: no task has started yet.
	GroupPending GroupPhase = "Pending"
	// GroupRunning: some task is not final.
	GroupRunning GroupPhase = "Running"
	// GroupCompleted: every task Completed.
	GroupCompleted GroupPhase = "Completed"
	// GroupFailed: every task is final and at least one Failed.
	GroupFailed GroupPhase = "Failed"
)

// TaskCounts counts tasks by state.
// Zeros are written out, so that kubectl's columns show 0, not blanks.
type TaskCounts struct {
	// +optional
	Total int32 `json:"total"`
	// +optional
	Pending int32 `json:"pending"`
	// +optional
	Scheduled int32 `json:"scheduled"`
	// +optional
	Dispatching int32 `json:"dispatching"`
	// +optional
	Running int32 `json:"running"`
	// +optional
	Completed int32 `json:"completed"`
	// +optional
	Failed int32 `json:"failed"`
	// active is scheduled + dispatching + running: the tasks a node holds.
	// +optional
	Active int32 `json:"active"`
}

// Final reports whether p is an end phase (Completed or Failed).
func (p GroupPhase) Final() bool { return p == GroupCompleted || p == GroupFailed }

// TaskTemplate is the metadata and spec of the tasks a group creates.
type TaskTemplate struct {
	// metadata of every task, as a Pod template's: labels and annotations.
	// +optional
	Metadata TemplateMetadata `json:"metadata,omitempty"`
	// labels added to every task; the same as metadata.labels, which wins
	// where both name a key.
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	Spec   TaskSpec          `json:"spec"`
}

// TemplateMetadata is what a template gives the objects it makes.
type TemplateMetadata struct {
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// TaskGroupSpec makes count tasks from one template, or one per matching
// node (perNode). With tasks instead of template, each of those is an
// instance of several tasks placed together on one node.
// +kubebuilder:validation:XValidation:rule="has(self.template) != has(self.tasks)",message="exactly one of spec.template (one task per instance) or spec.tasks (several tasks per instance) must be set"
// +kubebuilder:validation:XValidation:rule="has(self.count) || (has(self.perNode) && self.perNode)",message="count is required unless perNode is true"
// +kubebuilder:validation:XValidation:rule="!(has(self.perNode) && self.perNode) || !has(self.count) || self.count == 0",message="perNode makes one task per matching node: leave count unset (or 0)"
type TaskGroupSpec struct {
	// count of tasks, named <group>-<index>. Required unless perNode.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	// +optional
	Count int32 `json:"count"`
	// perNode runs one task on every node the template's nodeSelector
	// matches and a NodeGrant of the namespace allows (Nomad's system
	// jobs, K8s4r's TaskGroup without count), each pinned to its node
	// with spec.nodeName and named <group>-<node>. A node that joins or
	// comes to match gets its task while the group runs; the task of a
	// node that no longer matches (labels, grant, deleted) is deleted; the
	// task of a node that goes Offline follows its reschedulePolicy but is
	// never moved to another node. The group waits (Pending) while no node
	// matches, and ends once every matching node's task has ended.
	// +optional
	PerNode bool `json:"perNode,omitempty"`
	// template of the one task of each instance. Exactly one of template
	// and tasks.
	// +optional
	Template TaskTemplate `json:"template,omitzero"`
	// tasks of each instance, instead of template (K8s4r's TaskGroup with
	// several task definitions, Nomad's group with lifecycle hooks). An
	// instance's tasks all run on one node, which must have room for the
	// biggest init task and for all mains and sidecars together. Inits
	// run in list order, each to success before the next; then mains and
	// sidecars start together; sidecars are stopped once every main has
	// ended. The instance fails if an init fails (reason InitFailed) or a
	// main fails; it completes when every main completed.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:XValidation:rule="self.exists(t, !has(t.lifecycle) || t.lifecycle == 'Main')",message="spec.tasks needs at least one task with lifecycle Main"
	// +listType=map
	// +listMapKey=name
	// +optional
	Tasks []GroupTask `json:"tasks,omitempty"`
	// activeDeadlineSeconds bounds how long the group runs, counted from
	// its creation, as a batch/v1 Job's does: then its unfinished tasks
	// are deleted (a running one's process is stopped) and it ends
	// Failed, reason DeadlineExceeded. Unset: no limit.
	// +kubebuilder:validation:Minimum=1
	// +optional
	ActiveDeadlineSeconds *int64 `json:"activeDeadlineSeconds,omitempty"`
}

// TaskGroupStatus aggregates the group's tasks.
type TaskGroupStatus struct {
	// +optional
	Phase GroupPhase `json:"phase,omitempty"`
	// desired is how many tasks the group wants: count, or for a perNode
	// group the nodes that match now.
	// +optional
	Desired int32 `json:"desired"`
	// +optional
	Counts TaskCounts `json:"counts,omitempty"`
	// tasks is the progress of each spec.tasks entry over the instances
	// (a multi-task group only); counts then counts instances.
	// +kubebuilder:validation:MaxItems=16
	// +optional
	Tasks []GroupTaskStatus `json:"tasks,omitempty"`
	// taskProgress is "<ended>/<all>" of a multi-task group's tasks over
	// its instances: the TASKS column. A stopped sidecar counts as ended.
	// +optional
	TaskProgress string `json:"taskProgress,omitempty"`
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// GroupTaskStatus counts one spec.tasks entry's tasks over the instances.
type GroupTaskStatus struct {
	Name string `json:"name"`
	// +optional
	Lifecycle TaskLifecycle `json:"lifecycle,omitempty"`
	// waiting: not started (gated behind the inits, or not placed yet).
	// +optional
	Waiting int32 `json:"waiting"`
	// +optional
	Active int32 `json:"active"`
	// +optional
	Completed int32 `json:"completed"`
	// +optional
	Failed int32 `json:"failed"`
	// stopped: sidecars stopped because their mains ended (SidecarStopped),
	// and tasks never started because an init failed.
	// +optional
	Stopped int32 `json:"stopped"`
}

// TaskGroup is count tasks from one template (K8s4r's TaskGroup). A FleetJob
// owns its groups; a TaskGroup can also be created on its own.
// +kubebuilder:object:root=true
// +kubebuilder:validation:XValidation:rule="oldSelf.hasValue() || size(self.metadata.name) <= 248",optionalOldSelf=true,message="the name makes task names over 253 characters (<group>-<index>): at most 248"
// +kubebuilder:validation:XValidation:rule="oldSelf.hasValue() || !has(self.spec.tasks) || self.spec.tasks.all(t, size(self.metadata.name) + size(t.name) <= 242)",optionalOldSelf=true,message="the group's name and a spec.tasks name together make task names over 253 characters (<group>-<index>-<task>): shorten them to 242 together"
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=tg,categories=drover
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.status.desired`,description="count, or the matching nodes of a perNode group"
// +kubebuilder:printcolumn:name="Tasks",type=string,JSONPath=`.status.taskProgress`,description="ended/all tasks of a multi-task group (spec.tasks) over its instances"
// +kubebuilder:printcolumn:name="PerNode",type=boolean,JSONPath=`.spec.perNode`,priority=1
// +kubebuilder:printcolumn:name="Pending",type=integer,JSONPath=`.status.counts.pending`
// +kubebuilder:printcolumn:name="Active",type=integer,JSONPath=`.status.counts.active`,description="scheduled, dispatching or running"
// +kubebuilder:printcolumn:name="Running",type=integer,JSONPath=`.status.counts.running`,priority=1
// +kubebuilder:printcolumn:name="Completed",type=integer,JSONPath=`.status.counts.completed`
// +kubebuilder:printcolumn:name="Failed",type=integer,JSONPath=`.status.counts.failed`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TaskGroup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   TaskGroupSpec   `json:"spec"`
	Status TaskGroupStatus `json:"status,omitempty"`
}

// TaskGroupList is a list of TaskGroups.
// +kubebuilder:object:root=true
type TaskGroupList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TaskGroup `json:"items"`
}
