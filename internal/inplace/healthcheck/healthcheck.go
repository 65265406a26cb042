// Package healthcheck holds the rules of NodeHealthCheck, after Cluster
// API's MachineHealthCheck with the in-place update additions of seed 003:
// a node updating longer than inPlaceUpdateTimeout is unhealthy, so is one
// whose updater failed for good, healthy nodes in update count against
// remediation, and a node still initialising and updating gets
// initializeTimeout + inPlaceUpdateTimeout. Pure: Evaluate takes the time.
package healthcheck

import (
	"fmt"
	"regexp"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
)

// Node is what a health check knows of a node.
type Node struct {
	Name    string
	Created time.Time
	// Initialized: the node has connected at least once.
	Initialized  bool
	Conditions   []metav1.Condition
	UpdateStatus updatev1.UpdateStatus
	// UpdateStarted is when its in-place update started (zero if none).
	UpdateStarted time.Time
	// UpdateReason: why its update failed.
	UpdateReason string
}

// Verdict is one node's result.
type Verdict struct {
	Name     string
	Healthy  bool
	InUpdate bool
	Reason   string
	Message  string
}

// Result is a whole check.
type Result struct {
	Nodes                       []Verdict
	Expected, Healthy, InUpdate int
	Unhealthy                   int
	RemediationsAllowed         int
	// Allowed: remediation may run now; Why says why not.
	Allowed bool
	Reason  string
	Why     string
	// NextCheck is the earliest time a verdict may change by time alone
	// (zero if none): requeue then.
	NextCheck time.Time
}

var rangeRE = regexp.MustCompile(`^\[([0-9]+)-([0-9]+)\]$`)

// ParseRange parses unhealthyRange "[min-max]".
func ParseRange(s string) (lo, hi int, err error) {
	m := rangeRE.FindStringSubmatch(s)
	if m == nil {
		return 0, 0, fmt.Errorf("unhealthyRange %q is not [min-max]", s)
	}
	lo, _ = strconv.Atoi(m[1])
	hi, _ = strconv.Atoi(m[2])
	if lo > hi {
		return 0, 0, fmt.Errorf("unhealthyRange %q: min %d is above max %d", s, lo, hi)
	}
	return lo, hi, nil
}

func dur(d *metav1.Duration) time.Duration {
	if d == nil {
		return 0
	}
	return d.Duration
}

// Evaluate checks nodes against spec at now.
func Evaluate(spec updatev1.NodeHealthCheckSpec, nodes []Node, now time.Time) (Result, error) {
	r := Result{Expected: len(nodes)}
	next := func(t time.Time) {
		if t.After(now) && (r.NextCheck.IsZero() || t.Before(r.NextCheck)) {
			r.NextCheck = t
		}
	}
	initTimeout, updTimeout := dur(spec.InitializeTimeout), dur(spec.InPlaceUpdateTimeout)
	for _, n := range nodes {
		v := check(spec, n, now, initTimeout, updTimeout, next)
		v.Name = n.Name
		switch {
		case !v.Healthy:
			r.Unhealthy++
		case v.InUpdate:
			r.InUpdate++
		default:
			r.Healthy++
		}
		r.Nodes = append(r.Nodes, v)
	}

	// RemediationCount = maxAllowedUnhealthy − unhealthy − inUpdateHealthy:
	// an updating node may go offline, so it counts as unhealthy here.
	counted := r.Unhealthy + r.InUpdate
	if spec.UnhealthyRange != "" {
		lo, hi, err := ParseRange(spec.UnhealthyRange)
		if err != nil {
			return r, err
		}
		r.RemediationsAllowed = max(0, hi-counted)
		r.Allowed = counted >= lo && counted <= hi
		if !r.Allowed {
			r.Reason = updatev1.ReasonTooManyUnhealthy
			r.Why = fmt.Sprintf("%d unhealthy and %d updating is outside unhealthyRange %s", r.Unhealthy, r.InUpdate, spec.UnhealthyRange)
		}
	} else {
		maxU := intstr.FromString("100%")
		if spec.MaxUnhealthy != nil {
			maxU = *spec.MaxUnhealthy
		}
		// Percentages round down (Cluster API's rule).
		allowed, err := intstr.GetScaledValueFromIntOrPercent(&maxU, len(nodes), false)
		if err != nil {
			return r, fmt.Errorf("maxUnhealthy %s: %w", maxU.String(), err)
		}
		r.RemediationsAllowed = max(0, allowed-counted)
		r.Allowed = counted <= allowed
		if !r.Allowed {
			r.Reason = updatev1.ReasonTooManyUnhealthy
			r.Why = fmt.Sprintf("%d unhealthy and %d updating exceed maxUnhealthy %s (%d of %d nodes)", r.Unhealthy, r.InUpdate, maxU.String(), allowed, len(nodes))
		}
	}
	if r.Allowed {
		r.Reason = updatev1.ReasonRemediationOK
		r.Why = fmt.Sprintf("%d unhealthy, %d updating: within limits", r.Unhealthy, r.InUpdate)
	}
	return r, nil
}

func check(spec updatev1.NodeHealthCheckSpec, n Node, now time.Time, initTimeout, updTimeout time.Duration, next func(time.Time)) Verdict {
	if n.UpdateStatus == updatev1.StatusFailed {
		return Verdict{Reason: updatev1.ReasonUpdaterFailed, Message: "in-place update failed for good: " + n.UpdateReason}
	}
	if n.UpdateStatus == updatev1.StatusUpdating || n.UpdateStatus == updatev1.StatusAborting {
		if updTimeout <= 0 || n.UpdateStarted.IsZero() {
			return Verdict{Healthy: true, InUpdate: true, Reason: updatev1.ReasonUpdating}
		}
		timeout := updTimeout
		if !n.Initialized {
			// Corner case 1 of the seed: a new node still initialising
			// and updating gets both.
			timeout += initTimeout
		}
		deadline := n.UpdateStarted.Add(timeout)
		if !now.Before(deadline) {
			return Verdict{Reason: updatev1.ReasonUpdateTimeout, Message: fmt.Sprintf("updating for %v, longer than %v", now.Sub(n.UpdateStarted).Round(time.Second), timeout)}
		}
		next(deadline)
		// While updating, an offline node is expected: conditions wait.
		return Verdict{Healthy: true, InUpdate: true, Reason: updatev1.ReasonUpdating}
	}
	if !n.Initialized && initTimeout > 0 {
		deadline := n.Created.Add(initTimeout)
		if !now.Before(deadline) {
			return Verdict{Reason: updatev1.ReasonInitializeTimeout, Message: fmt.Sprintf("not initialised within %v", initTimeout)}
		}
		next(deadline)
	}
	for _, uc := range spec.UnhealthyConditions {
		for _, c := range n.Conditions {
			if c.Type != uc.Type || c.Status != uc.Status {
				continue
			}
			deadline := c.LastTransitionTime.Add(uc.Timeout.Duration)
			if !now.Before(deadline) {
				return Verdict{Reason: updatev1.ReasonConditionTimeout, Message: fmt.Sprintf("condition %s is %s for longer than %v", c.Type, c.Status, uc.Timeout.Duration)}
			}
			next(deadline)
		}
	}
	return Verdict{Healthy: true, Reason: updatev1.ReasonHealthy}
}
