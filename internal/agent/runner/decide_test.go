package runner

import (
	"fmt"
	"strings"
	"testing"

	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
	"github.com/drover-fleet/drover/internal/store"
)

// recs builds records from "Action:State" and "Action:State:reported".
func recs(specs ...string) Records {
	r := Records{}
	for _, s := range specs {
		parts := append(strings.Split(s, ":"), "")
		name, state := parts[0], parts[1]
		r[name] = store.Action{Action: name, State: state, Reason: name + " " + state, Reported: parts[2] == "reported"}
	}
	return r
}

func describe(d Decision) string {
	name := "<none>"
	if d.Action != nil {
		name = d.Action.Name
	}
	switch d.Kind {
	case StartAction, ResumeAction:
		return fmt.Sprintf("%s %s", d.Kind, name)
	}
	return fmt.Sprintf("%s %s %s", d.Kind, name, Phase(d.Result))
}

func TestDecide(t *testing.T) {
	const (
		ok   = store.ActionSucceeded
		bad  = store.ActionFailed
		runn = store.ActionRunning
	)
	upgrade, confirm, prepull := nodejobwire.UpgradeFlow(false), nodejobwire.UpgradeFlow(true), nodejobwire.PrePullFlow()
	loopA := &nodejobwire.Action{Name: "A"}
	loopA.OnSuccess = &nodejobwire.Action{Name: "B", OnSuccess: loopA}
	tests := []struct {
		name string
		flow *nodejobwire.Flow
		recs Records
		want string
	}{
		{"a flow with no records starts its first action", upgrade, nil, "StartAction Check"},
		{"an action found Running is resumed", upgrade, recs("Check:" + runn), "ResumeAction Check"},
		{"an ended action not yet reported is reported, the flow going on", upgrade, recs("Check:" + ok), "ReportEnd Check Running"},
		{"a reported success moves to the next action", upgrade, recs("Check:" + ok + ":reported"), "StartAction BackUp"},
		{"a failed Check without a failure branch ends the flow Failed, once reported", upgrade, recs("Check:" + bad), "ReportEnd Check Failed"},
		{"a reported failed Check is Done and Failed", upgrade, recs("Check:" + bad + ":reported"), "Done Check Failed"},
		{"an Upgrade Running after a restart is resumed", upgrade,
			recs("Check:"+ok+":reported", "BackUp:"+ok+":reported", "Upgrade:"+runn), "ResumeAction Upgrade"},
		{"a failed Upgrade is reported while the flow goes on to RollBack", upgrade,
			recs("Check:"+ok+":reported", "BackUp:"+ok+":reported", "Upgrade:"+bad), "ReportEnd Upgrade Running"},
		{"a reported failed Upgrade starts RollBack", upgrade,
			recs("Check:"+ok+":reported", "BackUp:"+ok+":reported", "Upgrade:"+bad+":reported"), "StartAction RollBack"},
		{"a successful RollBack still fails the flow", upgrade,
			recs("Check:"+ok+":reported", "BackUp:"+ok+":reported", "Upgrade:"+bad+":reported", "RollBack:"+ok+":reported"), "Done RollBack Failed"},
		{"a successful Upgrade ends the flow Succeeded", upgrade,
			recs("Check:"+ok+":reported", "BackUp:"+ok+":reported", "Upgrade:"+ok+":reported"), "Done Upgrade Succeeded"},
		{"a record off the flow's path is ignored", upgrade,
			recs("Check:"+ok+":reported", "BackUp:"+ok+":reported", "Upgrade:"+ok+":reported", "RollBack:"+runn), "Done Upgrade Succeeded"},
		{"the end of the last action is reported with the flow's result", upgrade,
			recs("Check:"+ok+":reported", "BackUp:"+ok+":reported", "Upgrade:"+ok), "ReportEnd Upgrade Succeeded"},
		{"a wait cut short is resumed", confirm, recs("Check:"+ok+":reported", "Confirm:"+runn), "ResumeAction Confirm"},
		{"a confirmation that failed ends the flow", confirm,
			recs("Check:"+ok+":reported", "Confirm:"+bad+":reported"), "Done Confirm Failed"},
		{"the flow without confirmation skips its record", upgrade,
			recs("Check:"+ok+":reported", "WaitingConfirmation:"+runn), "StartAction BackUp"},
		{"a pre-pull's Pull that succeeded is reported Succeeded", prepull, recs("Check:"+ok+":reported", "Pull:"+ok), "ReportEnd Pull Succeeded"},
		{"a pre-pull's Pull cut short is resumed", prepull, recs("Check:"+ok+":reported", "Pull:"+runn), "ResumeAction Pull"},
		{"a flow with no actions is Done and Failed", &nodejobwire.Flow{}, nil, "Done <none> Failed"},
		{"a flow that loops is Done and Failed", &nodejobwire.Flow{First: loopA},
			recs("A:"+ok+":reported", "B:"+ok+":reported"), "Done A Failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := describe(Decide(tt.flow, tt.recs)); got != tt.want {
				t.Errorf("Decide() = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestDecideCarriesTheRecord(t *testing.T) {
	r := recs("Check:"+store.ActionSucceeded+":reported", "Pull:"+store.ActionFailed+":reported")
	d := Decide(nodejobwire.PrePullFlow(), r)
	if d.Kind != Done || d.Record.Reason != "Pull Failed" {
		t.Errorf("Decide() = %s with reason %q, want Done with the Pull's reason", describe(d), d.Record.Reason)
	}
}
