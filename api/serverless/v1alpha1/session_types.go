package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SessionPhase is where a session is in the seed's lifecycle.
// +kubebuilder:validation:Enum=Pending;Starting;ReadinessChecking;Ready;Live;Evacuating;Terminating;Terminated
type SessionPhase string

const (
	// SessionPending: not bound to an instance yet.
	SessionPending SessionPhase = "Pending"
	// SessionStarting: bound; the instance is being made ready (thawed,
	// created) and sent SessionStart.
	SessionStarting SessionPhase = "Starting"
	// SessionReadinessChecking: the instance was sent SessionStart and has
	// not called SessionReady yet.
	SessionReadinessChecking SessionPhase = "ReadinessChecking"
	// SessionReady: the instance called SessionReady; clients may connect
	// to status.endpoint.
	SessionReady SessionPhase = "Ready"
	// SessionLive: a client joined.
	SessionLive SessionPhase = "Live"
	// SessionEvacuating: closing, its clients are told to leave.
	SessionEvacuating SessionPhase = "Evacuating"
	// SessionTerminating: the instance was told to close the session.
	SessionTerminating SessionPhase = "Terminating"
	// SessionTerminated: ended. Final; status.reason says why.
	SessionTerminated SessionPhase = "Terminated"
)

// Final reports whether a session in phase p will not change any more.
func (p SessionPhase) Final() bool { return p == SessionTerminated }

// Open reports whether clients may use a session in phase p.
func (p SessionPhase) Open() bool { return p == SessionReady || p == SessionLive }

// Reasons of a session's status (and Events).
const (
	ReasonClosed              = "Closed"
	ReasonClosedByInstance    = "ClosedByInstance"
	ReasonOpenTimeout         = "OpenTimeout"
	ReasonInstanceCrashed     = "InstanceCrashed"
	ReasonInstanceGone        = "InstanceGone"
	ReasonNodeLost            = "NodeLost"
	ReasonNoCapacity          = "NoCapacity"
	ReasonApplicationNotFound = "ApplicationNotFound"
	ReasonApplicationIsDaemon = "ApplicationIsDaemon"
	ReasonHeartbeatLost       = "HeartbeatLost"
	ReasonEvacuationTimeout   = "EvacuationTimeout"
	ReasonBound               = "Bound"
)

// ApplicationSessionSpec is one customer's session of an Application.
// +kubebuilder:validation:XValidation:rule="self.application == oldSelf.application",message="application cannot be changed"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.instanceName) || size(oldSelf.instanceName) == 0 || (has(self.instanceName) && self.instanceName == oldSelf.instanceName)",message="instanceName cannot be changed once set"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.nodeName) || size(oldSelf.nodeName) == 0 || (has(self.nodeName) && self.nodeName == oldSelf.nodeName)",message="nodeName cannot be changed once set"
// +kubebuilder:validation:XValidation:rule="(has(self.instanceName) && size(self.instanceName) > 0) == (has(self.nodeName) && size(self.nodeName) > 0)",message="instanceName and nodeName are set together (by the manager, when it binds the session)"
type ApplicationSessionSpec struct {
	// application is the name of the Application, in the same namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	Application string `json:"application"`
	// data is the customer's session data, given to the instance with
	// SessionStart and in its session metadata file.
	// +kubebuilder:validation:MaxProperties=64
	// +optional
	Data map[string]string `json:"data,omitempty"`
	// openTimeout overrides the Application's session.openTimeout.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]*)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('100ms') && duration(self) <= duration('1h')",message="openTimeout must be a duration such as 10s, from 100ms to 1h"
	// +optional
	OpenTimeout *metav1.Duration `json:"openTimeout,omitempty"`
	// instanceName is the instance the session is bound to, set by the
	// manager (or the session API) when it binds; set once.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	InstanceName string `json:"instanceName,omitempty"`
	// nodeName is the node of instanceName, set with it.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	NodeName string `json:"nodeName,omitempty"`
}

// Endpoint is where a session's clients connect.
type Endpoint struct {
	// host is the node's address.
	Host string `json:"host"`
	// port is the instance's host port.
	Port int32 `json:"port"`
	// name of the Application's port.
	// +optional
	Name string `json:"name,omitempty"`
}

// ApplicationSessionStatus is what the hub of the session's node reports.
type ApplicationSessionStatus struct {
	// +optional
	Phase SessionPhase `json:"phase,omitempty"`
	// reason is one word: why the session is in its phase.
	// +optional
	Reason string `json:"reason,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
	// endpoint clients connect to, once Ready.
	// +optional
	Endpoint *Endpoint `json:"endpoint,omitempty"`
	// clients joined (reported by the instance).
	// +kubebuilder:validation:MaxItems=256
	// +optional
	Clients []string `json:"clients,omitempty"`
	// flagged: the instance's heartbeats for the session stopped.
	// +optional
	Flagged bool `json:"flagged,omitempty"`
	// boundTime is when the session was bound to its instance.
	// +optional
	BoundTime *metav1.Time `json:"boundTime,omitempty"`
	// readyTime is when the instance called SessionReady.
	// +optional
	ReadyTime *metav1.Time `json:"readyTime,omitempty"`
	// closeTime is when it was Terminated.
	// +optional
	CloseTime *metav1.Time `json:"closeTime,omitempty"`
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ApplicationSession is one customer's session, served by one instance of
// an Application.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=sess,categories=drover
// +kubebuilder:printcolumn:name="Application",type=string,JSONPath=`.spec.application`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Host",type=string,JSONPath=`.status.endpoint.host`
// +kubebuilder:printcolumn:name="Port",type=integer,JSONPath=`.status.endpoint.port`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Instance",type=string,JSONPath=`.spec.instanceName`,priority=1
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.message`,priority=1
type ApplicationSession struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ApplicationSessionSpec   `json:"spec,omitempty"`
	Status ApplicationSessionStatus `json:"status,omitempty"`
}

// ApplicationSessionList is a list of ApplicationSessions.
//
// +kubebuilder:object:root=true
type ApplicationSessionList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ApplicationSession `json:"items"`
}
