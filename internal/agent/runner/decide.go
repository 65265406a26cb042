package runner

import (
	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
	"github.com/drover-fleet/drover/internal/store"
)

// Records are a flow's action records by action name, as the DB holds them.
type Records map[string]store.Action

// Kind is what a flow needs next.
type Kind int

const (
	// StartAction: the action has no record. Record it Running, then run it.
	StartAction Kind = iota + 1
	// ResumeAction: the action is recorded Running; a restart, a stop or a wait
	// cut it short. Resume it (or run it again), then record its end.
	ResumeAction
	// ReportEnd: the action ended, but its end was not reported. Report it,
	// then mark it reported.
	ReportEnd
	// Done: the flow ended and every end on its path was reported.
	Done
)

func (k Kind) String() string {
	switch k {
	case StartAction:
		return "StartAction"
	case ResumeAction:
		return "ResumeAction"
	case ReportEnd:
		return "ReportEnd"
	case Done:
		return "Done"
	}
	return "Kind(?)"
}

// Decision is a flow's next step.
type Decision struct {
	Kind Kind
	// Action is the action to start, resume or report, or the last one of
	// the flow (Done). It is nil only for a flow with no actions.
	Action *nodejobwire.Action
	// Record is Action's record (zero for StartAction).
	Record store.Action
	// Result is where the flow is once Action ended (ReportEnd and Done):
	// Running while the flow goes on.
	Result nodejobwire.Result
}

// Decide returns what flow f needs next given its records: it follows f
// from its first action through the ends recorded, and stops at the first
// action that has no end (StartAction, ResumeAction) or whose end was not
// reported (ReportEnd). Records of actions off that path are ignored. A flow with no
// actions, or one that visits an action twice (a malformed flow), is Done
// and Failed.
func Decide(f *nodejobwire.Flow, recs Records) Decision {
	if f == nil || f.First == nil {
		return Decision{Kind: Done, Result: nodejobwire.Failed}
	}
	seen := map[*nodejobwire.Action]bool{}
	for a := f.First; ; {
		if seen[a] {
			return Decision{Kind: Done, Action: a, Record: recs[a.Name], Result: nodejobwire.Failed}
		}
		seen[a] = true
		rec, ok := recs[a.Name]
		switch {
		case !ok:
			return Decision{Kind: StartAction, Action: a}
		case rec.State == store.ActionRunning:
			return Decision{Kind: ResumeAction, Action: a, Record: rec}
		}
		success := rec.State == store.ActionSucceeded
		res := nodejobwire.After(a, success)
		switch {
		case !rec.Reported:
			return Decision{Kind: ReportEnd, Action: a, Record: rec, Result: res}
		case res != nodejobwire.Running:
			return Decision{Kind: Done, Action: a, Record: rec, Result: res}
		}
		a = a.Next(success)
	}
}

// Phase is the node job phase of result r (nodejobwire.PhaseRunning,
// PhaseSucceeded or PhaseFailed).
func Phase(r nodejobwire.Result) string {
	switch r {
	case nodejobwire.Running:
		return nodejobwire.PhaseRunning
	case nodejobwire.Succeeded:
		return nodejobwire.PhaseSucceeded
	}
	return nodejobwire.PhaseFailed
}
