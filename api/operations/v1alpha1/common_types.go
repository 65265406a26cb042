package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// JobPhase is where a node job is as a whole.
//
//	Init ──► InProgress ──► Completed
//	  │           │
//	  └───────────┴───────► Failure
//
// Completed and Failure are final: a late report may still update a node's
// detail, but never the job's phase.
// +kubebuilder:validation:Enum=Init;InProgress;Completed;Failure
type JobPhase string

const (
	// JobPhaseInit: the manager has matched the nodes and created their tasks.
	JobPhaseInit JobPhase = "Init"
	// JobPhaseInProgress: some node task is Pending or InProgress.
	JobPhaseInProgress JobPhase = "InProgress"
	// JobPhaseCompleted: every node task is final and the share of failures
	// is within failureTolerate. (The seed spells it "Complated".)
	JobPhaseCompleted JobPhase = "Completed"
	// JobPhaseFailure: no node matched, the job was aborted, or the share of
	// failed node tasks is above failureTolerate.
	JobPhaseFailure JobPhase = "Failure"
)

// Final reports whether p is Completed or Failure.
func (p JobPhase) Final() bool { return p == JobPhaseCompleted || p == JobPhaseFailure }

// NodeTaskPhase is where one node is in a job.
//
//	Pending ──► InProgress ──► Successful
//	                 │
//	                 ├───────► Failure
//	                 └───────► Unknown (no report within timeoutSeconds)
//
// An Unknown node whose report arrives while the job is not final follows
// the report again (the timeout's reason is cleared).
//
// +kubebuilder:validation:Enum=Pending;InProgress;Successful;Failure;Unknown
type NodeTaskPhase string

const (
	NodeTaskPhasePending    NodeTaskPhase = "Pending"
	NodeTaskPhaseInProgress NodeTaskPhase = "InProgress"
	NodeTaskPhaseSuccessful NodeTaskPhase = "Successful"
	NodeTaskPhaseFailure    NodeTaskPhase = "Failure"
	NodeTaskPhaseUnknown    NodeTaskPhase = "Unknown"
)

// Final reports whether a node task in phase p will not change any more.
func (p NodeTaskPhase) Final() bool {
	return p == NodeTaskPhaseSuccessful || p == NodeTaskPhaseFailure || p == NodeTaskPhaseUnknown
}

// NodeTarget selects the nodes of a job: either by name or by labels.
// +kubebuilder:validation:XValidation:rule="has(self.nodeNames) != has(self.labelSelector)",message="set exactly one of nodeNames and labelSelector"
type NodeTarget struct {
	// nodeNames are FleetNode names. For larger fleets use labelSelector.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=1000
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	NodeNames []string `json:"nodeNames,omitempty"`

	// labelSelector matches FleetNode labels.
	// +optional
	LabelSelector *metav1.LabelSelector `json:"labelSelector,omitempty"`
}

// CheckItem names a pre-check run on the node before the job's work.
// +kubebuilder:validation:Enum=cpu;mem;disk
type CheckItem string

const (
	CheckCPU    CheckItem = "cpu"
	CheckMemory CheckItem = "mem"
	CheckDisk   CheckItem = "disk"
)

// CheckThresholds are the usage limits of the pre-checks, in percent. A check
// fails when usage is above its limit.
type CheckThresholds struct {
	// cpuPercent: the most CPU in use, averaged over one second. Default 80.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	CPUPercent *int32 `json:"cpuPercent,omitempty"`
	// memPercent: the most memory in use. Default 80.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	MemPercent *int32 `json:"memPercent,omitempty"`
	// diskPercent: the most of the agent's state-dir file system in use. Default 90.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	DiskPercent *int32 `json:"diskPercent,omitempty"`
}

// JobExecution are the knobs shared by every node job.
type JobExecution struct {
	// concurrency is the most nodes that run the job at once, across all hubs.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	Concurrency int32 `json:"concurrency,omitempty"`

	// timeoutSeconds: a node that does not report within this long of its
	// last action is Unknown, and frees its concurrency slot.
	// +optional
	// +kubebuilder:default=300
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	TimeoutSeconds int32 `json:"timeoutSeconds,omitempty"`

	// failureTolerate is the share of failed nodes, a decimal in [0, 1], at
	// or below which the job still Completes. Unset means 0: every node must
	// succeed.
	// +optional
	// +kubebuilder:validation:MaxLength=16
	// +kubebuilder:validation:Pattern=`^(0(\.[0-9]+)?|1(\.0+)?|\.[0-9]+)$`
	FailureTolerate string `json:"failureTolerate,omitempty"`

	// checkItems are pre-checks run before the work; a failed check fails the node.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=3
	CheckItems []CheckItem `json:"checkItems,omitempty"`

	// checkThresholds tune the pre-checks.
	// +optional
	CheckThresholds *CheckThresholds `json:"checkThresholds,omitempty"`
}

// ActionStatus records one action of a node's flow.
type ActionStatus struct {
	// action is the action's name, e.g. Check, Confirm, BackUp, Upgrade, RollBack, Pull.
	// +kubebuilder:validation:MaxLength=64
	Action string `json:"action"`
	// status is True when the action succeeded, False when it failed, Unknown while it runs.
	Status metav1.ConditionStatus `json:"status"`
	// reason says why the action failed, or what it did.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Reason string `json:"reason,omitempty"`
	// time is when the action ended (or started, while it runs).
	Time metav1.Time `json:"time"`
	// startTime is when the action started, once it ended after running
	// for a while (e.g. Confirm: when the node began to wait).
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// by is who let the action go on (Confirm: who confirmed).
	// +optional
	// +kubebuilder:validation:MaxLength=253
	By string `json:"by,omitempty"`
}

// ImageStatus is the result of pulling one image on one node.
type ImageStatus struct {
	// image is the reference as written in the job.
	// +kubebuilder:validation:MaxLength=512
	Image string `json:"image"`
	// status is True when the image is on the node, False when the pull failed.
	Status metav1.ConditionStatus `json:"status"`
	// reason says why the pull failed, or the pulled digest.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Reason string `json:"reason,omitempty"`
}

// NodeTaskStatus is one node's detail in a job.
type NodeTaskStatus struct {
	// nodeName is the FleetNode.
	// +kubebuilder:validation:MaxLength=253
	NodeName string `json:"nodeName"`
	// phase of this node's task.
	Phase NodeTaskPhase `json:"phase"`
	// action is the action the node is at, or ended with.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Action string `json:"action,omitempty"`
	// reason says why the task failed or is Unknown.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Reason string `json:"reason,omitempty"`
	// actionFlow records each action the node ran, in order.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	ActionFlow []ActionStatus `json:"actionFlow,omitempty"`
	// currentVersion is the agent version the node runs now (upgrades).
	// +optional
	// +kubebuilder:validation:MaxLength=128
	CurrentVersion string `json:"currentVersion,omitempty"`
	// historicVersion is the version the node ran before the upgrade.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	HistoricVersion string `json:"historicVersion,omitempty"`
	// imageStatus is the result of each image (pre-pulls).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	ImageStatus []ImageStatus `json:"imageStatus,omitempty"`
	// updateTime is when this entry last changed: for a report, when the
	// hub received it. Microseconds: the manager's timeout counts from it.
	// +optional
	UpdateTime *metav1.MicroTime `json:"updateTime,omitempty"`
}

// NodeTaskCounts counts a job's nodes by task phase.
type NodeTaskCounts struct {
	Total      int32 `json:"total"`
	Pending    int32 `json:"pending"`
	InProgress int32 `json:"inProgress"`
	Successful int32 `json:"successful"`
	Failure    int32 `json:"failure"`
	Unknown    int32 `json:"unknown"`
}

// NodeTaskSummary is a short record of one node, kept on the job for the
// first failures.
type NodeTaskSummary struct {
	// +kubebuilder:validation:MaxLength=253
	NodeName string        `json:"nodeName"`
	Phase    NodeTaskPhase `json:"phase"`
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Action string `json:"action,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Reason string `json:"reason,omitempty"`
}

// MaxFailuresOnJob bounds NodeJobStatus.Failures.
const MaxFailuresOnJob = 20

// NodeJobStatus is the status of every node job. Per-node detail lives in
// NodeTaskSlices; see `drover describe`.
type NodeJobStatus struct {
	// phase of the job as a whole.
	// +optional
	Phase JobPhase `json:"phase,omitempty"`
	// observedGeneration is the generation the status was computed for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// counts of the job's nodes by task phase.
	// +optional
	Counts NodeTaskCounts `json:"counts"`
	// failures are the first nodes that failed or went Unknown, at most 20.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=20
	Failures []NodeTaskSummary `json:"failures,omitempty"`
	// slices is how many NodeTaskSlices hold this job's node detail.
	// +optional
	Slices int32 `json:"slices,omitempty"`
	// startTime is when the manager initialized the job.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// completionTime is when the job reached Completed or Failure.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// conditions: Complete, Failed (with a reason that says why), Aborted.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Condition types and reasons of node jobs.
const (
	// ConditionComplete is True when the job Completed.
	ConditionComplete = "Complete"
	// ConditionFailed is True when the job failed; its reason says why.
	ConditionFailed = "Failed"

	ReasonNoMatchingNodes          = "NoMatchingNodes"
	ReasonFailureToleranceExceeded = "FailureToleranceExceeded"
	ReasonWithinFailureTolerance   = "WithinFailureTolerance"
	ReasonAborted                  = "Aborted"
	ReasonInvalidFailureTolerate   = "InvalidFailureTolerate"
)

// Add counts n node tasks in phase p.
func (c *NodeTaskCounts) Add(p NodeTaskPhase, n int32) {
	c.Total += n
	switch p {
	case NodeTaskPhasePending:
		c.Pending += n
	case NodeTaskPhaseInProgress:
		c.InProgress += n
	case NodeTaskPhaseSuccessful:
		c.Successful += n
	case NodeTaskPhaseFailure:
		c.Failure += n
	case NodeTaskPhaseUnknown:
		c.Unknown += n
	}
}
