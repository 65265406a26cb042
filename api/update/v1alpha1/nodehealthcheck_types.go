package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// UnhealthyCondition: a node whose condition type has status for longer
// than timeout is unhealthy.
type UnhealthyCondition struct {
	// type of the FleetNode condition, e.g. Ready.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=316
	Type string `json:"type"`
	// status that is unhealthy: True, False or Unknown.
	// +kubebuilder:validation:Enum=True;False;Unknown
	Status metav1.ConditionStatus `json:"status"`
	// timeout is how long the condition may have that status.
	Timeout metav1.Duration `json:"timeout"`
}

// RemediationAction is a built-in remediation.
//
// +kubebuilder:validation:Enum=RestartAgent;Reboot;MarkForReplacement
type RemediationAction string

const (
	RemediationRestartAgent       RemediationAction = "RestartAgent"
	RemediationReboot             RemediationAction = "Reboot"
	RemediationMarkForReplacement RemediationAction = "MarkForReplacement"
)

// Remediation says what is done to an unhealthy node: an external
// remediation template (a CR is made from it per node) or a built-in action.
//
// +kubebuilder:validation:XValidation:rule="has(self.templateRef) != has(self.action)",message="remediation takes exactly one of templateRef and action"
type Remediation struct {
	// templateRef names an external remediation template.
	// +optional
	TemplateRef *ObjectRef `json:"templateRef,omitempty"`
	// action is a built-in remediation.
	// +optional
	Action RemediationAction `json:"action,omitempty"`
}

// NodeHealthCheckSpec is what makes a node unhealthy and how many may be
// remediated.
//
// +kubebuilder:validation:XValidation:rule="!(has(self.maxUnhealthy) && has(self.unhealthyRange))",message="set maxUnhealthy or unhealthyRange, not both"
type NodeHealthCheckSpec struct {
	// selector picks the checked FleetNodes.
	Selector metav1.LabelSelector `json:"selector"`
	// unhealthyConditions make a node unhealthy when one holds longer than
	// its timeout.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	UnhealthyConditions []UnhealthyCondition `json:"unhealthyConditions,omitempty"`
	// maxUnhealthy: remediation stops while more nodes (a count, or a
	// percentage of the checked nodes rounded down) are unhealthy.
	// +optional
	// +kubebuilder:validation:XIntOrString
	MaxUnhealthy *intstr.IntOrString `json:"maxUnhealthy,omitempty"`
	// unhealthyRange "[min-max]": remediation runs only while the number
	// of unhealthy nodes is within it.
	// +optional
	// +kubebuilder:validation:Pattern=`^\[[0-9]+-[0-9]+\]$`
	// +kubebuilder:validation:MaxLength=32
	UnhealthyRange string `json:"unhealthyRange,omitempty"`
	// initializeTimeout: a node that has not been Ready since it was
	// created is unhealthy after this long. 0 disables it.
	// +optional
	InitializeTimeout *metav1.Duration `json:"initializeTimeout,omitempty"`
	// inPlaceUpdateTimeout: a node updating in place longer than this is
	// unhealthy; a node still initialising and updating gets
	// initializeTimeout + inPlaceUpdateTimeout. 0 disables it.
	// +optional
	InPlaceUpdateTimeout *metav1.Duration `json:"inPlaceUpdateTimeout,omitempty"`
	// remediation of unhealthy nodes; none means report only.
	// +optional
	Remediation *Remediation `json:"remediation,omitempty"`
}

// NodeHealthCheckStatus is the result of the last check.
type NodeHealthCheckStatus struct {
	// expectedNodes is how many nodes the selector picks.
	// +optional
	ExpectedNodes int32 `json:"expectedNodes"`
	// currentHealthy is how many are healthy and not updating.
	// +optional
	CurrentHealthy int32 `json:"currentHealthy"`
	// inUpdate is how many healthy nodes are updating in place: they count
	// against remediation.
	// +optional
	InUpdate int32 `json:"inUpdate"`
	// remediationsAllowed = maxAllowedUnhealthy − unhealthy − inUpdate.
	// +optional
	RemediationsAllowed int32 `json:"remediationsAllowed"`
	// unhealthyNodes: at most 32 names.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	UnhealthyNodes []string `json:"unhealthyNodes,omitempty"`
	// conditions: RemediationAllowed with why.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// observedGeneration is the generation last acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// NodeHealthCheck marks FleetNodes unhealthy, aware of in-place updates
// (Cluster API's MachineHealthCheck with the seed's additions).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=nhc,categories=drover
// +kubebuilder:printcolumn:name="Expected",type=integer,JSONPath=`.status.expectedNodes`
// +kubebuilder:printcolumn:name="Healthy",type=integer,JSONPath=`.status.currentHealthy`
// +kubebuilder:printcolumn:name="In-Update",type=integer,JSONPath=`.status.inUpdate`
// +kubebuilder:printcolumn:name="Remediations",type=integer,JSONPath=`.status.remediationsAllowed`
// +kubebuilder:printcolumn:name="Why",type=string,JSONPath=`.status.conditions[?(@.type=="RemediationAllowed")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NodeHealthCheck struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec NodeHealthCheckSpec `json:"spec"`
	// +optional
	Status NodeHealthCheckStatus `json:"status,omitempty"`
}

// NodeHealthCheckList is a list of NodeHealthChecks.
//
// +kubebuilder:object:root=true
type NodeHealthCheckList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeHealthCheck `json:"items"`
}
