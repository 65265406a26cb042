// Package nodejobwire is the contract between hubs and agents for node jobs: the
// work item specs a hub dispatches and the action reports an agent sends
// back. It imports nothing from k8s.io, because drover-agent links it.
//
// A node job reaches an agent as an agentv1.WorkItem with Type TypeUpgrade
// or TypePrePull, uid = the job's uid, and Spec = the JSON of UpgradeSpec or
// PrePullSpec. The agent reports each action as an agentv1.WorkStatus with
// Phase PhaseRunning, PhaseSucceeded or PhaseFailed, Reason = the action's
// name, and Message = the JSON of a Report.
//
// Both sides validate: the API's schema first, Validate on the agent again,
// and nothing here is ever passed to a shell.
package nodejobwire

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Work item types.
const (
	TypeUpgrade = "nodejob-upgrade"
	TypePrePull = "nodejob-prepull"
	// TypeConfirm is dispatched, with uid ConfirmUID(upgrade uid), when an
	// operator confirms a node waiting at Confirm: an agent
	// applies a uid once, so confirmation is an item of its own, which the
	// upgrade runner looks for in the agent DB.
	TypeConfirm = "nodejob-confirm"
)

// ConfirmSpec is the spec of a confirmation item.
type ConfirmSpec struct {
	// By is who confirmed (the job's spec.confirmed.by), if known.
	By string `json:"by,omitempty"`
}

// ConfirmUID is the uid of the confirmation item of upgrade item uid.
func ConfirmUID(uid string) string { return uid + ".confirm" }

// Phases of a node job's work status.
const (
	PhaseRunning   = "Running"
	PhaseSucceeded = "Succeeded"
	PhaseFailed    = "Failed"
)

// Checks are the pre-checks a job asks for, with their limits in percent.
type Checks struct {
	Items       []string `json:"items,omitempty"` // cpu, mem, disk
	CPUPercent  int      `json:"cpuPercent,omitempty"`
	MemPercent  int      `json:"memPercent,omitempty"`
	DiskPercent int      `json:"diskPercent,omitempty"`
}

// UpgradeSpec is what an agent needs to upgrade itself.
type UpgradeSpec struct {
	Job     string `json:"job"`
	Version string `json:"version"`
	URL     string `json:"url,omitempty"`
	Image   string `json:"image,omitempty"`
	SHA256  string `json:"sha256"`
	// Auth holds the credentials for Image's registry, from the artifact's
	// imageSecretRef (absent: anonymous pull).
	Auth map[string]Credential `json:"auth,omitempty"`
	// RequireConfirmation holds the flow at Confirm until the
	// confirmation item (TypeConfirm, ConfirmSpec) arrives, or Confirmed.
	RequireConfirmation bool   `json:"requireConfirmation,omitempty"`
	Confirmed           bool   `json:"confirmed,omitempty"`
	TimeoutSeconds      int    `json:"timeoutSeconds,omitempty"`
	Checks              Checks `json:"checks"`
}

// Credential is a registry login, from a job's imageSecretRef.
type Credential struct {
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// PrePullSpec is what an agent needs to pull images.
type PrePullSpec struct {
	Job    string   `json:"job"`
	Images []string `json:"images"`
	// Auth maps a registry host (e.g. "registry.example.com:5000") to its
	// credentials; only the registries of Images are present.
	Auth           map[string]Credential `json:"auth,omitempty"`
	RetryTimes     int                   `json:"retryTimes,omitempty"`
	TimeoutSeconds int                   `json:"timeoutSeconds,omitempty"`
	Checks         Checks                `json:"checks"`
}

// ImageResult is one image's outcome on the node.
type ImageResult struct {
	Image   string `json:"image"`
	Success bool   `json:"success"`
	Reason  string `json:"reason,omitempty"`
}

// Report is one action's outcome.
type Report struct {
	Action  string    `json:"action"`
	Success bool      `json:"success"`
	Reason  string    `json:"reason,omitempty"`
	Time    time.Time `json:"time"`
	// Running is true when the action started and has not ended yet (e.g.
	// Confirm, while it waits).
	Running bool `json:"running,omitempty"`
	// By is who let the action go on (Confirm: who confirmed).
	By              string        `json:"by,omitempty"`
	CurrentVersion  string        `json:"currentVersion,omitempty"`
	HistoricVersion string        `json:"historicVersion,omitempty"`
	Images          []ImageResult `json:"images,omitempty"`
}

// Limits that keep a report inside a WorkStatus message and a slice entry.
const (
	MaxReasonBytes = 256
	MaxImages      = 32
	MaxImageBytes  = 512
)

var (
	versionRE = regexp.MustCompile(`^v?[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)
	urlRE     = regexp.MustCompile(`^https?://[A-Za-z0-9._~:/?#\[\]@!&()*+,=%-]+$`)
	imageRE   = regexp.MustCompile(`^([a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)*(:[0-9]+)?/)?[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*(:[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127})?(@sha256:[a-f0-9]{64})?$`)
	digestRE  = regexp.MustCompile(`^[a-f0-9]{64}$`)
)

// ValidVersion, ValidURL and ValidImage apply the API's patterns again.
func ValidVersion(v string) bool { return len(v) <= 128 && versionRE.MatchString(v) }

// ValidURL reports whether u is an http(s) URL the API would accept.
func ValidURL(u string) bool { return len(u) <= 2048 && urlRE.MatchString(u) }

// ValidImage reports whether ref is an image reference the API would accept.
func ValidImage(ref string) bool { return len(ref) <= MaxImageBytes && imageRE.MatchString(ref) }

func (c Checks) validate() error {
	for _, it := range c.Items {
		if it != "cpu" && it != "mem" && it != "disk" {
			return fmt.Errorf("unknown check item %q", it)
		}
	}
	for _, p := range []int{c.CPUPercent, c.MemPercent, c.DiskPercent} {
		if p < 0 || p > 100 {
			return fmt.Errorf("check threshold %d is not a percentage", p)
		}
	}
	return nil
}

// DecodeUpgrade parses and validates an upgrade spec.
func DecodeUpgrade(b []byte) (UpgradeSpec, error) {
	var s UpgradeSpec
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("upgrade spec: %w", err)
	}
	var errs []error
	if !ValidVersion(s.Version) {
		errs = append(errs, fmt.Errorf("version %q is not a semantic version", s.Version))
	}
	if (s.URL == "") == (s.Image == "") {
		errs = append(errs, errors.New("exactly one of url and image must be set"))
	}
	if s.URL != "" && !ValidURL(s.URL) {
		errs = append(errs, fmt.Errorf("url %q is not an http(s) URL", s.URL))
	}
	if s.Image != "" && !ValidImage(s.Image) {
		errs = append(errs, fmt.Errorf("image %q is not an image reference", s.Image))
	}
	if !digestRE.MatchString(s.SHA256) {
		errs = append(errs, fmt.Errorf("sha256 %q is not 64 hex digits", s.SHA256))
	}
	if err := s.Checks.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return s, fmt.Errorf("upgrade spec: %w", err)
	}
	return s, nil
}

// DecodePrePull parses and validates a pre-pull spec.
func DecodePrePull(b []byte) (PrePullSpec, error) {
	var s PrePullSpec
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("pre-pull spec: %w", err)
	}
	var errs []error
	if len(s.Images) == 0 || len(s.Images) > MaxImages {
		errs = append(errs, fmt.Errorf("%d images: want 1 to %d", len(s.Images), MaxImages))
	}
	for _, im := range s.Images {
		if !ValidImage(im) {
			errs = append(errs, fmt.Errorf("image %q is not an image reference", im))
		}
	}
	if s.RetryTimes < 0 || s.RetryTimes > 10 {
		errs = append(errs, fmt.Errorf("retryTimes %d: want 0 to 10", s.RetryTimes))
	}
	if err := s.Checks.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return s, fmt.Errorf("pre-pull spec: %w", err)
	}
	return s, nil
}

// Clip shortens s to at most n bytes on a rune boundary, marking the cut.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !isRuneStart(s[cut]) {
		cut--
	}
	return strings.ToValidUTF8(s[:cut], "") + "…"
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }

// EncodeReport is the WorkStatus message for r, with reasons clipped.
func EncodeReport(r Report) string {
	r.Reason = Clip(r.Reason, MaxReasonBytes)
	if len(r.Images) > MaxImages {
		r.Images = r.Images[:MaxImages]
	}
	for i := range r.Images {
		r.Images[i].Reason = Clip(r.Images[i].Reason, MaxReasonBytes)
		r.Images[i].Image = Clip(r.Images[i].Image, MaxImageBytes)
	}
	b, _ := json.Marshal(r) // plain structs: cannot fail
	return string(b)
}

// DecodeReport parses a WorkStatus message.
func DecodeReport(msg string) (Report, error) {
	var r Report
	if err := json.Unmarshal([]byte(msg), &r); err != nil {
		return r, fmt.Errorf("node job report: %w", err)
	}
	if r.Action == "" || len(r.Action) > 64 {
		return r, fmt.Errorf("node job report: action %q", r.Action)
	}
	r.Reason = Clip(r.Reason, MaxReasonBytes)
	r.By = Clip(r.By, 253)
	if len(r.Images) > MaxImages {
		return r, fmt.Errorf("node job report: %d images, more than %d", len(r.Images), MaxImages)
	}
	return r, nil
}
