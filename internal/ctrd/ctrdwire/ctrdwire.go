// Package ctrdwire is the contract between drover-agent and its
// drover-containerd companion (package ctrd): the result file and the
// reasons in it. It imports nothing but the standard library, because
// drover-agent links it and must not link the containerd client.
package ctrdwire

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
)

// Defaults of the companion's flags (the agent's too).
const (
	DefaultAddress     = "/run/containerd/containerd.sock"
	DefaultNamespace   = "drover"
	DefaultSnapshotter = "overlayfs"
)

// Reasons of a Result whose container did not run.
const (
	// ReasonImageNotFound: the image is not in containerd's namespace.
	ReasonImageNotFound = "ImageNotFound"
	// ReasonUnavailable: containerd could not be reached.
	ReasonUnavailable = "DriverUnavailable"
	// ReasonStartError: the container could not be created or started.
	ReasonStartError = "StartError"
	// ReasonGone: wait found no container (or no task) of that id.
	ReasonGone = "ContainerGone"
)

// ExitNotRun is the companion's exit code when the container did not run
// (the result file says why), as docker run's 125.
const ExitNotRun = 125

// Result is the JSON of the result file.
type Result struct {
	// Ran: the container's task started (ExitCode is its exit code).
	Ran      bool  `json:"ran"`
	ExitCode int32 `json:"exitCode"`
	// OOMKilled: the kernel OOM-killed a process of the container.
	OOMKilled bool `json:"oomKilled,omitempty"`
	// Reason and Message say why it did not run (Ran false).
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// ReadResult reads a result file; ok is false when there is none.
func ReadResult(path string) (r Result, ok bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return r, false, nil
	}
	if err != nil {
		return r, false, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, false, fmt.Errorf("result file %s: %w", path, err)
	}
	return r, true, nil
}
