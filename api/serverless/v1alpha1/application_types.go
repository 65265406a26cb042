package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
)

// Modes of an Application.
const (
	// ModeSessions: instances serve sessions; standby instances wait,
	// frozen, for the next session (the default).
	ModeSessions = "sessions"
	// ModeDaemon: instances always run and serve no sessions (the seed's
	// "work as a daemon"): minInstances of them, replaced when lost.
	ModeDaemon = "daemon"
)

// Runtimes of an Application.
const (
	// RuntimeProcess runs an instance as a process of the node (argv and
	// artifacts), in its own cgroup, as an unprivileged user.
	RuntimeProcess = "process"
	// RuntimeContainer runs an instance as a container of the node's
	// containerd. Not served yet: the agent refuses such instances with
	// reason RuntimeUnavailable.
	RuntimeContainer = "container"
)

// Probe checks an instance: exactly one of exec, tcp and httpGet.
// +kubebuilder:validation:XValidation:rule="(has(self.exec) ? 1 : 0) + (has(self.tcp) && self.tcp ? 1 : 0) + (has(self.httpGet) ? 1 : 0) == 1",message="a probe has exactly one of exec, tcp and httpGet"
type Probe struct {
	// exec is an argv run in the instance's directory, as its user and in
	// its cgroup, never through a shell; exit 0 passes.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=4096
	// +kubebuilder:validation:items:Pattern=`^[^\x00]*$`
	// +kubebuilder:validation:XValidation:rule="self[0].size() > 0",message="exec[0] must name a program"
	// +optional
	Exec []string `json:"exec,omitempty"`
	// tcp: a connection to the instance's port passes.
	// +optional
	TCP bool `json:"tcp,omitempty"`
	// httpGet: GET http://127.0.0.1:<instance port><path> answering 2xx or
	// 3xx passes.
	// +optional
	HTTPGet *HTTPGetProbe `json:"httpGet,omitempty"`
	// timeoutSeconds bounds one try. Default 1.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=60
	// +kubebuilder:default=1
	// +optional
	TimeoutSeconds int32 `json:"timeoutSeconds,omitempty"`
}

// HTTPGetProbe is the path of an HTTP probe.
type HTTPGetProbe struct {
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^/[A-Za-z0-9._~:/?#\[\]@!$&'()*+,;=%-]*$`
	Path string `json:"path"`
}

// Port is a port every instance listens on. The agent gives each instance
// its own host port (DROVER_PORT), so the instances of a node never collide;
// the session's endpoint names it.
type Port struct {
	// name of the port, as endpoints show it.
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?$`
	Name string `json:"name"`
	// protocol of the port: TCP (default) or UDP.
	// +kubebuilder:validation:Enum=TCP;UDP
	// +kubebuilder:default=TCP
	// +optional
	Protocol string `json:"protocol,omitempty"`
}

// Scaling says how many instances an Application keeps, and how fast it
// makes more. Defaults are the seed's.
//
// The rules read unset fields as their defaults: the API server checks
// them against the default {} of spec.scaling too, before its fields'
// defaults are applied.
// +kubebuilder:validation:XValidation:rule="(has(self.minInstances) ? self.minInstances : 0) <= (has(self.maxInstances) ? self.maxInstances : 10)",message="minInstances must not be above maxInstances"
// +kubebuilder:validation:XValidation:rule="(has(self.standbyInstances) ? self.standbyInstances : 1) <= (has(self.maxInstances) ? self.maxInstances : 10)",message="standbyInstances must not be above maxInstances"
type Scaling struct {
	// minInstances always exist (standby, idle or serving). Default 0.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	// +kubebuilder:default=0
	// +optional
	MinInstances int32 `json:"minInstances,omitempty"`
	// maxInstances never are exceeded. Default 10.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +kubebuilder:default=10
	// +optional
	MaxInstances int32 `json:"maxInstances,omitempty"`
	// standbyInstances are kept started, live and frozen, ready for the
	// next session (the warm pool). Default 1; 0 keeps no pool (every
	// session opens cold). Read it with Standby().
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	// +kubebuilder:default=1
	// +optional
	StandbyInstances *int32 `json:"standbyInstances,omitempty"`
	// burst is how many instances are created at once. Default 2.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	// +kubebuilder:default=2
	// +optional
	Burst int32 `json:"burst,omitempty"`
	// sessionsPerInstance is how many sessions one instance serves at a
	// time. Default 1.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	// +kubebuilder:default=1
	// +optional
	SessionsPerInstance int32 `json:"sessionsPerInstance,omitempty"`
	// idleInstanceTimeout: an instance without sessions for this long is
	// removed (keeping minInstances and the standby pool). Default 5m.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]*)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('720h')",message="idleInstanceTimeout must be a duration such as 5m, from 1s to 720h"
	// +kubebuilder:default="5m"
	// +optional
	IdleInstanceTimeout metav1.Duration `json:"idleInstanceTimeout,omitzero"`
}

// Standby is standbyInstances, 1 when unset.
func (s Scaling) Standby() int32 {
	if s.StandbyInstances == nil {
		return 1
	}
	return *s.StandbyInstances
}

// SessionPolicy bounds the sessions of an Application. Defaults are the
// seed's.
type SessionPolicy struct {
	// openTimeout: a session whose instance has not called SessionReady
	// this long after it was bound is closed (reason OpenTimeout). Default 10s.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]*)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('100ms') && duration(self) <= duration('1h')",message="openTimeout must be a duration such as 10s, from 100ms to 1h"
	// +kubebuilder:default="10s"
	// +optional
	OpenTimeout metav1.Duration `json:"openTimeout,omitzero"`
	// heartbeatInterval is how often an instance's SDK beats for each
	// session. Default 5s.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]*)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('100ms') && duration(self) <= duration('1h')",message="heartbeatInterval must be a duration such as 5s, from 100ms to 1h"
	// +kubebuilder:default="5s"
	// +optional
	HeartbeatInterval metav1.Duration `json:"heartbeatInterval,omitzero"`
	// heartbeatMisses: after this many intervals without a beat the
	// session is flagged (status.flagged). Default 3.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +kubebuilder:default=3
	// +optional
	HeartbeatMisses int32 `json:"heartbeatMisses,omitempty"`
	// onHeartbeatLost: Close (default) closes a flagged session once it
	// has stayed flagged for openTimeout; Flag only flags it.
	// +kubebuilder:validation:Enum=Close;Flag
	// +kubebuilder:default=Close
	// +optional
	OnHeartbeatLost string `json:"onHeartbeatLost,omitempty"`
	// evacuationTimeout bounds a session's Evacuating (its clients are
	// told to leave) before it is terminated. Default 30s.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]*)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('1h')",message="evacuationTimeout must be a duration such as 30s, from 1s to 1h"
	// +kubebuilder:default="30s"
	// +optional
	EvacuationTimeout metav1.Duration `json:"evacuationTimeout,omitzero"`
}

// ApplicationSpec is how an instance runs, where, and how many.
// +kubebuilder:validation:XValidation:rule="(has(self.runtime) && self.runtime != 'process') || (has(self.command) && size(self.command) > 0)",message="command is required with runtime process",fieldPath=".command"
// +kubebuilder:validation:XValidation:rule="(has(self.runtime) && self.runtime == 'container') == (has(self.image) && size(self.image) > 0)",message="image is required with runtime container, and only with it",fieldPath=".image"
// +kubebuilder:validation:XValidation:rule="!has(self.mode) || self.mode != 'daemon' || (has(self.scaling) && has(self.scaling.minInstances) && self.scaling.minInstances >= 1)",message="a daemon application needs scaling.minInstances of at least 1"
type ApplicationSpec struct {
	// mode: sessions (default) or daemon (instances always running, no
	// sessions).
	// +kubebuilder:validation:Enum=sessions;daemon
	// +kubebuilder:default=sessions
	// +optional
	Mode string `json:"mode,omitempty"`
	// runtime: process (default) or container.
	// +kubebuilder:validation:Enum=process;container
	// +kubebuilder:default=process
	// +optional
	Runtime string `json:"runtime,omitempty"`
	// image of a container instance.
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][A-Za-z0-9._/:@-]*$`
	// +optional
	Image string `json:"image,omitempty"`
	// command is the argv of an instance; command[0] is a path or a name
	// in the agent's PATH. Never run through a shell.
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=4096
	// +kubebuilder:validation:items:Pattern=`^[^\x00]*$`
	// +kubebuilder:validation:XValidation:rule="size(self) == 0 || self[0].size() > 0",message="command[0] must name a program"
	// +optional
	Command []string `json:"command,omitempty"`
	// artifacts are fetched into each instance's directory and checked
	// against their sha256 before it starts.
	// +kubebuilder:validation:MaxItems=32
	// +optional
	Artifacts []batchv1.Artifact `json:"artifacts,omitempty"`
	// env of an instance, added to a minimal environment and Drover's
	// (DROVER_PORT, DROVER_SESSION_SOCKET, DROVER_SESSION_FILE).
	// +kubebuilder:validation:MaxItems=128
	// +listType=map
	// +listMapKey=name
	// +optional
	Env []batchv1.EnvVar `json:"env,omitempty"`
	// config is data every instance finds in its session metadata file.
	// +kubebuilder:validation:MaxProperties=64
	// +optional
	Config map[string]string `json:"config,omitempty"`
	// securityContext is who the instances run as. Unset: the node's
	// unprivileged task user. A NodeGrant must allow what is asked.
	// +optional
	SecurityContext *batchv1.TaskSecurityContext `json:"securityContext,omitempty"`
	// resources one instance holds on its node (cpu and memory also set
	// its cgroup's limits), counted against the node's capacity.
	// +optional
	Resources corev1.ResourceList `json:"resources,omitempty"`
	// ports the instances listen on. One for now: the agent assigns each
	// instance its own host port for it.
	// +kubebuilder:validation:MaxItems=1
	// +listType=map
	// +listMapKey=name
	// +optional
	Ports []Port `json:"ports,omitempty"`
	// livenessProbe must pass before an instance is standby or serves.
	// Unset: the process running is enough.
	// +optional
	LivenessProbe *Probe `json:"livenessProbe,omitempty"`
	// readinessProbe is checked with liveness before an instance is live.
	// +optional
	ReadinessProbe *Probe `json:"readinessProbe,omitempty"`
	// nodeSelector picks the nodes (FleetNodes, by label) instances may run
	// on; only nodes granted to the namespace (NodeGrant) are considered.
	// +optional
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
	// scaling: how many instances, and how fast.
	// +kubebuilder:default={}
	// +optional
	Scaling Scaling `json:"scaling,omitzero"`
	// session bounds the sessions.
	// +kubebuilder:default={}
	// +optional
	Session SessionPolicy `json:"session,omitzero"`
}

// InstanceCounts counts an Application's instances by state.
type InstanceCounts struct {
	// total instances held (every state but terminated).
	Total int32 `json:"total"`
	// creating: starting or checking liveness.
	Creating int32 `json:"creating"`
	// standby: live and frozen, waiting for a session.
	Standby int32 `json:"standby"`
	// idle: live, thawed, without a session.
	Idle int32 `json:"idle"`
	// serving: activating or running sessions (daemon: running).
	Serving int32 `json:"serving"`
	// terminating: evacuating or stopping.
	Terminating int32 `json:"terminating"`
}

// SessionCounts counts an Application's sessions by phase.
type SessionCounts struct {
	// pending: not bound to an instance yet.
	Pending int32 `json:"pending"`
	// starting: bound, not ready yet (Starting, ReadinessChecking).
	Starting int32 `json:"starting"`
	// open: Ready or Live.
	Open int32 `json:"open"`
	// closing: Evacuating or Terminating.
	Closing int32 `json:"closing"`
	// terminated: ended (objects not deleted yet).
	Terminated int32 `json:"terminated"`
}

// Condition types of an Application.
const (
	// ConditionReady: as many instances as the scaling asks for are held.
	ConditionReady = "Ready"
	// ConditionSchedulable false: instances wanted cannot be placed (no
	// granted, ready node with room); the reason and message say why.
	ConditionSchedulable = "Schedulable"
)

// ApplicationStatus is what the manager observed.
type ApplicationStatus struct {
	// observedGeneration is the spec generation this status is of.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// instances by state, summed over the Application's InstanceSlices.
	// +optional
	Instances InstanceCounts `json:"instances"`
	// sessions by phase.
	// +optional
	Sessions SessionCounts `json:"sessions"`
	// nodes holding instances.
	// +optional
	Nodes int32 `json:"nodes"`
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Application is how an instance runs and how many the fleet keeps, for
// sessions or as a daemon.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=app,categories=drover
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.spec.mode`
// +kubebuilder:printcolumn:name="Instances",type=integer,JSONPath=`.status.instances.total`
// +kubebuilder:printcolumn:name="Standby",type=integer,JSONPath=`.status.instances.standby`
// +kubebuilder:printcolumn:name="Serving",type=integer,JSONPath=`.status.instances.serving`
// +kubebuilder:printcolumn:name="Sessions",type=integer,JSONPath=`.status.sessions.open`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.status.nodes`,priority=1
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
type Application struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ApplicationSpec   `json:"spec,omitempty"`
	Status ApplicationStatus `json:"status,omitempty"`
}

// ApplicationList is a list of Applications.
//
// +kubebuilder:object:root=true
type ApplicationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Application `json:"items"`
}
