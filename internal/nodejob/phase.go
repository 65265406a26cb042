package nodejob

import (
	"fmt"
	"math"
	"math/big"
	"strconv"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
)

// Verdict is a job phase and why.
type Verdict struct {
	Phase opsv1.JobPhase
	// Reason is a condition reason for a final phase.
	Reason string
	// Message explains the phase to an operator.
	Message string
	// ToleranceErr is set when failureTolerate could not be used and 0 was
	// assumed; the caller records it as a Warning Event.
	ToleranceErr error
}

// ParseFailureTolerate reads spec.failureTolerate. Empty means 0. A value
// that is not a decimal in [0, 1] also yields 0, with an error saying so.
func ParseFailureTolerate(s string) (*big.Rat, error) {
	if s == "" {
		return new(big.Rat), nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || f < 0 || f > 1 {
		return new(big.Rat), fmt.Errorf("failureTolerate %q is not a decimal between 0 and 1; using 0 (every node must succeed)", s)
	}
	// The shortest decimal that reads back as f, as the seed's
	// decimal.NewFromFloat does: "0.1" is exactly 1/10, not its binary neighbour.
	r, _ := new(big.Rat).SetString(strconv.FormatFloat(f, 'f', -1, 64))
	return r, nil
}

// Phase computes a job's phase from its counts, exactly as the seed's
// CalculatePhaseWithCounts:
//
//   - no nodes: Failure;
//   - any node Pending or InProgress: InProgress;
//   - otherwise failed (Failure or Unknown) / total, rounded half away from
//     zero to 2 decimals, strictly greater than failureTolerate: Failure;
//   - else Completed.
func Phase(c opsv1.NodeTaskCounts, failureTolerate string) Verdict {
	tol, tolErr := ParseFailureTolerate(failureTolerate)
	if c.Total <= 0 {
		return Verdict{Phase: opsv1.JobPhaseFailure, Reason: opsv1.ReasonNoMatchingNodes, Message: "no node matches the job's nodeNames or labelSelector", ToleranceErr: tolErr}
	}
	if c.Pending+c.InProgress > 0 {
		return Verdict{Phase: opsv1.JobPhaseInProgress, Message: fmt.Sprintf("%d of %d nodes done", c.Total-c.Pending-c.InProgress, c.Total), ToleranceErr: tolErr}
	}
	fail := int64(c.Failure + c.Unknown)
	share := roundedShare(fail, int64(c.Total))
	tolStr := tol.FloatString(2)
	if fail > 0 && share.Cmp(tol) > 0 {
		return Verdict{Phase: opsv1.JobPhaseFailure, Reason: opsv1.ReasonFailureToleranceExceeded,
			Message:      fmt.Sprintf("%d of %d nodes failed (%s), more than failureTolerate %s", fail, c.Total, share.FloatString(2), tolStr),
			ToleranceErr: tolErr}
	}
	return Verdict{Phase: opsv1.JobPhaseCompleted, Reason: opsv1.ReasonWithinFailureTolerance,
		Message:      fmt.Sprintf("%d of %d nodes succeeded; %d failed, within failureTolerate %s", c.Successful, c.Total, fail, tolStr),
		ToleranceErr: tolErr}
}

// roundedShare is fail/total rounded half away from zero to 2 decimals.
func roundedShare(fail, total int64) *big.Rat {
	// hundredths = floor((200*fail + total) / (2*total)) rounds half up for
	// non-negative values.
	h := (200*fail + total) / (2 * total)
	return big.NewRat(h, 100)
}

// Count tallies node tasks by phase.
func Count(nodes []opsv1.NodeTaskStatus) opsv1.NodeTaskCounts {
	var c opsv1.NodeTaskCounts
	for _, n := range nodes {
		c.Add(n.Phase, 1)
	}
	return c
}
