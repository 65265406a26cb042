// Package appwire is the contract between hubs and agents for serverless
// applications (serverless.drover.io, seed 002): the work items a hub
// dispatches for instances and sessions, and the reports an agent sends
// back. It imports nothing from k8s.io, because drover-agent links it.
//
// The seed's commands map onto Drover's work items:
//
//	PodCreate      a WorkItem of TypeInstance, uid InstanceWorkID, Spec = InstanceSpec
//	PodTerminate   Cancel of the instance's uid (or leaving it out of a snapshot)
//	SessionStart   a WorkItem of TypeSession, uid SessionWorkID, Spec = SessionSpec
//	SessionClose   Cancel of the session's uid
//	NodeFullSync   the hub's full-sync request; the agent answers with NodeState
//
// and its states onto WorkStatus: while an instance or a session lives its
// phase is Running, Reason its state (the seed's PodState / SessionState,
// actor.PodState / actor.SessionState) and Message the JSON of an
// InstanceReport / SessionReport. It ends Succeeded (terminated as asked)
// or Failed (crash, timeout, start failure), with the last report.
package appwire

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/drover-fleet/drover/internal/task/taskwire"
)

// Work item types.
const (
	TypeInstance = "app-instance"
	TypeSession  = "app-session"
)

// Work uid prefixes.
const (
	instancePrefix = "inst-"
	sessionPrefix  = "sess-"
)

// InstanceWorkID is the agent work uid of the instance whose slice entry
// has uid id (InstanceSlice spec.instances[].uid).
func InstanceWorkID(id string) string { return instancePrefix + id }

// SessionWorkID is the agent work uid of the ApplicationSession with uid.
func SessionWorkID(uid string) string { return sessionPrefix + uid }

// ParseWorkID tells which kind of item a work uid is and its id;
// kind is TypeInstance, TypeSession or "" (not this feature's).
func ParseWorkID(uid string) (kind, id string) {
	if id, ok := strings.CutPrefix(uid, instancePrefix); ok && id != "" {
		return TypeInstance, id
	}
	if id, ok := strings.CutPrefix(uid, sessionPrefix); ok && id != "" {
		return TypeSession, id
	}
	return "", ""
}

// Probe is a liveness or readiness probe: exactly one of Exec, TCP and
// HTTPPath.
type Probe struct {
	Exec           []string `json:"exec,omitempty"`
	TCP            bool     `json:"tcp,omitempty"`
	HTTPPath       string   `json:"httpPath,omitempty"`
	TimeoutSeconds int32    `json:"timeoutSeconds,omitempty"`
}

// InstanceSpec is a PodCreate: how one instance runs.
type InstanceSpec struct {
	// Namespace and Application name the Application; Name is the
	// instance's name (unique in the Application).
	Namespace   string `json:"namespace"`
	Application string `json:"application"`
	Name        string `json:"name"`
	// Standby: freeze the instance once live; else it is active (Idle).
	Standby bool `json:"standby,omitempty"`
	// Daemon: the instance runs without sessions (Running once live).
	Daemon bool `json:"daemon,omitempty"`
	// Runtime is "process" (the default) or "container".
	Runtime    string              `json:"runtime,omitempty"`
	Image      string              `json:"image,omitempty"`
	Command    []string            `json:"command,omitempty"`
	Env        []string            `json:"env,omitempty"`
	Artifacts  []taskwire.Artifact `json:"artifacts,omitempty"`
	RunAsUser  *int64              `json:"runAsUser,omitempty"`
	RunAsGroup *int64              `json:"runAsGroup,omitempty"`
	// MemoryBytes and CPUMillis limit its cgroup; 0: no limit.
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
	CPUMillis   int64 `json:"cpuMillis,omitempty"`
	// PortName names its port (the agent assigns the host port).
	PortName  string `json:"portName,omitempty"`
	Liveness  *Probe `json:"liveness,omitempty"`
	Readiness *Probe `json:"readiness,omitempty"`
	// Config is the Application's config data, for the session file.
	Config map[string]string `json:"config,omitempty"`
	// SessionsPerInstance bounds its sessions (0: 1).
	SessionsPerInstance int `json:"sessionsPerInstance,omitempty"`
	// Timeouts in milliseconds (0: the actor's defaults).
	LivenessTimeoutMillis   int64 `json:"livenessTimeoutMillis,omitempty"`
	ReadyTimeoutMillis      int64 `json:"readyTimeoutMillis,omitempty"`
	EvacuationTimeoutMillis int64 `json:"evacuationTimeoutMillis,omitempty"`
}

// SessionSpec is a SessionStart: one session for one instance.
type SessionSpec struct {
	Namespace   string `json:"namespace"`
	Application string `json:"application"`
	// Name is the ApplicationSession's name.
	Name string `json:"name"`
	// Instance is the work uid of the instance (InstanceWorkID) it is
	// bound to, on the same node.
	Instance string            `json:"instance"`
	Data     map[string]string `json:"data,omitempty"`
	// Timeouts in milliseconds (0: the actor's defaults).
	OpenTimeoutMillis       int64 `json:"openTimeoutMillis,omitempty"`
	HeartbeatIntervalMillis int64 `json:"heartbeatIntervalMillis,omitempty"`
	HeartbeatMisses         int   `json:"heartbeatMisses,omitempty"`
	EvacuationTimeoutMillis int64 `json:"evacuationTimeoutMillis,omitempty"`
}

// InstanceReport is the Message of an instance's WorkStatus.
type InstanceReport struct {
	// State is the pod state (actor.PodState); the WorkStatus Reason too.
	State string `json:"state"`
	// Reason and Message say why it is in State (a crash, a timeout).
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Port is its host port, once started.
	Port int `json:"port,omitempty"`
	// Sessions bound to it: session work uids.
	Sessions []string `json:"sessions,omitempty"`
	// Since is when it entered State (RFC 3339, UTC).
	Since string `json:"since,omitempty"`
	// CPUMillis and MemoryBytes are its cgroup's usage when reported.
	CPUUsageNanos uint64 `json:"cpuUsageNanos,omitempty"`
	MemoryBytes   uint64 `json:"memoryBytes,omitempty"`
}

// SessionReport is the Message of a session's WorkStatus.
type SessionReport struct {
	// State is the session state (actor.SessionState); the WorkStatus
	// Reason too.
	State   string `json:"state"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Instance is its instance's work uid; Port the instance's host port.
	Instance string   `json:"instance"`
	Port     int      `json:"port,omitempty"`
	Flagged  bool     `json:"flagged,omitempty"`
	Clients  []string `json:"clients,omitempty"`
	// ReadyTime is when the instance called SessionReady (RFC 3339 nano).
	ReadyTime string `json:"readyTime,omitempty"`
}

var (
	nameRE     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`)
	envRE      = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)
	workIDRE   = regexp.MustCompile(`^[A-Za-z0-9._-]{1,160}$`)
	httpPathRE = regexp.MustCompile(`^/[A-Za-z0-9._~:/?#\[\]@!$&'()*+,;=%-]*$`)
)

func checkName(what, s string) error {
	if len(s) == 0 || len(s) > 253 || !nameRE.MatchString(s) {
		return fmt.Errorf("%s %q is not a DNS subdomain name", what, s)
	}
	return nil
}

// Validate says what is wrong with p: the agent checks again what the
// API's schema checked, because nothing on the wire is trusted.
func (p *Probe) Validate() error {
	if p == nil {
		return nil
	}
	n := 0
	if len(p.Exec) > 0 {
		n++
		if p.Exec[0] == "" {
			return errors.New("probe exec[0] must name a program")
		}
		for _, a := range p.Exec {
			if strings.ContainsRune(a, 0) {
				return errors.New("probe exec has a NUL byte")
			}
		}
	}
	if p.TCP {
		n++
	}
	if p.HTTPPath != "" {
		n++
		if !httpPathRE.MatchString(p.HTTPPath) {
			return fmt.Errorf("probe httpPath %q: want a path starting with /", p.HTTPPath)
		}
	}
	if n != 1 {
		return errors.New("a probe has exactly one of exec, tcp and httpPath")
	}
	if p.TimeoutSeconds < 0 || p.TimeoutSeconds > 60 {
		return fmt.Errorf("probe timeoutSeconds %d: want 0 to 60", p.TimeoutSeconds)
	}
	return nil
}

// Validate says what is wrong with s.
func (s *InstanceSpec) Validate() error {
	if err := checkName("namespace", s.Namespace); err != nil {
		return err
	}
	if err := checkName("application", s.Application); err != nil {
		return err
	}
	if err := checkName("instance name", s.Name); err != nil {
		return err
	}
	switch s.Runtime {
	case "", "process":
		if len(s.Command) == 0 || s.Command[0] == "" {
			return errors.New("an instance of the process runtime needs a command")
		}
	case "container":
		if s.Image == "" {
			return errors.New("an instance of the container runtime needs an image")
		}
	default:
		return fmt.Errorf("runtime %q: want process or container", s.Runtime)
	}
	for _, a := range s.Command {
		if strings.ContainsRune(a, 0) {
			return errors.New("command has a NUL byte")
		}
	}
	for _, e := range s.Env {
		if !envRE.MatchString(e) || strings.ContainsRune(e, 0) {
			return fmt.Errorf("env entry %q: want NAME=value", e)
		}
	}
	for _, a := range s.Artifacts {
		ts := taskwire.Spec{Namespace: s.Namespace, Name: s.Name, Attempt: 1, Command: []string{"x"}, Artifacts: []taskwire.Artifact{a}}
		if err := ts.Validate(); err != nil {
			return fmt.Errorf("artifact %s: %w", a.Path, err)
		}
	}
	if err := s.Liveness.Validate(); err != nil {
		return fmt.Errorf("liveness: %w", err)
	}
	if err := s.Readiness.Validate(); err != nil {
		return fmt.Errorf("readiness: %w", err)
	}
	if s.SessionsPerInstance < 0 || s.SessionsPerInstance > 1000 {
		return fmt.Errorf("sessionsPerInstance %d: want 0 to 1000", s.SessionsPerInstance)
	}
	for _, ms := range []int64{s.LivenessTimeoutMillis, s.ReadyTimeoutMillis, s.EvacuationTimeoutMillis, s.MemoryBytes, s.CPUMillis} {
		if ms < 0 {
			return errors.New("timeouts and limits cannot be negative")
		}
	}
	return nil
}

// Validate says what is wrong with s.
func (s *SessionSpec) Validate() error {
	if err := checkName("namespace", s.Namespace); err != nil {
		return err
	}
	if err := checkName("application", s.Application); err != nil {
		return err
	}
	if err := checkName("session name", s.Name); err != nil {
		return err
	}
	if kind, _ := ParseWorkID(s.Instance); kind != TypeInstance || !workIDRE.MatchString(s.Instance) {
		return fmt.Errorf("instance %q is not an instance work uid", s.Instance)
	}
	if len(s.Data) > 64 {
		return fmt.Errorf("session data has %d keys: at most 64", len(s.Data))
	}
	for _, ms := range []int64{s.OpenTimeoutMillis, s.HeartbeatIntervalMillis, s.EvacuationTimeoutMillis, int64(s.HeartbeatMisses)} {
		if ms < 0 {
			return errors.New("timeouts cannot be negative")
		}
	}
	return nil
}

// Millis is d in whole milliseconds, for the specs' timeouts.
func Millis(d time.Duration) int64 { return d.Milliseconds() }

// Duration is ms milliseconds; 0 stays 0 (the default).
func Duration(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }

// Encode is the JSON of v (an InstanceSpec, SessionSpec or report).
func Encode(v any) ([]byte, error) { return json.Marshal(v) }

// DecodeInstance parses and validates an instance's spec.
func DecodeInstance(b []byte) (*InstanceSpec, error) {
	var s InstanceSpec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("instance spec: %w", err)
	}
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("instance spec: %w", err)
	}
	return &s, nil
}

// DecodeSession parses and validates a session's spec.
func DecodeSession(b []byte) (*SessionSpec, error) {
	var s SessionSpec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("session spec: %w", err)
	}
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("session spec: %w", err)
	}
	return &s, nil
}

// DecodeInstanceReport parses an instance's WorkStatus message.
func DecodeInstanceReport(msg string) (InstanceReport, error) {
	var r InstanceReport
	if msg == "" {
		return r, nil
	}
	err := json.Unmarshal([]byte(msg), &r)
	return r, err
}

// DecodeSessionReport parses a session's WorkStatus message.
func DecodeSessionReport(msg string) (SessionReport, error) {
	var r SessionReport
	if msg == "" {
		return r, nil
	}
	err := json.Unmarshal([]byte(msg), &r)
	return r, err
}
