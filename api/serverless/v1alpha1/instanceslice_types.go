package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Labels on the objects of this group.
const (
	// LabelApplication names the Application of an InstanceSlice or an
	// ApplicationSession.
	LabelApplication = "serverless.drover.io/application"
	// LabelNode names the node of an InstanceSlice.
	LabelNode = "serverless.drover.io/node"
	// FinalizerSession holds an ApplicationSession until its instance has
	// closed it (or its node is gone).
	FinalizerSession = "serverless.drover.io/session"
)

// InstanceState is where an instance is, as its agent reports it (the
// seed's pod states, and Idle).
type InstanceState string

const (
	InstancePending          InstanceState = "Pending" // not reported by the agent yet
	InstanceCreating         InstanceState = "Creating"
	InstanceLivenessChecking InstanceState = "LivenessChecking"
	InstanceStandby          InstanceState = "Standby"
	InstanceIdle             InstanceState = "Idle"
	InstanceActivating       InstanceState = "Activating"
	InstanceRunning          InstanceState = "Running"
	InstanceEvacuating       InstanceState = "Evacuating"
	InstanceTerminating      InstanceState = "Terminating"
	InstanceTerminated       InstanceState = "Terminated"
)

// SliceInstance is one instance the manager wants on the slice's node.
type SliceInstance struct {
	// name of the instance, unique in the Application.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// uid is the instance's work id on its agent (never reused).
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9._-]+$`
	UID string `json:"uid"`
	// standby: created standby (frozen once live), else active.
	// +optional
	Standby bool `json:"standby,omitempty"`
	// generation of the Application the instance was made from.
	// +optional
	Generation int64 `json:"generation,omitempty"`
	// created is when the manager added it.
	Created metav1.Time `json:"created"`
}

// InstanceStatus is an instance as its agent last reported it.
type InstanceStatus struct {
	Name  string        `json:"name"`
	State InstanceState `json:"state"`
	// port is the instance's host port.
	// +optional
	Port int32 `json:"port,omitempty"`
	// sessions bound to it (names of ApplicationSessions).
	// +optional
	Sessions []string `json:"sessions,omitempty"`
	// +optional
	Reason string `json:"reason,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
	// since is when it entered its state (idle: since when it has had no
	// session).
	// +optional
	Since *metav1.Time `json:"since,omitempty"`
}

// InstanceSliceSpec lists the instances of one Application the manager
// wants on one node.
type InstanceSliceSpec struct {
	// +kubebuilder:validation:MaxLength=253
	Application string `json:"application"`
	// +kubebuilder:validation:MaxLength=253
	NodeName string `json:"nodeName"`
	// +kubebuilder:validation:MaxItems=5000
	// +listType=map
	// +listMapKey=name
	// +optional
	Instances []SliceInstance `json:"instances,omitempty"`
}

// InstanceSliceStatus is what the node's hub last wrote of its instances
// (coalesced: at most one write per slice per interval).
type InstanceSliceStatus struct {
	// address of the node, for endpoints.
	// +optional
	Address string `json:"address,omitempty"`
	// +kubebuilder:validation:MaxItems=5000
	// +listType=map
	// +listMapKey=name
	// +optional
	Instances []InstanceStatus `json:"instances,omitempty"`
	// count of instances reported (not Terminated).
	// +optional
	Count int32 `json:"count,omitempty"`
	// standby instances among them.
	// +optional
	Standby int32 `json:"standby,omitempty"`
	// updateTime of this status.
	// +optional
	UpdateTime *metav1.Time `json:"updateTime,omitempty"`
}

// InstanceSlice is the instances of one Application on one node: the
// manager writes its spec, the node's hub its status. `drover get
// instances` lists them one instance per line.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=islice,categories=drover
// +kubebuilder:printcolumn:name="Application",type=string,JSONPath=`.spec.application`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Instances",type=integer,JSONPath=`.status.count`
// +kubebuilder:printcolumn:name="Standby",type=integer,JSONPath=`.status.standby`
// +kubebuilder:printcolumn:name="Updated",type=date,JSONPath=`.status.updateTime`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type InstanceSlice struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   InstanceSliceSpec   `json:"spec,omitempty"`
	Status InstanceSliceStatus `json:"status,omitempty"`
}

// InstanceSliceList is a list of InstanceSlices.
//
// +kubebuilder:object:root=true
type InstanceSliceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []InstanceSlice `json:"items"`
}
