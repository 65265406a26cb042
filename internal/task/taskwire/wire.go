// Package taskwire is the contract between hubs and agents for tasks
// (batch.drover.io): the work item spec a hub dispatches and the report an
// agent sends back. It imports nothing from k8s.io, because drover-agent
// links it.
//
// Attempt n of a Task reaches its node as an agentv1.WorkItem with Type
// TypeExec, uid = WorkID(task uid, n) (so an attempt is never run twice: an
// agent applies a uid once), and Spec = the JSON of Spec. The agent reports
// with agentv1.WorkStatus: Phase one of the Phase constants, Reason a short
// word ("timeout", "Cancelled", "StartError", …) and Message the JSON of a
// Report.
//
// Both sides validate: the API's schema first, Validate on the agent again;
// the command is an argv vector and is never passed to a shell.
package taskwire

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"regexp"
	"strconv"
	"strings"
)

// TypeExec is the work item type of a task run by the exec driver.
const TypeExec = "task-exec"

// TypeContainerd is the work item type of a task run by the containerd
// driver (Spec.Driver DriverContainerd): its own type, so that an agent
// that does not know the driver refuses it instead of running its command
// on the host.
const TypeContainerd = "task-containerd"

// Drivers of a Spec.
const (
	DriverExec       = "exec"
	DriverContainerd = "containerd"
)

// WorkID is the agent work uid of attempt n of the task with uid.
func WorkID(uid string, attempt int32) string {
	return "task-" + uid + "-" + strconv.Itoa(int(attempt))
}

// ParseWorkID splits a work uid made by WorkID; ok is false for any other.
func ParseWorkID(id string) (uid string, attempt int32, ok bool) {
	rest, found := strings.CutPrefix(id, "task-")
	if !found {
		return "", 0, false
	}
	i := strings.LastIndexByte(rest, '-')
	if i <= 0 {
		return "", 0, false
	}
	n, err := strconv.ParseInt(rest[i+1:], 10, 32)
	if err != nil || n < 1 {
		return "", 0, false
	}
	return rest[:i], int32(n), true
}

// FeatureRunAs is the protocol feature (agentv1 GetMessageRequest.features)
// an agent names when it runs tasks as Spec.RunAsUser/RunAsGroup (or its
// unprivileged task user) and understands a relative Spec.WorkingDir. An
// agent that does not name it runs every task as its own user.
const FeatureRunAs = "task-run-as"

// MaxID is the largest uid or gid a spec may ask for (the API's bound;
// 4294967295 is (uid_t)-1, "no change", to the kernel).
const MaxID int64 = 4294967294

// Phases of a task's work status.
const (
	// PhaseRunning: the process started (Report.PID, Report.StartTime set).
	PhaseRunning = "Running"
	// PhaseSucceeded: it exited 0.
	PhaseSucceeded = "Succeeded"
	// PhaseFailed: it exited non-zero, was killed, timed out, or could not
	// start. Reason says which; Report.ExitCode is set when it ran.
	PhaseFailed = "Failed"
	// PhaseCancelled: the hub cancelled it (its Task was deleted or the
	// attempt was superseded) and the process is gone.
	PhaseCancelled = "Cancelled"
)

// Reasons of a Failed report.
const (
	ReasonTimeout    = "timeout"
	ReasonExitCode   = "ExitCode"
	ReasonSignal     = "Signal"
	ReasonStartError = "StartError"
	ReasonArtifact   = "ArtifactError"
	ReasonLost       = "AgentRestarted"
	ReasonCancelled  = "Cancelled"
	// ReasonOOMKilled: the attempt went over its memory limit and the
	// kernel killed it (exit code 137).
	ReasonOOMKilled = "OOMKilled"
	// ReasonAgentStopped: the agent stopped the process as it stopped
	// itself (drover-agent --stop-tasks-on-exit, as `drover up`'s local
	// agents run).
	ReasonAgentStopped = "AgentStopped"
	// ReasonRunAs: the agent refused the user or group the attempt asks
	// to run as (root without --allow-root-tasks, or any other user when
	// the agent is not root and cannot switch).
	ReasonRunAs = "RunAsRefused"
	// ReasonDriverUnavailable: the agent cannot run the task's driver
	// (containerd: no socket, or no drover-containerd companion).
	ReasonDriverUnavailable = "DriverUnavailable"
	// ReasonImageNotFound: the container's image is not on the node.
	ReasonImageNotFound = "ImageNotFound"
)

// Exit codes of a process ended by a signal, as a shell reports them.
const (
	ExitSIGTERM = 143
	ExitSIGKILL = 137
)

// Artifact is fetched to Path (relative to the working dir) before start.
type Artifact struct {
	URL        string `json:"url"`
	SHA256     string `json:"sha256"`
	Path       string `json:"path"`
	Executable bool   `json:"executable,omitempty"`
}

// Spec is what an agent needs to run one attempt of a task.
type Spec struct {
	// Namespace/Name/Attempt identify the task for logs and messages.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Attempt   int32  `json:"attempt"`
	// Driver is DriverExec (or empty) or DriverContainerd.
	Driver string `json:"driver,omitempty"`
	// Image is the container image of a DriverContainerd task.
	Image string `json:"image,omitempty"`
	// Command is the argv of the process. With DriverContainerd it is
	// optional and, when set, replaces the image's entrypoint and cmd.
	Command []string `json:"command"`
	// Env is NAME=value pairs, added to a minimal environment.
	Env []string `json:"env,omitempty"`
	// WorkingDir is where the process starts. Empty: the attempt's own
	// fresh directory. Relative: a directory inside that one (created; no
	// ".." segment, and the agent refuses a symlink that leaves it).
	// Absolute: that directory on the node, as it is.
	WorkingDir string `json:"workingDir,omitempty"`
	// RunAsUser and RunAsGroup are the uid and gid the process runs as (a
	// Task's securityContext), with no supplementary groups. Unset user: the
	// agent's task user (drover-agent --task-user); unset group: RunAsUser
	// when that is set, else the task user's group. An agent refuses uid 0
	// unless started with --allow-root-tasks. An agent older than
	// FeatureRunAs ignores both fields (see docs/contracts/agent-protocol.md).
	RunAsUser  *int64     `json:"runAsUser,omitempty"`
	RunAsGroup *int64     `json:"runAsGroup,omitempty"`
	Artifacts  []Artifact `json:"artifacts,omitempty"`
	// TimeoutSeconds of the attempt; 0 means none.
	TimeoutSeconds int64 `json:"timeoutSeconds,omitempty"`
	// KillTimeoutSeconds between SIGTERM and SIGKILL; 0 means 10.
	KillTimeoutSeconds int64 `json:"killTimeoutSeconds,omitempty"`
	// MemoryBytes and CPUMillis are the task's resources (memory, cpu):
	// an agent that contains attempts in cgroups enforces them as limits.
	// 0 means none.
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
	CPUMillis   int64 `json:"cpuMillis,omitempty"`
}

// Report is the JSON in WorkStatus.Message.
type Report struct {
	PID int `json:"pid,omitempty"`
	// ExitCode is set once the process has ended (143/137 after a signal).
	ExitCode *int32 `json:"exitCode,omitempty"`
	// StartTime and FinishTime are RFC 3339 with nanoseconds.
	StartTime  string `json:"startTime,omitempty"`
	FinishTime string `json:"finishTime,omitempty"`
	// Message is for people ("terminated after timeout 30s", an error).
	Message string `json:"message,omitempty"`
	// OutputTail is the end of stdout and stderr, at most MaxTailBytes.
	OutputTail string `json:"outputTail,omitempty"`
}

// MaxTailBytes bounds Report.OutputTail (the protocol bounds the whole
// message at 16 KiB).
const MaxTailBytes = 4 << 10

// Limits checked by Validate (the API's schema has the same ones).
const (
	MaxArgs       = 256
	MaxArgBytes   = 4096
	MaxEnv        = 128
	MaxArtifacts  = 32
	MaxPathBytes  = 4096
	MaxKillTimout = 3600
	MaxImageBytes = 512
)

var (
	envNameRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	urlRE      = regexp.MustCompile(`^https?://[A-Za-z0-9._~:/?#\[\]@!&()*+,=%-]+$`)
	digestRE   = regexp.MustCompile(`^[a-f0-9]{64}$`)
	imageRE    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/:@-]*$`)
	relPathRE  = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._-]*(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*$`)
	errInvalid = errors.New("invalid task spec")
)

// Validate checks s as the agent must before running anything.
func (s *Spec) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", errInvalid, fmt.Sprintf(format, args...))
	}
	switch s.Driver {
	case "", DriverExec:
		if s.Image != "" {
			return bad("image is only for driver %s", DriverContainerd)
		}
		if len(s.Command) == 0 || s.Command[0] == "" {
			return bad("command must name a program")
		}
	case DriverContainerd:
		if !imageRE.MatchString(s.Image) || len(s.Image) > MaxImageBytes {
			return bad("driver %s needs an image reference (at most %d bytes)", DriverContainerd, MaxImageBytes)
		}
		if len(s.Command) > 0 && s.Command[0] == "" {
			return bad("command[0] must name a program")
		}
		if len(s.Artifacts) > 0 {
			return bad("artifacts are not supported with driver %s", DriverContainerd)
		}
		if s.WorkingDir != "" && !path.IsAbs(s.WorkingDir) {
			return bad("workingDir %q must be absolute with driver %s (a dir inside the container)", s.WorkingDir, DriverContainerd)
		}
	default:
		return bad("unknown driver %q", s.Driver)
	}
	if len(s.Command) > MaxArgs {
		return bad("command has %d arguments, more than %d", len(s.Command), MaxArgs)
	}
	for i, a := range s.Command {
		if len(a) > MaxArgBytes || strings.IndexByte(a, 0) >= 0 {
			return bad("command[%d] is over %d bytes or holds a NUL byte", i, MaxArgBytes)
		}
	}
	if len(s.Env) > MaxEnv {
		return bad("%d env entries, more than %d", len(s.Env), MaxEnv)
	}
	for i, e := range s.Env {
		name, _, ok := strings.Cut(e, "=")
		if !ok || !envNameRE.MatchString(name) || strings.IndexByte(e, 0) >= 0 {
			return bad("env[%d] must be NAME=value with NAME of [A-Za-z0-9_]", i)
		}
	}
	if err := checkWorkingDir(s.WorkingDir); err != nil {
		return bad("%v", err)
	}
	for _, id := range []struct {
		name string
		v    *int64
	}{{"runAsUser", s.RunAsUser}, {"runAsGroup", s.RunAsGroup}} {
		if id.v != nil && (*id.v < 0 || *id.v > MaxID) {
			return bad("%s %d is not a uid or gid from 0 to %d", id.name, *id.v, MaxID)
		}
	}
	if len(s.Artifacts) > MaxArtifacts {
		return bad("%d artifacts, more than %d", len(s.Artifacts), MaxArtifacts)
	}
	for i, a := range s.Artifacts {
		if !urlRE.MatchString(a.URL) || len(a.URL) > 2048 {
			return bad("artifacts[%d].url is not an http(s) URL", i)
		}
		if !digestRE.MatchString(a.SHA256) {
			return bad("artifacts[%d].sha256 is not 64 lowercase hex digits", i)
		}
		if !relPathRE.MatchString(a.Path) || len(a.Path) > 255 {
			return bad("artifacts[%d].path %q must be relative, with no part starting with a dot", i, a.Path)
		}
	}
	if s.TimeoutSeconds < 0 || s.KillTimeoutSeconds < 0 || s.KillTimeoutSeconds > MaxKillTimout {
		return bad("timeouts must be positive, killTimeout at most %ds", MaxKillTimout)
	}
	if s.MemoryBytes < 0 || s.CPUMillis < 0 {
		return bad("resources must not be negative")
	}
	return nil
}

// checkWorkingDir accepts an absolute path, or a relative one that stays
// inside the attempt's dir: no ".." segment (a symlink is the agent's to
// refuse, when it creates the dir).
func checkWorkingDir(dir string) error {
	if dir == "" {
		return nil
	}
	if len(dir) > MaxPathBytes || strings.ContainsAny(dir, "\x00\n") {
		return fmt.Errorf("workingDir is over %d bytes or holds a NUL or newline", MaxPathBytes)
	}
	if path.IsAbs(dir) {
		return nil
	}
	for seg := range strings.SplitSeq(dir, "/") {
		if seg == ".." {
			return fmt.Errorf("workingDir %q must be absolute, or relative without '..' (it stays inside the attempt's dir)", dir)
		}
	}
	return nil
}

// RunsAs reports whether s names a user or group to run as.
func (s *Spec) RunsAs() bool { return s.RunAsUser != nil || s.RunAsGroup != nil }

// Type is the work item type of s.
func (s *Spec) Type() string {
	if s.Driver == DriverContainerd {
		return TypeContainerd
	}
	return TypeExec
}

// Encode returns the JSON of s.
func (s *Spec) Encode() ([]byte, error) { return json.Marshal(s) }

// DecodeSpec parses and validates a work item's spec.
func DecodeSpec(b []byte) (*Spec, error) {
	var s Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%w: %v", errInvalid, err)
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

// Encode returns the JSON of r, with OutputTail cut to MaxTailBytes.
func (r Report) Encode() string {
	if len(r.OutputTail) > MaxTailBytes {
		r.OutputTail = r.OutputTail[len(r.OutputTail)-MaxTailBytes:]
	}
	b, _ := json.Marshal(r) // plain fields: cannot fail
	return string(b)
}

// DecodeReport parses a WorkStatus message; an empty one is an empty Report.
func DecodeReport(msg string) (Report, error) {
	var r Report
	if msg == "" {
		return r, nil
	}
	err := json.Unmarshal([]byte(msg), &r)
	return r, err
}
