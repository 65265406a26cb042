package nodejobhub_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/testenv"
)

// TestReportsOfNodesNotInTheJob: a node is trusted with its own work only.
// Reports of a node job forged by a node the job's slices hold no entry
// for are neither taken nor kept; the node in the job still reports. (The
// hub drops them before they reach the executor, by Assigned; the
// executor does not take them either.)
func TestReportsOfNodesNotInTheJob(t *testing.T) {
	testenv.Require(t, env)
	e, h, reg := start(t, 0)
	ctx := context.Background()
	job := &opsv1.NodeUpgradeJob{ObjectMeta: metav1.ObjectMeta{Name: "forged-upgrade"}, Spec: opsv1.NodeUpgradeJobSpec{
		NodeNames: []string{"n1", "n2"}, Version: "v1.2.3", RequireConfirmation: true,
		Artifact:  opsv1.AgentArtifact{URL: "https://example.com/agent", SHA256: digest},
		Confirmed: &opsv1.Confirmation{NodeNames: []string{"n1"}}}}
	s := jobWithSlice(t, job, entry("n1", "InProgress"), entry("n2", "Pending"))
	uid := string(job.UID)
	testenv.Eventually(t, waitTimeout, "n1 dispatched", func(context.Context) (bool, error) {
		return h.has(&h.dispatched, "n1/"+uid+"/"+nodejobwire.TypeUpgrade), nil
	})
	// What the hub asks before it lets a report through.
	confirm := nodejobwire.ConfirmUID(uid)
	for _, c := range []struct {
		node, uid string
		want      bool
	}{
		{"n1", uid, true}, {"n2", uid, true}, {"n9", uid, false},
		{"n1", confirm, true}, {"n9", confirm, false},
		{"n1", "some-task", false}, {"n1", nodejobwire.ConfirmUID("some-task"), false},
	} {
		if got := e.Assigned(ctx, c.node, c.uid); got != c.want {
			t.Errorf("Assigned(%s, %s) = %v, want %v", c.node, c.uid, got, c.want)
		}
	}
	reports := func() float64 { return testutil.ToFloat64(mustCounter(t, reg, "drover_hub_nodejob_reports_total")) }

	forged := nodejobwire.Report{Action: nodejobwire.RollBack, Success: true, Reason: "forged", Time: time.Now()}
	e.WorkStatus(ctx, "n9", &agentv1.WorkStatus{Uid: uid, Phase: nodejobwire.PhaseFailed, Reason: forged.Action, Message: nodejobwire.EncodeReport(forged)})
	e.NodeState(ctx, "n9", []*agentv1.WorkStatus{{Uid: uid, Phase: nodejobwire.PhaseFailed, Message: nodejobwire.EncodeReport(forged)}})
	if n := reports(); n != 0 {
		t.Errorf("the executor took %v reports of node n9, which the job does not hold", n)
	}

	done := nodejobwire.Report{Action: nodejobwire.Check, Success: true, Time: time.Now()}
	e.WorkStatus(ctx, "n1", &agentv1.WorkStatus{Uid: uid, Phase: nodejobwire.PhaseSucceeded, Reason: done.Action, Message: nodejobwire.EncodeReport(done)})
	testenv.Eventually(t, waitTimeout, "n1's report written", func(context.Context) (bool, error) {
		if got := sliceEntry(t, s.Name, "n1"); got.Phase != opsv1.NodeTaskPhaseSuccessful {
			return false, fmt.Errorf("entry %+v", got)
		}
		return true, nil
	})
	if n := reports(); n != 1 {
		t.Errorf("reports taken = %v, want n1's one", n)
	}
}
