package runner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
	"github.com/drover-fleet/drover/internal/store"
)

// Store persists a flow's action records (the agent DB, *store.Store).
type Store interface {
	// Actions returns uid's records.
	Actions(ctx context.Context, uid string) ([]store.Action, error)
	// SetAction inserts or replaces the record of a.UID's a.Action.
	SetAction(ctx context.Context, a store.Action) error
	// MarkActionReported records that the end of uid's action was reported.
	MarkActionReported(ctx context.Context, uid, action string) error
}

var _ Store = (*store.Store)(nil)

// Outcome is how an action ended.
type Outcome struct {
	Success bool
	// Reason says why, for the report and the flow's end.
	Reason string
	// Data is the action's own record (JSON), kept with its end: later
	// actions and the report read it.
	Data []byte
}

// OK is a successful end.
func OK(reason string, data []byte) Outcome {
	return Outcome{Success: true, Reason: reason, Data: data}
}

// Fail is a failed end: the flow goes to the action's failure branch.
func Fail(reason string, data []byte) Outcome { return Outcome{Reason: reason, Data: data} }

// Unfinished is the error of an action that has not ended and goes on
// outside this run (the agent re-execs itself; the new process ends it
// through its own Run). The action stays Running; Run returns
// End{Result: nodejobwire.Running, Reason: Reason}.
type Unfinished struct{ Reason string }

func (u *Unfinished) Error() string { return u.Reason }

// Action is one action of a flow.
type Action interface {
	// Run does the action and returns its end. An error ends the run of the
	// flow with no end recorded: the action stays Running, and the next run
	// resumes it.
	Run(ctx context.Context, s *Step) (Outcome, error)
}

// Resumer is an action that resumes after it was cut short (found
// Running). Without it, a cut-short action is run again.
type Resumer interface {
	Resume(ctx context.Context, s *Step) (Outcome, error)
}

// ActionFunc adapts a function to Action.
type ActionFunc func(ctx context.Context, s *Step) (Outcome, error)

// Run calls f.
func (f ActionFunc) Run(ctx context.Context, s *Step) (Outcome, error) { return f(ctx, s) }

// WithResume is an Action that runs run, and resume when cut short.
func WithResume(run, resume ActionFunc) Action { return resumable{run, resume} }

type resumable struct{ run, resume ActionFunc }

func (r resumable) Run(ctx context.Context, s *Step) (Outcome, error)    { return r.run(ctx, s) }
func (r resumable) Resume(ctx context.Context, s *Step) (Outcome, error) { return r.resume(ctx, s) }

var (
	_ Action  = ActionFunc(nil)
	_ Resumer = resumable{}
)

// Actions are a flow's actions by name.
type Actions map[string]Action

// Report is what the runner reports: an action's end, or (Waiting) that an
// action waits.
type Report struct {
	UID, Action string
	Success     bool
	// Waiting: the action has not ended; it waits (for a confirmation).
	// Success is then true: nothing failed.
	Waiting bool
	Reason  string
	// Data is the action's Outcome.Data (nil when Waiting).
	Data []byte
	// Result is where the flow is after this report: Running while it
	// goes on.
	Result nodejobwire.Result
	Time   time.Time
}

// Phase is the node job phase after r.
func (r Report) Phase() string { return Phase(r.Result) }

// ReportFunc hands a report on (to the agent's durable outbox). A nil
// error means it is durable: the runner then marks the action reported
// and never reports that end again.
type ReportFunc func(ctx context.Context, r Report) error

// End is where a run left a flow.
type End struct {
	// Result is Succeeded or Failed when the flow ended; Running when an
	// action goes on outside this run (Unfinished).
	Result nodejobwire.Result
	Reason string
}

// Phase is the node job phase of e.
func (e End) Phase() string { return Phase(e.Result) }

// Options configure a Runner.
type Options struct {
	// Store persists the records. Required.
	Store Store
	// Clock stamps reports; default clock.Real().
	Clock clock.Clock
	// Lane, when set, runs one action at a time across the flows that
	// share it; an action gives it up while it waits (Step.Wait).
	Lane *Lane
}

// Runner runs flows. It holds no state of its own between calls: the
// records are the state, so any Runner on the same Store resumes a flow.
type Runner struct {
	store Store
	clock clock.Clock
	lane  *Lane
}

// New returns a Runner.
func New(o Options) (*Runner, error) {
	if o.Store == nil {
		return nil, errors.New("action-flow runner: Options.Store is required")
	}
	return &Runner{store: o.Store, clock: clock.Or(o.Clock), lane: o.Lane}, nil
}

// Run runs (or resumes) flow f of work item uid with actions, reporting
// through report, until the flow ends (End Succeeded or Failed, with the
// last action's reason) or an action is Unfinished (End Running). An error
// means the run stopped with the flow not ended (a DB or report failure, an
// action's error, or ctx ended: "<action> interrupted: <cause>"); a later
// Run resumes it.
func (r *Runner) Run(ctx context.Context, uid string, f *nodejobwire.Flow, actions Actions, report ReportFunc) (End, error) {
	list, err := r.store.Actions(ctx, uid)
	if err != nil {
		return End{}, err
	}
	recs := Records{}
	for _, a := range list {
		recs[a.Action] = a
	}
	for {
		d := Decide(f, recs)
		switch d.Kind {
		case Done:
			if d.Action == nil {
				return End{}, fmt.Errorf("run the flow of work %s: the flow has no actions", uid)
			}
			return End{Result: d.Result, Reason: d.Record.Reason}, nil
		case ReportEnd:
			name := d.Action.Name
			rep := Report{UID: uid, Action: name, Success: d.Record.State == store.ActionSucceeded, Reason: d.Record.Reason,
				Data: d.Record.Data, Result: d.Result, Time: r.clock.Now()}
			if err := report(ctx, rep); err != nil {
				return End{}, fmt.Errorf("report %s: %w", name, err)
			}
			// The report is durable: record it even if ctx just ended.
			if err := r.store.MarkActionReported(context.WithoutCancel(ctx), uid, name); err != nil {
				return End{}, err
			}
			rec := d.Record
			rec.Reported = true
			recs[name] = rec
		case StartAction, ResumeAction:
			end, err := r.step(ctx, uid, d, recs, actions, report)
			if err != nil || end != nil {
				return deref(end), err
			}
		}
	}
}

func deref(e *End) End {
	if e == nil {
		return End{}
	}
	return *e
}

// step starts or resumes d.Action and records its end in recs. It returns
// an End when the action is Unfinished.
func (r *Runner) step(ctx context.Context, uid string, d Decision, recs Records, actions Actions, report ReportFunc) (*End, error) {
	name := d.Action.Name
	rec := d.Record
	if err := r.lane.acquire(ctx); err != nil {
		return nil, fmt.Errorf("%s interrupted: %w", name, err)
	}
	s := &Step{UID: uid, Action: name, Record: rec, Resumed: d.Kind == ResumeAction, recs: recs, r: r, report: report, holds: true}
	defer s.releaseLane()
	if d.Kind == StartAction {
		// Before the action: a crash from here on finds it Running.
		rec = store.Action{UID: uid, Action: name, State: store.ActionRunning}
		if err := r.store.SetAction(ctx, rec); err != nil {
			return nil, err
		}
		recs[name] = rec
		s.Record = rec
	}
	var (
		out Outcome
		err error
	)
	act, found := actions[name]
	switch {
	case !found:
		out = Fail(fmt.Sprintf("this agent has no action %q for the flow of work %s", name, uid), nil)
	case d.Kind == ResumeAction:
		if res, ok := act.(Resumer); ok {
			out, err = res.Resume(ctx, s)
		} else {
			out, err = act.Run(ctx, s)
		}
	default:
		out, err = act.Run(ctx, s)
	}
	if u, ok := errors.AsType[*Unfinished](err); ok {
		return &End{Result: nodejobwire.Running, Reason: u.Reason}, nil
	}
	if ctx.Err() != nil {
		// Interrupted (the agent stops, or the item was cancelled): record
		// no end. The action stays Running, and the next run resumes it.
		return nil, fmt.Errorf("%s interrupted: %w", name, context.Cause(ctx))
	}
	if err != nil {
		return nil, err
	}
	state := store.ActionFailed
	if out.Success {
		state = store.ActionSucceeded
	}
	rec = store.Action{UID: uid, Action: name, State: state, Reason: out.Reason, Data: out.Data}
	// After the action, before its report: a crash from here on finds it
	// ended and only reports it.
	if err := r.store.SetAction(context.WithoutCancel(ctx), rec); err != nil {
		return nil, err
	}
	recs[name] = rec
	return nil, nil
}

// Step is what an action sees of its flow while it runs.
type Step struct {
	// UID is the work item's.
	UID string
	// Action is the running action's name.
	Action string
	// Record is the action's record as this run found it: Running, with
	// the Data it saved (Save) before it was cut short when Resumed.
	Record store.Action
	// Resumed: the action was found Running (cut short), not started.
	Resumed bool

	recs   Records
	r      *Runner
	report ReportFunc
	// holds: the action holds the runner's lane.
	holds bool
}

func (s *Step) releaseLane() {
	if s.holds {
		s.holds = false
		s.r.lane.release()
	}
}

// Recorded returns the record of another action of the flow.
func (s *Step) Recorded(action string) (store.Action, bool) {
	a, ok := s.recs[action]
	return a, ok
}

// Save records data with the action still Running: what a resumed action
// needs to go on (a download's path, that a swap is about to happen).
func (s *Step) Save(ctx context.Context, data []byte) error {
	rec := store.Action{UID: s.UID, Action: s.Action, State: store.ActionRunning, Data: data}
	if err := s.r.store.SetAction(ctx, rec); err != nil {
		return err
	}
	s.recs[s.Action] = rec
	return nil
}

// Wait reports that the action waits, with reason, and gives up the
// runner's lane for the rest of the action: it waits for an operator, not
// for the machine, and the flows sharing the lane go on meanwhile.
func (s *Step) Wait(ctx context.Context, reason string) error {
	s.releaseLane()
	rep := Report{UID: s.UID, Action: s.Action, Success: true, Waiting: true, Reason: reason, Result: nodejobwire.Running, Time: s.r.clock.Now()}
	if err := s.report(ctx, rep); err != nil {
		return fmt.Errorf("report %s: %w", s.Action, err)
	}
	return nil
}
