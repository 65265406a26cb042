package nodejob

import (
	"strings"
	"testing"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
)

func counts(total, pending, inProgress, ok, failed, unknown int32) opsv1.NodeTaskCounts {
	return opsv1.NodeTaskCounts{Total: total, Pending: pending, InProgress: inProgress, Successful: ok, Failure: failed, Unknown: unknown}
}

func TestPhase(t *testing.T) {
	tests := []struct {
		name      string
		c         opsv1.NodeTaskCounts
		tolerate  string
		want      opsv1.JobPhase
		wantTolEr bool
	}{
		{"no nodes", counts(0, 0, 0, 0, 0, 0), "", opsv1.JobPhaseFailure, false},
		{"no nodes, even with full tolerance", counts(0, 0, 0, 0, 0, 0), "1", opsv1.JobPhaseFailure, false},
		{"all pending", counts(3, 3, 0, 0, 0, 0), "", opsv1.JobPhaseInProgress, false},
		{"one in progress, rest failed", counts(3, 0, 1, 0, 2, 0), "", opsv1.JobPhaseInProgress, false},
		{"all successful", counts(3, 0, 0, 3, 0, 0), "", opsv1.JobPhaseCompleted, false},
		{"one failure, no tolerance", counts(3, 0, 0, 2, 1, 0), "", opsv1.JobPhaseFailure, false},
		{"unknown counts as failed", counts(3, 0, 0, 2, 0, 1), "", opsv1.JobPhaseFailure, false},
		{"at tolerance exactly: 1/4 = 0.25", counts(4, 0, 0, 3, 1, 0), "0.25", opsv1.JobPhaseCompleted, false},
		{"just above tolerance: 1/4 > 0.24", counts(4, 0, 0, 3, 1, 0), "0.24", opsv1.JobPhaseFailure, false},
		// 1/3 = 0.333… rounds to 0.33: equal to 0.33 is within, 0.32 is not.
		{"rounded share equal: 1/3 vs 0.33", counts(3, 0, 0, 2, 1, 0), "0.33", opsv1.JobPhaseCompleted, false},
		{"rounded share above: 1/3 vs 0.32", counts(3, 0, 0, 2, 1, 0), "0.32", opsv1.JobPhaseFailure, false},
		// 2/3 = 0.666… rounds up to 0.67.
		{"rounds half away from zero: 2/3 vs 0.66", counts(3, 0, 0, 1, 2, 0), "0.66", opsv1.JobPhaseFailure, false},
		{"rounds up: 2/3 vs 0.67", counts(3, 0, 0, 1, 2, 0), "0.67", opsv1.JobPhaseCompleted, false},
		// 1/200 = 0.005 rounds to 0.01 (> 0), and 1/201 = 0.00497… to 0.00 (not > 0).
		{"0.005 rounds to 0.01", counts(200, 0, 0, 199, 1, 0), "0", opsv1.JobPhaseFailure, false},
		{"0.00497 rounds to 0.00 but fail>0 with tolerance 0", counts(201, 0, 0, 200, 1, 0), "0", opsv1.JobPhaseCompleted, false},
		{"more decimals than 2: 0.125 vs share 0.13", counts(8, 0, 0, 7, 1, 0), "0.125", opsv1.JobPhaseFailure, false},
		{"full tolerance", counts(2, 0, 0, 0, 2, 0), "1", opsv1.JobPhaseCompleted, false},
		{"all failed, tolerance 0.99", counts(2, 0, 0, 0, 2, 0), "0.99", opsv1.JobPhaseFailure, false},
		{"unparsable tolerance is 0, and said", counts(4, 0, 0, 3, 1, 0), "lots", opsv1.JobPhaseFailure, true},
		{"out of range tolerance is 0, and said", counts(4, 0, 0, 3, 1, 0), "1.5", opsv1.JobPhaseFailure, true},
		{"NaN tolerance is 0, and said", counts(4, 0, 0, 4, 0, 0), "NaN", opsv1.JobPhaseCompleted, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := Phase(tt.c, tt.tolerate)
			if v.Phase != tt.want {
				t.Errorf("Phase(%+v, %q) = %s (%s), want %s", tt.c, tt.tolerate, v.Phase, v.Message, tt.want)
			}
			if (v.ToleranceErr != nil) != tt.wantTolEr {
				t.Errorf("ToleranceErr = %v, want error %v", v.ToleranceErr, tt.wantTolEr)
			}
			if v.Phase.Final() && v.Reason == "" {
				t.Errorf("final phase %s without a reason", v.Phase)
			}
		})
	}
}

func TestCount(t *testing.T) {
	c := Count([]opsv1.NodeTaskStatus{
		{Phase: opsv1.NodeTaskPhasePending}, {Phase: opsv1.NodeTaskPhaseInProgress}, {Phase: opsv1.NodeTaskPhaseSuccessful},
		{Phase: opsv1.NodeTaskPhaseSuccessful}, {Phase: opsv1.NodeTaskPhaseFailure}, {Phase: opsv1.NodeTaskPhaseUnknown},
	})
	if c != counts(6, 1, 1, 2, 1, 1) {
		t.Errorf("Count = %+v", c)
	}
}

func TestActionNamesMatchTheAPI(t *testing.T) {
	pairs := map[string]string{
		nodejobwire.Check: opsv1.ActionCheck, nodejobwire.Confirm: opsv1.ActionConfirm, nodejobwire.WaitingConfirmation: opsv1.ActionWaitingConfirmation, nodejobwire.BackUp: opsv1.ActionBackUp,
		nodejobwire.Upgrade: opsv1.ActionUpgrade, nodejobwire.RollBack: opsv1.ActionRollBack, nodejobwire.Pull: opsv1.ActionPull,
	}
	for a, b := range pairs {
		if a != b {
			t.Errorf("flow action %q != API action %q", a, b)
		}
	}
}

func TestNodesPerSliceStaysUnderBudget(t *testing.T) {
	for _, images := range []int{0, 1, 5, 32, 64} {
		n := NodesPerSlice(images)
		if n < 1 || n > opsv1.MaxNodesPerSlice {
			t.Errorf("NodesPerSlice(%d) = %d", images, n)
		}
		worst := n * (entryBase + maxActions*actionSize + images*imageSize)
		if worst > SliceBudget {
			t.Errorf("NodesPerSlice(%d) = %d: worst case %d bytes > budget %d", images, n, worst, SliceBudget)
		}
	}
	if n := NodesPerSlice(0); n < 100 {
		t.Errorf("NodesPerSlice(0) = %d: 10,000 nodes would need %d slices", n, 10000/n)
	}
}

func TestSliceNameIsValidAndDistinct(t *testing.T) {
	long := strings.Repeat("a", 253)
	seen := map[string]bool{}
	for _, tc := range []struct{ kind, job, uid string }{
		{"NodeUpgradeJob", "upgrade", "1234567890"}, {"NodeUpgradeJob", "upgrade", "abcdefgh99"}, {"ImagePrePullJob", "upgrade", "1234567890"},
		{"NodeUpgradeJob", long, "1234567890"},
	} {
		for i := range 3 {
			n := SliceName(tc.kind, tc.job, typesUID(tc.uid), i)
			if len(n) > 253 || n[0] == '-' {
				t.Errorf("SliceName = %q: not a valid name", n)
			}
			if seen[n] {
				t.Errorf("SliceName %q repeats", n)
			}
			seen[n] = true
		}
	}
}

func TestPartition(t *testing.T) {
	got := Partition([]string{"e", "a", "d", "c", "b"}, 2)
	want := [][]string{{"a", "b"}, {"c", "d"}, {"e"}}
	if len(got) != len(want) {
		t.Fatalf("Partition = %v", got)
	}
	for i := range got {
		if strings.Join(got[i], ",") != strings.Join(want[i], ",") {
			t.Errorf("Partition[%d] = %v, want %v", i, got[i], want[i])
		}
	}
	// Appending to a group must not overwrite the next one.
	got[0] = append(got[0], "x")
	if got[1][0] != "c" {
		t.Error("groups share backing storage")
	}
}
