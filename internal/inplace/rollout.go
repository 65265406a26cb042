package inplace

import (
	"fmt"
	"math"
	"strconv"
	"time"

	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
)

// RolloutWindow is the span a rollout rate counts starts in.
const RolloutWindow = time.Minute

// RolloutRate is the number of nodes a rollout lets start per minute after
// succeeded nodes updated: baseRatePerMinute × incrementFactor^(succeeded /
// succeededPerIncrease), capped at maximumPerMinute.
func RolloutRate(r *updatev1.Rollout, succeeded int) int {
	base := max(int(r.BaseRatePerMinute), 1)
	factor := 2.0
	if r.IncrementFactor != "" {
		if f, err := strconv.ParseFloat(r.IncrementFactor, 64); err == nil && f >= 1 {
			factor = math.Min(f, 5)
		}
	}
	per := int(r.SucceededPerIncrease)
	if per <= 0 {
		per = base
	}
	rate := float64(base) * math.Pow(factor, float64(succeeded/per))
	limit := math.MaxInt32
	if r.MaximumPerMinute > 0 {
		limit = int(r.MaximumPerMinute)
	}
	if rate >= float64(limit) {
		return limit
	}
	return int(rate)
}

// RolloutAllowance is how many more nodes may start now, given when the
// plan's nodes started and how many updated; when none may, after is how
// long until one may.
func RolloutAllowance(r *updatev1.Rollout, now time.Time, started []time.Time, succeeded int) (allowed, rate int, after time.Duration) {
	rate = RolloutRate(r, succeeded)
	var recent []time.Time
	for _, s := range started {
		if now.Sub(s) < RolloutWindow {
			recent = append(recent, s)
		}
	}
	allowed = rate - len(recent)
	if allowed > 0 {
		return allowed, rate, 0
	}
	// The start that leaves the window first frees a slot.
	oldest := now
	for _, s := range recent {
		if s.Before(oldest) {
			oldest = s
		}
	}
	return 0, rate, max(oldest.Add(RolloutWindow).Sub(now), time.Second)
}

// OverAbortThreshold reports whether failed of ended nodes stop the pool:
// without a rollout threshold the first failure does.
func OverAbortThreshold(r *updatev1.Rollout, failed, ended int) (bool, string) {
	if failed == 0 {
		return false, ""
	}
	if r == nil || r.AbortThresholdPercent == 0 {
		return true, ""
	}
	minEnded := max(int(r.MinEndedForAbort), 1)
	if ended < minEnded || failed*100 < int(r.AbortThresholdPercent)*ended {
		return false, ""
	}
	return true, fmt.Sprintf("%d of %d ended node(s) failed (%d%%), at or above the rollout's abort threshold of %d%%",
		failed, ended, failed*100/ended, r.AbortThresholdPercent)
}
