// Package upgrade runs a node job's upgrade flow on drover-agent itself
// (KubeEdge's NodeUpgradeJob, seed 000): Check → [Confirm] →
// BackUp → Upgrade, and RollBack when Upgrade fails.
//
// # Why
//
// An agent that replaces its own binary must survive its own restart in the
// middle of the flow, and a crash at any point. The flow runs on the
// agent's action-flow runner (internal/agent/runner), which records every
// action before and after it runs: a finished action is never run again,
// only re-reported if its report did not reach the outbox. Check,
// Confirm and BackUp change nothing and run again when cut
// short; Upgrade and RollBack resume from what they saved (an Upgrade
// interrupted before its swap fails, so that RollBack runs).
//
// # How
//
// Upgrade downloads the binary (HTTP(S), or the first layer of an OCI
// artifact, raw or a tar of one file), verifies its sha256, probes it with
// `<new> --version` (argv, never a shell: DESIGN principle 6), copies it next
// to the running executable, fsyncs and renames it over it, records the
// pending upgrade (versions, backup, health deadline) and re-execs. The new
// process resumes the flow at start: once it is connected to a hub before
// the deadline, Upgrade succeeded; otherwise it renames the backup back into
// place, records the pending rollback and re-execs the old binary, which
// resumes the flow, reports RollBack and ends it Failed.
//
// # Wiring (the agent core)
//
// Per work item of type nodejobwire.TypeUpgrade the core calls
// r.Run(ctx, w.UID, w.Spec, report); for an item it finds Running at its
// start, r.ResumeItem(ctx, w.UID, report) (r.Connected blocks until the
// agent is connected). Resume does the same for every flow Interrupted
// lists, items or not. Items of type nodejobwire.TypeConfirm need a runner
// that just succeeds (Run finds them in the DB by uid while it waits at
// Confirm).
//
// # What not
//
// No k8s.io imports (drover-agent links this). No service manager
// integration: a binary that dies before Resume runs relies on the service
// manager restarting it, and then on the persisted deadline.
package upgrade

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/drover-fleet/drover/internal/agent/checks"
	"github.com/drover-fleet/drover/internal/agent/runner"
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
	"github.com/drover-fleet/drover/internal/store"
)

// Reporter sends one action report to the hub (through the agent's durable
// outbox). phase is the work item's phase after the action: nodejobwire.PhaseRunning
// while the flow goes on, else nodejobwire.PhaseSucceeded or nodejobwire.PhaseFailed. A nil
// error means the report is durable.
type Reporter = func(ctx context.Context, phase string, r nodejobwire.Report) error

// Defaults.
const (
	// DefaultHealthTimeout is how long a new binary has to connect to a hub.
	DefaultHealthTimeout = 2 * time.Minute
	// DefaultDownloadTimeout bounds a download when the job sets no timeout.
	DefaultDownloadTimeout = 10 * time.Minute
	// ProbeTimeout bounds `<new> --version`.
	ProbeTimeout = 10 * time.Second
	// DefaultConfirmPoll is how often a waiting flow looks for its
	// confirmation: a local DB read, cheap, and a human is waiting.
	DefaultConfirmPoll = time.Second
	// DefaultConfirmTimeout bounds the wait for an operator's confirmation.
	DefaultConfirmTimeout = 24 * time.Hour
	// MaxBinaryBytes bounds a download: a bigger file is not an agent.
	MaxBinaryBytes = 1 << 30
)

// Runner runs upgrade work items. Fields are read-only once Run or Resume
// has been called; zero values take the documented defaults.
type Runner struct {
	// StateDir holds backup/ and download/. Required.
	StateDir string
	// Executable is the running binary; default os.Executable with
	// symlinks resolved (the swap replaces the file, not a link to it).
	Executable string
	// CurrentVersion is the running binary's version. Required.
	CurrentVersion string
	// DB persists each action's state. Required.
	DB *store.Store
	// HTTPClient downloads (its Transport also serves OCI registries);
	// default http.DefaultClient with the job's timeout.
	HTTPClient *http.Client
	// Exec replaces the process; default syscall.Exec. Tests record the
	// call instead (a nil return then means "restarting").
	Exec func(argv0 string, argv, env []string) error
	// Args is the argv to re-exec with; default os.Args.
	Args []string
	// HealthTimeout is how long a new binary has to connect to a hub;
	// default DefaultHealthTimeout.
	HealthTimeout time.Duration
	// Connected blocks until the agent is connected to a hub, or ctx ends.
	// Resume needs it; without it a new binary is never confirmed.
	Connected func(ctx context.Context) error
	// ConfirmPoll is how often Confirm looks for the job's
	// confirmation item in the DB; default DefaultConfirmPoll.
	ConfirmPoll time.Duration
	// ConfirmTimeout bounds Confirm (it then fails); default
	// DefaultConfirmTimeout.
	ConfirmTimeout time.Duration
	// Check runs the pre-checks; default checks.Checker on Clock.
	Check func(ctx context.Context, c nodejobwire.Checks, dir string) error
	// Logger; default discard.
	Logger *slog.Logger
	// Clock is the clock of reports, deadlines and confirmation polls;
	// default clock.Real().
	Clock clock.Clock
	// Lane, shared with the node's other node-job runners, runs one action
	// at a time across their flows; Confirm gives it up while it waits.
	// Nil: no sharing.
	Lane *runner.Lane
}

func (r *Runner) setup() error {
	if r.StateDir == "" || r.DB == nil || r.CurrentVersion == "" {
		return errors.New("upgrade runner: StateDir, DB and CurrentVersion are required")
	}
	if r.Executable == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("upgrade runner: find the running binary: %w", err)
		}
		if exe, err = filepath.EvalSymlinks(exe); err != nil {
			return fmt.Errorf("upgrade runner: find the running binary: %w", err)
		}
		r.Executable = exe
	}
	if r.Exec == nil {
		r.Exec = syscall.Exec
	}
	if r.Args == nil {
		r.Args = os.Args
	}
	if r.HealthTimeout <= 0 {
		r.HealthTimeout = DefaultHealthTimeout
	}
	if r.ConfirmPoll <= 0 {
		r.ConfirmPoll = DefaultConfirmPoll
	}
	if r.ConfirmTimeout <= 0 {
		r.ConfirmTimeout = DefaultConfirmTimeout
	}
	r.Clock = clock.Or(r.Clock)
	if r.Check == nil {
		r.Check = checks.Checker{Clock: r.Clock}.Check
	}
	if r.Logger == nil {
		r.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Result is how Run or Resume left a work item: Phase is nodejobwire.PhaseRunning
// when the flow waits (for a confirmation, or for the restart it started),
// else its end.
type Result struct {
	UID, Phase, Reason string
}

// pending is the Upgrade and RollBack actions' data: what a restarted agent
// needs to finish them.
type pending struct {
	// Stage: "download" until the new binary is in place, "swapped" once it
	// is (Upgrade); "restored" once the backup is back in place (RollBack).
	Stage      string    `json:"stage"`
	From       string    `json:"from"`
	To         string    `json:"to"`
	Backup     string    `json:"backup"`
	Executable string    `json:"executable"`
	Download   string    `json:"download,omitempty"`
	Deadline   time.Time `json:"deadline,omitzero"`
	// Why the upgrade failed (RollBack).
	Why string `json:"why,omitempty"`
}

const (
	stageDownload = "download"
	stageSwapped  = "swapped"
	stageRestored = "restored"
)

func decodePending(b []byte) pending {
	var p pending
	_ = json.Unmarshal(b, &p) // our own JSON; an empty or damaged one reads as no stage
	return p
}

func (p pending) encode() []byte {
	b, _ := json.Marshal(p) // plain struct: cannot fail
	return b
}

// Run runs (or resumes) the flow of work item uid with spec (the JSON of a
// nodejobwire.UpgradeSpec) and returns nodejobwire.PhaseSucceeded or nodejobwire.PhaseFailed
// with a reason. At Confirm it blocks until the hub's
// confirmation item (nodejobwire.ConfirmUID(uid)) is in the DB, ctx ends or
// ConfirmTimeout passes. When it swaps the binary the process is replaced
// (Exec) and Run does not return; the new process calls Resume. (With a
// test Exec that returns nil, Run returns nodejobwire.PhaseRunning, "restarting".)
//
// Run is idempotent: called again for the same uid it skips the actions that
// ended (re-reporting one whose report was lost) and resumes from the first
// that did not.
func (r *Runner) Run(ctx context.Context, uid string, spec []byte, report Reporter) (phase, reason string) {
	if err := r.setup(); err != nil {
		return nodejobwire.PhaseFailed, err.Error()
	}
	s, err := nodejobwire.DecodeUpgrade(spec)
	f := nodejobwire.UpgradeFlow(err == nil && s.RequireConfirmation)
	if err != nil {
		err = fmt.Errorf("invalid spec: %w", err)
	}
	return r.run(ctx, uid, f, &job{r: r, s: s, specErr: err}, report)
}

// run runs f for uid on the action-flow runner.
func (r *Runner) run(ctx context.Context, uid string, f *nodejobwire.Flow, j *job, report Reporter) (string, string) {
	fr, err := runner.New(runner.Options{Store: r.DB, Clock: r.Clock, Lane: r.Lane})
	if err != nil {
		return nodejobwire.PhaseFailed, err.Error()
	}
	end, err := fr.Run(ctx, uid, f, j.actions(), func(ctx context.Context, rep runner.Report) error {
		return report(ctx, rep.Phase(), wireReport(rep))
	})
	if err != nil {
		return nodejobwire.PhaseFailed, err.Error()
	}
	return end.Phase(), end.Reason
}

// wireReport is the wire report of a runner report.
func wireReport(rep runner.Report) nodejobwire.Report {
	w := nodejobwire.Report{Action: rep.Action, Success: rep.Success, Running: rep.Waiting, Reason: rep.Reason, Time: rep.Time}
	p := decodePending(rep.Data)
	switch {
	case rep.Action == nodejobwire.Upgrade && rep.Success:
		w.CurrentVersion, w.HistoricVersion = p.To, p.From
	case rep.Action == nodejobwire.RollBack && rep.Success:
		w.CurrentVersion, w.HistoricVersion = p.From, p.To
	case rep.Action == nodejobwire.Confirm && rep.Success && !rep.Waiting:
		var c nodejobwire.ConfirmSpec
		_ = json.Unmarshal(rep.Data, &c) // our own JSON
		w.By = c.By
	}
	return w
}

// upgrade fetches, verifies, probes and swaps in the new binary, then
// re-execs it.
func (r *Runner) upgrade(ctx context.Context, st *runner.Step, s nodejobwire.UpgradeSpec, p pending) (runner.Outcome, error) {
	uid := st.UID
	p.Stage = stageDownload
	p.Download = filepath.Join(r.StateDir, "download", "drover-agent-"+fileSafe(s.Version))
	if err := st.Save(ctx, p.encode()); err != nil {
		return runner.Fail(err.Error(), p.encode()), nil
	}
	timeout := DefaultDownloadTimeout
	if s.TimeoutSeconds > 0 {
		timeout = time.Duration(s.TimeoutSeconds) * time.Second
	}
	if err := r.fetch(ctx, s, p.Download, timeout); err != nil {
		return runner.Fail(err.Error(), p.encode()), nil
	}
	if err := probe(ctx, r.Clock, p.Download, s.Version); err != nil {
		return runner.Fail(err.Error(), p.encode()), nil
	}
	// Record the swap before it happens: a restart after the rename finds
	// "swapped" and confirms or rolls back; one before it finds the old
	// version running, which confirm treats as a failed upgrade.
	p.Stage = stageSwapped
	p.Deadline = r.Clock.Now().Add(r.HealthTimeout)
	if err := st.Save(ctx, p.encode()); err != nil {
		return runner.Fail(err.Error(), p.encode()), nil
	}
	if err := install(p.Download, r.Executable, 0o755); err != nil {
		return runner.Fail(fmt.Sprintf("install %s: %v", s.Version, err), p.encode()), nil
	}
	r.Logger.Info("upgrade: restarting as the new version", "uid", uid, "from", p.From, "to", p.To)
	if err := r.Exec(r.Executable, r.Args, os.Environ()); err != nil {
		err = fmt.Errorf("start %s: %w", s.Version, err)
		if rerr := install(p.Backup, r.Executable, 0o755); rerr != nil {
			err = fmt.Errorf("%w; restore %s: %v", err, p.From, rerr)
		}
		p.Stage = stageDownload // the old binary is back in place
		return runner.Fail(err.Error(), p.encode()), nil
	}
	return runner.Outcome{}, &runner.Unfinished{Reason: fmt.Sprintf("restarting as %s", p.To)}
}

// confirm runs in the process started by the swap: Upgrade succeeds once it
// is connected to a hub before the deadline.
func (r *Runner) confirm(ctx context.Context, uid string, p pending) (runner.Outcome, error) {
	if r.CurrentVersion != p.To {
		return runner.Fail(fmt.Sprintf("the agent restarted as %s, not %s", r.CurrentVersion, p.To), p.encode()), nil
	}
	why := ""
	if r.Connected == nil {
		why = "this agent cannot tell whether it is connected (no Connected func)"
	} else {
		hctx, cancel := withDeadline(ctx, r.Clock, p.Deadline)
		err := r.Connected(hctx)
		if ctx.Err() == nil && errors.Is(context.Cause(hctx), context.DeadlineExceeded) {
			err = context.DeadlineExceeded
		}
		cancel()
		switch {
		case err == nil:
			_ = os.Remove(p.Download) // installed; the backup stays for a later rollback
			return runner.OK(fmt.Sprintf("upgraded from %s to %s", p.From, p.To), p.encode()), nil
		case ctx.Err() != nil:
			return runner.Outcome{}, &runner.Unfinished{Reason: fmt.Sprintf("interrupted while waiting for %s to connect", p.To)}
		default:
			why = fmt.Sprintf("%s did not connect to a hub within %s: %v", p.To, r.HealthTimeout, err)
		}
	}
	r.Logger.Warn("upgrade: new version unhealthy", "uid", uid, "why", why)
	return runner.Fail(why, p.encode()), nil
}

// withDeadline is context.WithDeadline on clk: the context ends, with
// cause context.DeadlineExceeded, once clk reaches at.
func withDeadline(ctx context.Context, clk clock.Clock, at time.Time) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	t := clk.NewTimer(at.Sub(clk.Now()))
	go func() {
		defer t.Stop()
		select {
		case <-t.Chan():
			cancel(context.DeadlineExceeded)
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(context.Canceled) }
}

// rollBack makes the old binary the running one again.
func (r *Runner) rollBack(ctx context.Context, st *runner.Step, p pending) (runner.Outcome, error) {
	uid := st.UID
	reason := fmt.Sprintf("upgrade to %s failed: %s; rolled back to %s", p.To, p.Why, p.From)
	if p.Stage == stageRestored {
		if r.CurrentVersion != p.From {
			return runner.Fail(fmt.Sprintf("rolled back to %s, but the agent runs %s (upgrade to %s failed: %s)", p.From, r.CurrentVersion, p.To, p.Why), p.encode()), nil
		}
		return runner.OK(reason, p.encode()), nil
	}
	if p.Backup == "" || p.Executable == "" {
		return runner.Fail(fmt.Sprintf("upgrade to %s failed: %s; no backup recorded to roll back to", p.To, p.Why), p.encode()), nil
	}
	same, err := sameContent(p.Backup, p.Executable)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return runner.Fail(fmt.Sprintf("upgrade to %s failed: %s; roll back: %v", p.To, p.Why, err), p.encode()), nil
	}
	if !same {
		if err := install(p.Backup, p.Executable, 0o755); err != nil {
			return runner.Fail(fmt.Sprintf("upgrade to %s failed: %s; restore %s: %v", p.To, p.Why, p.From, err), p.encode()), nil
		}
	}
	if p.Download != "" {
		_ = os.Remove(p.Download)
	}
	if r.CurrentVersion == p.From {
		return runner.OK(reason, p.encode()), nil // the old binary runs already
	}
	// The new binary runs: restart as the old one, whose Resume ends this.
	p.Stage = stageRestored
	if err := st.Save(ctx, p.encode()); err != nil {
		return runner.Fail(err.Error(), p.encode()), nil
	}
	r.Logger.Warn("upgrade: restarting as the old version", "uid", uid, "from", p.To, "to", p.From)
	if err := r.Exec(p.Executable, r.Args, os.Environ()); err != nil {
		return runner.Fail(fmt.Sprintf("upgrade to %s failed: %s; restored %s but could not start it: %v", p.To, p.Why, p.From, err), p.encode()), nil
	}
	return runner.Outcome{}, &runner.Unfinished{Reason: fmt.Sprintf("restarting as %s", p.From)}
}

// Interrupted returns the uids whose upgrade flow a restart interrupted
// (an action Running other than Confirm): Resume finishes them,
// so the agent core must neither fail nor re-run them itself.
func (r *Runner) Interrupted(ctx context.Context) ([]string, error) {
	rows, err := r.DB.ActionsInState(ctx, store.ActionRunning)
	if err != nil {
		return nil, err
	}
	var uids []string
	seen := map[string]bool{}
	for _, a := range rows {
		if a.Action == nodejobwire.Confirm || seen[a.UID] {
			continue
		}
		seen[a.UID] = true
		mine, err := r.isUpgrade(ctx, a.UID)
		if err != nil {
			return nil, err
		}
		if mine {
			uids = append(uids, a.UID)
		}
	}
	return uids, nil
}

// isUpgrade tells upgrade flows from other flows sharing work_actions (a
// pre-pull's Check): by the work item's type, or, when the hub dropped the
// item, by actions only an upgrade has.
func (r *Runner) isUpgrade(ctx context.Context, uid string) (bool, error) {
	w, found, err := r.DB.Work(ctx, uid)
	if err != nil {
		return false, err
	}
	if found {
		return w.Type == nodejobwire.TypeUpgrade, nil
	}
	rows, err := r.DB.Actions(ctx, uid)
	if err != nil {
		return false, err
	}
	for _, a := range rows {
		switch a.Action {
		case nodejobwire.BackUp, nodejobwire.Upgrade, nodejobwire.RollBack, nodejobwire.Confirm:
			return true, nil
		}
	}
	return false, nil
}

// Resume finishes, at the agent's start, every upgrade flow a restart
// interrupted (see Interrupted): the new binary confirms its upgrade once
// connected (r.Connected) or rolls back, the old one reports its rollback,
// and an action cut short by a crash is resumed or fails into RollBack.
// It may block up to HealthTimeout, and re-exec the process. Results have
// Phase nodejobwire.PhaseRunning when a restart was started (tests only).
// reporter gives the Reporter of each uid (a Reporter does not name its item).
func (r *Runner) Resume(ctx context.Context, reporter func(uid string) Reporter) ([]Result, error) {
	if err := r.setup(); err != nil {
		return nil, err
	}
	uids, err := r.Interrupted(ctx)
	if err != nil {
		return nil, err
	}
	var results []Result
	for _, uid := range uids {
		phase, reason := r.resume(ctx, uid, reporter(uid))
		results = append(results, Result{UID: uid, Phase: phase, Reason: reason})
	}
	return results, nil
}

// resume finishes uid's interrupted flow. No spec here: Check,
// Confirm and BackUp, which need it, fail if they were the ones
// interrupted (nothing changed yet).
func (r *Runner) resume(ctx context.Context, uid string, report Reporter) (string, string) {
	return r.run(ctx, uid, nodejobwire.UpgradeFlow(false), &job{r: r, specErr: errors.New("the agent restarted during this action")}, report)
}

// ResumeItem is Resume for the one work item uid, which the agent found
// Running at its start: it finishes the flow if a restart interrupted it,
// and otherwise (it was waiting for a confirmation, or had not started an
// action) fails it: the agent restarted before it changed anything.
func (r *Runner) ResumeItem(ctx context.Context, uid string, report Reporter) (phase, reason string) {
	if err := r.setup(); err != nil {
		return nodejobwire.PhaseFailed, err.Error()
	}
	rows, err := r.DB.Actions(ctx, uid)
	if err != nil {
		return nodejobwire.PhaseFailed, "resume the upgrade: " + err.Error()
	}
	for _, a := range rows {
		if a.State == store.ActionRunning && a.Action != nodejobwire.Confirm {
			return r.resume(ctx, uid, report)
		}
	}
	return nodejobwire.PhaseFailed, "the agent restarted while the upgrade was running, before it changed anything"
}
