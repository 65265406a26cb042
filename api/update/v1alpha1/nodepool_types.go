package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// StrategyType is how a pool picks nodes to update.
//
// +kubebuilder:validation:Enum=OneAtATime;MaxUnavailable
type StrategyType string

const (
	// StrategyOneAtATime updates one node at a time after a preflight
	// check (as KubeadmControlPlane).
	StrategyOneAtATime StrategyType = "OneAtATime"
	// StrategyMaxUnavailable updates up to maxUnavailable nodes at once
	// (as MachineDeployment).
	StrategyMaxUnavailable StrategyType = "MaxUnavailable"
)

// UpdateStrategy says how a pool's nodes are updated.
//
// +kubebuilder:validation:XValidation:rule="self.type == 'MaxUnavailable' || !has(self.maxUnavailable)",message="strategy.maxUnavailable is allowed only with type MaxUnavailable"
type UpdateStrategy struct {
	// type is OneAtATime (default) or MaxUnavailable.
	// +kubebuilder:default=OneAtATime
	// +optional
	Type StrategyType `json:"type,omitempty"`
	// maxUnavailable is how many nodes (or what percentage, rounded down,
	// at least 1) may update at once. Default 1.
	// +optional
	// +kubebuilder:validation:XIntOrString
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
}

// ConfigFile is a configuration file an updater writes on the node.
type ConfigFile struct {
	// path is the absolute path of the file on the node.
	// +kubebuilder:validation:MinLength=2
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^/[^\x00]*$`
	Path string `json:"path"`
	// content of the file.
	// +kubebuilder:validation:MaxLength=65536
	Content string `json:"content"`
}

// NodeTemplate is the desired state of a pool's nodes: the fields updaters
// own. Empty fields are not managed.
type NodeTemplate struct {
	// agentVersion is the drover-agent version (selectResource NodeSpec).
	// +optional
	// +kubebuilder:validation:MaxLength=128
	AgentVersion string `json:"agentVersion,omitempty"`
	// osImage is the node's OS image (selectResource NodeImage).
	// +optional
	// +kubebuilder:validation:MaxLength=256
	OSImage string `json:"osImage,omitempty"`
	// files are configuration files (selectResource Configuration).
	// +optional
	// +listType=map
	// +listMapKey=path
	// +kubebuilder:validation:MaxItems=32
	Files []ConfigFile `json:"files,omitempty"`
}

// NodePoolSpec is what operators want of a pool.
type NodePoolSpec struct {
	// selector picks the pool's FleetNodes. A node belongs to at most one
	// pool: a pool overlapping another is refused (condition Ready False,
	// reason OverlappingPools, naming both).
	Selector metav1.LabelSelector `json:"selector"`
	// strategy says how nodes are picked for an update.
	// +optional
	Strategy UpdateStrategy `json:"strategy,omitempty"`
	// template is the desired state of the pool's nodes.
	// +optional
	Template NodeTemplate `json:"template,omitempty"`
	// autoUpdate: a change to template starts an update by itself. Drover
	// asks the registered updaters (UpdaterRegistrations) in an
	// ExternalUpdateRequest and, once every change is claimed, makes the
	// InPlaceUpdatePlan; a newer change aborts the plan of an older one.
	// Off (default): plans are written by hand.
	// +optional
	AutoUpdate bool `json:"autoUpdate,omitempty"`
	// drain says what happens to the tasks running on a node picked for
	// an update, after it is cordoned and before its first updater task.
	// Default: wait up to 10 min for them to end.
	// +optional
	Drain *DrainPolicy `json:"drain,omitempty"`
	// maintenanceWindows, when set, are the only times a node of the pool
	// starts an update: a node updating when a window closes finishes,
	// and the next nodes wait for the next window (condition
	// PreflightBlocked, reason OutsideMaintenanceWindow, with its time).
	// +optional
	// +kubebuilder:validation:MaxItems=16
	MaintenanceWindows []MaintenanceWindow `json:"maintenanceWindows,omitempty"`
	// rollout, when set, limits how fast the pool starts nodes and lets it
	// tolerate some failures (AWS IoT Jobs' exponential rollout). Unset:
	// nodes start as the strategy allows, and the first failure stops new
	// picks.
	// +optional
	Rollout *Rollout `json:"rollout,omitempty"`
	// updatePhase is set by the plan running on the pool.
	// +optional
	UpdatePhase UpdatePhase `json:"updatePhase,omitempty"`
}

// DrainType is how a pool drains a node before its update.
//
// +kubebuilder:validation:Enum=Wait;None
type DrainType string

const (
	// DrainWait waits until no task runs on the node; after the timeout
	// the node's update fails with reason DrainTimeout (no task is
	// stopped).
	DrainWait DrainType = "Wait"
	// DrainNone updates the node under its running tasks.
	DrainNone DrainType = "None"
)

// DrainPolicy is how a pool drains a node before updating it. Tasks of
// perNode groups run on every node and would never leave: they are not
// waited for, and keep running through the update (the agent re-attaches
// to them after a restart).
type DrainPolicy struct {
	// policy is Wait (default) or None.
	// +kubebuilder:default=Wait
	// +optional
	Policy DrainType `json:"policy,omitempty"`
	// timeout bounds the wait. Default 10m.
	// +optional
	Timeout *metav1.Duration `json:"timeout,omitempty"`
}

// MaintenanceWindow is a recurring time span in which updates may start.
type MaintenanceWindow struct {
	// schedule is when the window opens, in cron's five fields (minute
	// hour day-of-month month day-of-week), e.g. "0 2 * * 1-5".
	// +kubebuilder:validation:MinLength=9
	// +kubebuilder:validation:MaxLength=128
	Schedule string `json:"schedule"`
	// duration is how long the window stays open, e.g. "2h".
	Duration metav1.Duration `json:"duration"`
	// timeZone is the IANA time zone of schedule, e.g. "Europe/Berlin".
	// Default UTC.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	TimeZone string `json:"timeZone,omitempty"`
}

// Rollout is an exponential rollout rate with an abort threshold.
//
// +kubebuilder:validation:XValidation:rule="!has(self.maximumPerMinute) || self.maximumPerMinute >= self.baseRatePerMinute",message="rollout.maximumPerMinute must be at least baseRatePerMinute"
type Rollout struct {
	// baseRatePerMinute is how many nodes may start in any minute at
	// first.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	BaseRatePerMinute int32 `json:"baseRatePerMinute"`
	// incrementFactor multiplies the rate after every succeededPerIncrease
	// nodes updated, e.g. "2" or "1.5" (1 to 5). Default "2".
	// +optional
	// +kubebuilder:validation:Pattern=`^[1-5](\.[0-9]{1,2})?$`
	IncrementFactor string `json:"incrementFactor,omitempty"`
	// succeededPerIncrease is how many nodes must update before the rate
	// grows. Default: baseRatePerMinute.
	// +optional
	// +kubebuilder:validation:Minimum=1
	SucceededPerIncrease int32 `json:"succeededPerIncrease,omitempty"`
	// maximumPerMinute caps the rate. Default: no cap beyond the strategy.
	// +optional
	// +kubebuilder:validation:Minimum=1
	MaximumPerMinute int32 `json:"maximumPerMinute,omitempty"`
	// abortThresholdPercent: once at least minEndedForAbort nodes ended, a
	// failed share at or above this stops new picks (reason
	// RolloutAbortThreshold). Below it, a failed node does not stop the
	// pool. 0 (default) stops at the first failure, as without rollout.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	AbortThresholdPercent int32 `json:"abortThresholdPercent,omitempty"`
	// minEndedForAbort is how many nodes must have ended (updated or
	// failed) before the threshold applies. Default 1.
	// +optional
	// +kubebuilder:validation:Minimum=1
	MinEndedForAbort int32 `json:"minEndedForAbort,omitempty"`
}

// NodePoolStatus is what the pool controller observed.
type NodePoolStatus struct {
	// updateStatus aggregates the pool's nodes in the running plan.
	// +optional
	UpdateStatus UpdateStatus `json:"updateStatus,omitempty"`
	// nodes is how many FleetNodes the selector picks.
	// +optional
	Nodes int32 `json:"nodes"`
	// updatedNodes are at updateRevision.
	// +optional
	UpdatedNodes int32 `json:"updatedNodes"`
	// updatingNodes are being updated or aborted.
	// +optional
	UpdatingNodes int32 `json:"updatingNodes"`
	// currentRevision is the template revision the pool's nodes were last
	// all at; updateRevision the one being rolled out.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	CurrentRevision string `json:"currentRevision,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=64
	UpdateRevision string `json:"updateRevision,omitempty"`
	// conditions: InPlaceUpdate, PreflightBlocked.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// observedGeneration is the generation last acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// NodePool is a set of FleetNodes updated together (Cluster API's
// KubeadmControlPlane and MachineDeployment).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=np;pool,categories=drover
// +kubebuilder:printcolumn:name="Strategy",type=string,JSONPath=`.spec.strategy.type`
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.status.nodes`
// +kubebuilder:printcolumn:name="Updated",type=integer,JSONPath=`.status.updatedNodes`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.spec.updatePhase`
// +kubebuilder:printcolumn:name="Update",type=string,JSONPath=`.status.updateStatus`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="InPlaceUpdate")].reason`
// +kubebuilder:printcolumn:name="Plan",type=string,JSONPath=`.metadata.labels.update\.drover\.io/update-task-name`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NodePool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec NodePoolSpec `json:"spec"`
	// +optional
	Status NodePoolStatus `json:"status,omitempty"`
}

// NodePoolList is a list of NodePools.
//
// +kubebuilder:object:root=true
type NodePoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodePool `json:"items"`
}
