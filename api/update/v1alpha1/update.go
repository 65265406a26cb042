package v1alpha1

// UpdatePhase is what a plan, pool, node or updater task is asked to do
// (spec.updatePhase). Empty means nothing.
//
// +kubebuilder:validation:Enum=updating;aborting
type UpdatePhase string

const (
	// PhaseUpdating asks for the update to run.
	PhaseUpdating UpdatePhase = "updating"
	// PhaseAborting asks for it to stop and leave the node consistent.
	PhaseAborting UpdatePhase = "aborting"
)

// UpdateStatus is where an update is (status.updateStatus).
//
//	          ┌──────────► updated
//	updating ─┼──────────► failed   (terminal: an updater gave up)
//	          └─► aborting ─► aborted
//
// +kubebuilder:validation:Enum=updating;updated;aborting;aborted;failed
type UpdateStatus string

const (
	StatusUpdating UpdateStatus = "updating"
	StatusUpdated  UpdateStatus = "updated"
	StatusAborting UpdateStatus = "aborting"
	StatusAborted  UpdateStatus = "aborted"
	// StatusFailed is an updater's terminal failure: the seed leaves it as
	// a TODO; in Drover an updater task reports it when retrying cannot
	// help, and health checks count the node unhealthy.
	StatusFailed UpdateStatus = "failed"
)

// Done reports whether s is an end state (updated, aborted or failed).
func (s UpdateStatus) Done() bool {
	return s == StatusUpdated || s == StatusAborted || s == StatusFailed
}

// Labels of the UpdaterUpdateTask contract and of the objects a plan runs
// on (the seed's cluster.x-k8s.io/* labels).
const (
	// LabelUpdateTaskName names the plan running on a pool, a node or a
	// task (the seed's update-task-name).
	LabelUpdateTaskName = "update.drover.io/update-task-name"
	// LabelPool names the node's pool on its tasks.
	LabelPool = "update.drover.io/pool-name"
	// LabelNode names the node a task works on.
	LabelNode = "update.drover.io/node-name"
	// LabelUpdater names the updater that owns a task.
	LabelUpdater = "update.drover.io/updater-name"
	// LabelRequest is on a plan made from an ExternalUpdateRequest: the
	// request's name.
	LabelRequest = "update.drover.io/request"
	// LabelPoolRevision is the pool revision a node is at: an updated node
	// moves from the old revision to the new (the seed's MachineSet swap).
	LabelPoolRevision = "update.drover.io/pool-revision"
)

// Condition types and reasons shared by the kinds.
const (
	// InPlaceUpdateCondition is on pools (aggregated from nodes) and on
	// FleetNodes (aggregated from updater tasks): True once updated, False
	// with the reason while updating, aborting, aborted or failed.
	InPlaceUpdateCondition = "InPlaceUpdate"
	// PreflightBlockedCondition (pool) is True while no node may be picked.
	PreflightBlockedCondition = "PreflightBlocked"
	// FailedCondition (plan) is True after an updater's terminal failure,
	// naming node, updater and reason.
	FailedCondition = "Failed"
	// HealthCheckSucceededCondition (FleetNode) is set by NodeHealthChecks.
	HealthCheckSucceededCondition = "HealthCheckSucceeded"
	// RemediationAllowedCondition (NodeHealthCheck).
	RemediationAllowedCondition = "RemediationAllowed"

	ReasonUpdating          = "Updating"
	ReasonUpdated           = "Updated"
	ReasonAborting          = "Aborting"
	ReasonAborted           = "Aborted"
	ReasonUpdaterFailed     = "UpdaterFailed"
	ReasonAbortTimeout      = "AbortTimeout"
	ReasonWaitingForPlan    = "WaitingForPlan"
	ReasonWaitingSequence   = "WaitingForSequence"
	ReasonNodeNotReady      = "NodeNotReady"
	ReasonNodeUnhealthy     = "NodeUnhealthy"
	ReasonOtherUpdate       = "OtherUpdateRunning"
	ReasonPreflightPassed   = "PreflightPassed"
	ReasonUpdateTimeout     = "InPlaceUpdateTimeout"
	ReasonConditionTimeout  = "UnhealthyCondition"
	ReasonInitializeTimeout = "InitializeTimeout"
	ReasonHealthy           = "Healthy"
	ReasonTooManyUnhealthy  = "TooManyUnhealthy"
	ReasonRemediationOK     = "WithinLimits"
	ReasonOverlappingPools  = "OverlappingPools"
	// Reasons of an ExternalUpdateRequest's Ready condition.
	ReasonWaitingForAnswers = "WaitingForAnswers"
	ReasonPlanned           = "Planned"
	ReasonNothingToUpdate   = "NothingToUpdate"
	ReasonUnclaimed         = "ChangeUnclaimed"
	ReasonClaimedTwice      = "ChangeClaimedTwice"
	ReasonUpdaterError      = "UpdaterError"
	ReasonAnswerTimeout     = "AnswerTimeout"
	ReasonSuperseded        = "Superseded"
	// ReasonDraining: the node waits for its running tasks before its
	// first updater starts.
	ReasonDraining = "Draining"
	// ReasonDrainTimeout: the tasks did not end within the pool's drain
	// timeout; the node's update failed and nothing was stopped.
	ReasonDrainTimeout = "DrainTimeout"
	// ReasonOutsideWindow: the pool has maintenance windows and none is
	// open; the message says when the next opens.
	ReasonOutsideWindow = "OutsideMaintenanceWindow"
	// ReasonInvalidWindow: a maintenance window cannot be parsed; nothing
	// starts until it is fixed.
	ReasonInvalidWindow = "InvalidMaintenanceWindow"
	// ReasonRolloutRate: the rollout rate allows no more starts this
	// minute.
	ReasonRolloutRate = "RolloutRateLimited"
	// ReasonAbortThreshold: the failed share of ended nodes reached the
	// rollout's abort threshold.
	ReasonAbortThreshold = "RolloutAbortThreshold"
)

// ObjectRef names an object of any kind (a template, a remediation
// template).
type ObjectRef struct {
	// apiVersion of the object, e.g. example.com/v1.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	APIVersion string `json:"apiVersion"`
	// kind of the object.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Kind string `json:"kind"`
	// name of the object.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// namespace of the object; empty for a cluster-scoped kind.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`
}
