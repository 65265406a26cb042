package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TaskState is where a task's current attempt is.
// +kubebuilder:validation:Enum=Pending;Scheduled;Dispatching;Running;Completed;Failed
type TaskState string

const (
	// TaskPending: waiting for a node (or for its restart backoff to pass).
	TaskPending TaskState = "Pending"
	// TaskScheduled: the manager chose status.nodeName; a hub will send it.
	TaskScheduled TaskState = "Scheduled"
	// TaskDispatching: the hub sent it; the agent has not started it yet.
	TaskDispatching TaskState = "Dispatching"
	// TaskRunning: the agent started the process.
	TaskRunning TaskState = "Running"
	// TaskCompleted: the process exited 0. Final.
	TaskCompleted TaskState = "Completed"
	// TaskFailed: the last attempt failed and no other will be made. Final.
	TaskFailed TaskState = "Failed"
)

// Final reports whether a task in state s will not change any more.
func (s TaskState) Final() bool { return s == TaskCompleted || s == TaskFailed }

// Holds reports whether a task in state s holds resources on its node.
func (s TaskState) Holds() bool {
	return s == TaskScheduled || s == TaskDispatching || s == TaskRunning
}

// RestartPolicy says whether a failed attempt is followed by another.
// +kubebuilder:validation:Enum=Never;OnFailure
type RestartPolicy string

const (
	RestartNever     RestartPolicy = "Never"
	RestartOnFailure RestartPolicy = "OnFailure"
)

// ReschedulePolicy says what happens to a task whose node goes Offline.
// +kubebuilder:validation:Enum=Never;OnNodeLost
type ReschedulePolicy string

const (
	// RescheduleNever fails the task with reason NodeLost.
	RescheduleNever ReschedulePolicy = "Never"
	// RescheduleOnNodeLost starts a new attempt on another node.
	RescheduleOnNodeLost ReschedulePolicy = "OnNodeLost"
)

// Reasons in Task status and Events.
const (
	ReasonUnschedulable = "Unschedulable"
	ReasonScheduled     = "Scheduled"
	ReasonNodeLost      = "NodeLost"
	ReasonTimeout       = "timeout"
	ReasonBackoff       = "BackOff"
	ReasonCancelled     = "Cancelled"
	ReasonAttemptsSpent = "AttemptsExhausted"
	// ReasonDeadlineExceeded: a group ran past its activeDeadlineSeconds.
	ReasonDeadlineExceeded = "DeadlineExceeded"
	// ReasonInsufficientNodes: a task fits on no node only because each
	// node that could take it holds maxPerNode of its group's tasks.
	ReasonInsufficientNodes = "InsufficientNodes"
	// ReasonInvalidResources: a task asks for a resource whose name or
	// quantity is not valid; it cannot be placed until its spec is fixed.
	ReasonInvalidResources = "InvalidResources"
)

// EnvVar is one environment variable of a task's process.
type EnvVar struct {
	// +kubebuilder:validation:Pattern=`^[A-Za-z_][A-Za-z0-9_]*$`
	// +kubebuilder:validation:MaxLength=256
	Name string `json:"name"`
	// +kubebuilder:validation:MaxLength=32768
	// +kubebuilder:validation:Pattern=`^[^\x00]*$`
	// +optional
	Value string `json:"value,omitempty"`
}

// Artifact is a file fetched into the task's working directory before the
// process starts, and checked against its digest.
type Artifact struct {
	// url to fetch (http or https).
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^https?://[A-Za-z0-9._~:/?#\[\]@!&()*+,=%-]+$`
	URL string `json:"url"`
	// sha256 of the file, 64 lowercase hex digits.
	// +kubebuilder:validation:Pattern=`^[a-f0-9]{64}$`
	SHA256 string `json:"sha256"`
	// path of the file, relative to the task's working directory. No part
	// of it may start with a dot, so it cannot climb out with "..".
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_-][A-Za-z0-9._-]*(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*$`
	Path string `json:"path"`
	// executable sets the file's mode to 0755.
	// +optional
	Executable bool `json:"executable,omitempty"`
}

// PreferredNodeTerm weighs the nodes its selector matches.
type PreferredNodeTerm struct {
	// weight added to a node the selector matches, 1 to 100.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	Weight int32 `json:"weight"`
	// selector of node labels.
	Selector metav1.LabelSelector `json:"selector"`
}

// SpreadConstraint spreads the tasks of one TaskGroup over nodes.
type SpreadConstraint struct {
	// topologyKey is a node label; tasks are spread over its values. Empty:
	// over nodes.
	// +kubebuilder:validation:MaxLength=316
	// +optional
	TopologyKey string `json:"topologyKey,omitempty"`
	// maxSkew is how many more of the group's tasks one domain may hold than
	// the emptiest eligible one.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:default=1
	// +optional
	MaxSkew int32 `json:"maxSkew,omitempty"`
}

// TaskSecurityContext is who a task's process runs as on its node.
type TaskSecurityContext struct {
	// runAsUser is the uid of the process. 0 (root) only where a NodeGrant
	// allows it.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4294967294
	// +optional
	RunAsUser *int64 `json:"runAsUser,omitempty"`
	// runAsGroup is the gid of the process (and its only group). Unset: the
	// node task user's group when runAsUser is unset too, else runAsUser.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4294967294
	// +optional
	RunAsGroup *int64 `json:"runAsGroup,omitempty"`
}

// Drivers of a task (TaskSpec.Driver).
const (
	// DriverExec runs the task as a process on the node.
	DriverExec = "exec"
	// DriverContainerd runs it as a container of the node's containerd
	// (docs/containers.md).
	DriverContainerd = "containerd"
)

// TaskSpec is what to run, and where and how often to try.
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.nodeName) || size(oldSelf.nodeName) == 0 || (has(self.nodeName) && self.nodeName == oldSelf.nodeName)",message="nodeName cannot be changed once set"
// +kubebuilder:validation:XValidation:rule="(has(self.driver) && self.driver == 'containerd') == (has(self.image) && size(self.image) > 0)",message="image is required with driver containerd, and only with it",fieldPath=".image"
// +kubebuilder:validation:XValidation:rule="(has(self.driver) && self.driver == 'containerd') || (has(self.command) && size(self.command) > 0)",message="command is required with driver exec",fieldPath=".command"
// +kubebuilder:validation:XValidation:rule="!(has(self.driver) && self.driver == 'containerd') || !has(self.artifacts) || size(self.artifacts) == 0",message="artifacts are not supported with driver containerd (put the files in the image)"
// +kubebuilder:validation:XValidation:rule="!(has(self.driver) && self.driver == 'containerd') || !has(self.workingDir) || self.workingDir.startsWith('/')",message="with driver containerd, workingDir is an absolute dir inside the container"
type TaskSpec struct {
	// driver runs the task: exec, a process on the node (the default), or
	// containerd, a container of the node's containerd made from image
	// (docs/containers.md).
	// +kubebuilder:validation:Enum=exec;containerd
	// +kubebuilder:default=exec
	// +optional
	Driver string `json:"driver,omitempty"`
	// image is the container image of a containerd task, pre-pulled on
	// the node (ImagePrePullJob) or imported into containerd's namespace
	// drover. Required with driver containerd, refused without.
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][A-Za-z0-9._/:@-]*$`
	// +optional
	Image string `json:"image,omitempty"`
	// command is the argv of the process; command[0] is a path or a name
	// looked up in the agent's PATH. Never run through a shell. Required
	// with driver exec; with driver containerd, optional: when set it
	// replaces the image's entrypoint and cmd.
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=4096
	// +kubebuilder:validation:items:Pattern=`^[^\x00]*$`
	// +kubebuilder:validation:XValidation:rule="size(self) == 0 || self[0].size() > 0",message="command[0] must name a program"
	// +optional
	Command []string `json:"command,omitempty"`
	// env of the process, added to a minimal environment (PATH, HOME).
	// +kubebuilder:validation:MaxItems=128
	// +listType=map
	// +listMapKey=name
	// +optional
	Env []EnvVar `json:"env,omitempty"`
	// workingDir is where the process starts. Unset or relative: inside
	// the attempt's own fresh directory (relative paths may not leave it).
	// Absolute: a directory on the node, allowed only when a NodeGrant of
	// the namespace lists it (or a parent) in its hostDirs.
	// +kubebuilder:validation:MaxLength=4096
	// +kubebuilder:validation:Pattern=`^[^\x00\n]*$`
	// +kubebuilder:validation:XValidation:rule="self.startsWith('/') || !(self == '..' || self.startsWith('../') || self.endsWith('/..') || self.contains('/../'))",message="a relative workingDir stays inside the attempt's directory: no '..' segments"
	// +optional
	WorkingDir string `json:"workingDir,omitempty"`
	// securityContext is the user and group the process runs as. Unset:
	// the node's unprivileged task user (drover-agent --task-user, default
	// nobody). A NodeGrant of the namespace must allow what is asked.
	// +optional
	SecurityContext *TaskSecurityContext `json:"securityContext,omitempty"`
	// artifacts are fetched and checked before the process starts.
	// +kubebuilder:validation:MaxItems=32
	// +optional
	Artifacts []Artifact `json:"artifacts,omitempty"`
	// resources the task holds on its node while scheduled or running,
	// counted against the node's reported capacity: cpu, memory,
	// ephemeral-storage, gpu, or a domain-prefixed extended resource
	// (example.com/fpga). Other names are refused, as a Pod's are.
	// +optional
	Resources corev1.ResourceList `json:"resources,omitempty"`
	// timeout of one attempt; then SIGTERM to its process group, and
	// SIGKILL after killTimeout. Unset: no limit. A Go duration ("90s",
	// "1h30m"), from 1s to a year.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]*)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('8760h')",message="timeout must be a duration such as 90s or 1h30m (units ns, us, ms, s, m, h), from 1s to 8760h (a year)"
	// +optional
	Timeout *metav1.Duration `json:"timeout,omitempty"`
	// killTimeout is the grace between SIGTERM and SIGKILL. Default 10s;
	// from 1s to 1h.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]*)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('1h')",message="killTimeout must be a duration such as 10s (units ns, us, ms, s, m, h), from 1s to 1h"
	// +optional
	KillTimeout *metav1.Duration `json:"killTimeout,omitempty"`
	// nodeSelector chooses eligible nodes by their labels (the seed's
	// robotSelector). Unset: every node.
	// +optional
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
	// nodeName pins the task to one node; the scheduler then only checks it.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	NodeName string `json:"nodeName,omitempty"`
	// spread of the group's tasks over nodes or a node label.
	// +optional
	Spread *SpreadConstraint `json:"spread,omitempty"`
	// maxPerNode bounds how many of the group's tasks one node holds at
	// once (scheduled, dispatching or running): with fewer eligible nodes
	// than tasks, the rest stay Pending, reason InsufficientNodes. Unset:
	// no bound. A task of no TaskGroup is alone, so it always fits.
	// +kubebuilder:validation:Minimum=1
	// +optional
	MaxPerNode *int32 `json:"maxPerNode,omitempty"`
	// preferredNodes is soft node affinity (kube-scheduler's
	// preferredDuringSchedulingIgnoredDuringExecution): among the nodes
	// that fit, the one whose matching terms weigh most wins; then the
	// least loaded. A node matching none still fits.
	// +kubebuilder:validation:MaxItems=16
	// +optional
	PreferredNodes []PreferredNodeTerm `json:"preferredNodes,omitempty"`
	// schedulingGates keep the task Pending and unplaced while any is
	// listed, as a Pod's do; each is removed by whoever set it. A
	// multi-task group sets WaitingForInit on the tasks that wait for an
	// init task, and removes it when their turn comes.
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MaxLength=63
	// +optional
	SchedulingGates []string `json:"schedulingGates,omitempty"`
	// priority orders scheduling: higher first, then older first.
	// +optional
	Priority int32 `json:"priority,omitempty"`
	// restartPolicy after a failed attempt. Unset: the FleetJob's, else
	// Never. (No schema default, so a job's policy can fill it in.)
	// +optional
	RestartPolicy RestartPolicy `json:"restartPolicy,omitempty"`
	// reschedulePolicy when the node goes Offline. Unset: the FleetJob's,
	// else OnNodeLost.
	// +optional
	ReschedulePolicy ReschedulePolicy `json:"reschedulePolicy,omitempty"`
	// maxAttempts bounds the attempts, restarts and reschedules together.
	// Default 3.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +kubebuilder:default=3
	// +optional
	MaxAttempts int32 `json:"maxAttempts,omitempty"`
	// backoff before the first restart; it doubles for each later one, up
	// to 5 minutes. Default 10s.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]*)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('0s')",message="backoff must be a duration such as 10s or 1m (units ns, us, ms, s, m, h), not negative"
	// +optional
	Backoff *metav1.Duration `json:"backoff,omitempty"`
}

// TaskAttempt records one attempt of a task.
type TaskAttempt struct {
	Attempt int32  `json:"attempt"`
	Node    string `json:"node,omitempty"`
	// +optional
	State TaskState `json:"state,omitempty"`
	// +optional
	Reason string `json:"reason,omitempty"`
	// +optional
	ExitCode *int32 `json:"exitCode,omitempty"`
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// +optional
	FinishTime *metav1.Time `json:"finishTime,omitempty"`
	// outputTail is the attempt's status.outputTail when it ended, kept
	// on the latest entry only (`drover logs --previous`).
	// +kubebuilder:validation:MaxLength=8192
	// +optional
	OutputTail string `json:"outputTail,omitempty"`
}

// TaskStatus is the state of the task's current attempt and its history.
type TaskStatus struct {
	// +optional
	State TaskState `json:"state,omitempty"`
	// reason is a CamelCase word or "timeout"; message says more.
	// +optional
	Reason string `json:"reason,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
	// attempt counts from 1; each has its own work id on the agent.
	// +optional
	Attempt int32 `json:"attempt,omitempty"`
	// nodeName is where the current attempt runs.
	// +optional
	NodeName string `json:"nodeName,omitempty"`
	// +optional
	ExitCode *int32 `json:"exitCode,omitempty"`
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// +optional
	FinishTime *metav1.Time `json:"finishTime,omitempty"`
	// nextAttemptTime is when a restart waiting out its backoff may start.
	// +optional
	NextAttemptTime *metav1.Time `json:"nextAttemptTime,omitempty"`
	// history of earlier attempts, oldest first (the last 20).
	// +kubebuilder:validation:MaxItems=20
	// +optional
	History []TaskAttempt `json:"history,omitempty"`
	// outputTail is the end of the attempt's output (stdout then stderr),
	// at most 4 KiB. `drover logs` shows all of it.
	// +kubebuilder:validation:MaxLength=8192
	// +optional
	OutputTail string `json:"outputTail,omitempty"`
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Task runs one program on one node (K8s4r's Task).
// +kubebuilder:object:root=true
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.status) || !has(oldSelf.status.state) || oldSelf.status.state == 'Pending' || self.spec == oldSelf.spec",messageExpression="'spec cannot change once the task is ' + oldSelf.status.state + ' (the attempt on the node runs the spec it was sent): delete the Task and create it again, or edit its TaskGroup template for new tasks'",reason=FieldValueForbidden
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=tk,categories=drover
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.nodeName`
// +kubebuilder:printcolumn:name="Attempt",type=integer,JSONPath=`.status.attempt`
// +kubebuilder:printcolumn:name="Exit",type=integer,JSONPath=`.status.exitCode`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Started",type=date,JSONPath=`.status.startTime`,priority=1
// +kubebuilder:printcolumn:name="Group",type=string,JSONPath=`.metadata.labels.batch\.drover\.io/taskgroup`,priority=1
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.message`,priority=1
type Task struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   TaskSpec   `json:"spec"`
	Status TaskStatus `json:"status,omitempty"`
}

// TaskList is a list of Tasks.
// +kubebuilder:object:root=true
type TaskList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Task `json:"items"`
}
