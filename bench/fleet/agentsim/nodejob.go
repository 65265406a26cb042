package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// answerJobs answers the node-job upgrade items env carries (a Dispatch, or
// a Snapshot's items not answered yet) as the real agent reports a flow
// whose actions all succeed at once (internal/agent/upgrade): Running with
// the Check report, Running with the BackUp report, then the item's end,
// Succeeded with the Upgrade report. Each status is one SendMessage with
// the agent's next revision. Called from the stream goroutine, which owns
// agentRev and jobs.
func (a *simAgent) answerJobs(ctx context.Context, env *agentv1.Envelope) error {
	var items []*agentv1.WorkItem
	switch p := env.GetPayload().(type) {
	case *agentv1.Envelope_Dispatch:
		items = []*agentv1.WorkItem{p.Dispatch.GetItem()}
	case *agentv1.Envelope_Snapshot:
		items = p.Snapshot.GetItems()
	}
	for _, it := range items {
		if it.GetType() != nodejobwire.TypeUpgrade {
			continue
		}
		if a.jobs == nil {
			a.jobs = map[string]*agentv1.WorkStatus{}
		}
		if _, seen := a.jobs[it.GetUid()]; seen {
			continue // answered already: its end went out (or goes in NodeState)
		}
		a.s.st.jobItems.Add(1)
		if err := a.answerUpgrade(ctx, it); err != nil {
			return err
		}
	}
	return nil
}

func (a *simAgent) answerUpgrade(ctx context.Context, it *agentv1.WorkItem) error {
	uid := it.GetUid()
	spec, err := nodejobwire.DecodeUpgrade(it.GetSpec())
	var steps []*agentv1.WorkStatus
	if err != nil {
		// What the real runner reports for a bad spec: Check fails.
		a.s.st.jobErrors.Add(1)
		r := nodejobwire.Report{Action: nodejobwire.Check, Reason: "invalid spec: " + err.Error(), Time: time.Now()}
		steps = append(steps, &agentv1.WorkStatus{Uid: uid, Phase: nodejobwire.PhaseFailed, Reason: r.Reason, Message: nodejobwire.EncodeReport(r)})
	} else {
		check := nodejobwire.Report{Action: nodejobwire.Check, Success: true, Reason: "checks passed", Time: time.Now()}
		backup := nodejobwire.Report{Action: nodejobwire.BackUp, Success: true, Reason: fmt.Sprintf("backed up %s (simulated)", a.s.opts.version), Time: time.Now()}
		up := nodejobwire.Report{Action: nodejobwire.Upgrade, Success: true, Reason: fmt.Sprintf("upgraded to %s (simulated)", spec.Version), Time: time.Now(),
			CurrentVersion: spec.Version, HistoricVersion: a.s.opts.version}
		steps = append(steps,
			&agentv1.WorkStatus{Uid: uid, Phase: nodejobwire.PhaseRunning, Reason: check.Action, Message: nodejobwire.EncodeReport(check)},
			&agentv1.WorkStatus{Uid: uid, Phase: nodejobwire.PhaseRunning, Reason: backup.Action, Message: nodejobwire.EncodeReport(backup)},
			&agentv1.WorkStatus{Uid: uid, Phase: nodejobwire.PhaseSucceeded, Reason: up.Reason, Message: nodejobwire.EncodeReport(up)})
	}
	for _, st := range steps {
		a.agentRev++
		a.jobs[uid] = st
		if _, err := a.call(ctx, protocol.NewStatus(a.name, a.agentRev, st)); err != nil {
			if a.s.st.jobErrors.Add(1) <= 5 {
				fmt.Fprintf(os.Stderr, "agentsim: %s: status of %s: %v\n", a.name, uid, err)
			}
			return err // the stream restarts; NodeState carries the last status
		}
		a.s.st.jobStatuses.Add(1)
	}
	return nil
}

// jobStatuses is the last status of each node-job item, for NodeState.
func (a *simAgent) jobStatuses() []*agentv1.WorkStatus {
	var out []*agentv1.WorkStatus
	for _, st := range a.jobs {
		out = append(out, st)
	}
	return out
}
