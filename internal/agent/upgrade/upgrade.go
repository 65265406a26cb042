// Package upgrade runs a node job's upgrade flow on drover-agent itself
// (KubeEdge's NodeUpgradeJob, seed 000): Check → [WaitingConfirmation] →
// BackUp → Upgrade, and RollBack when Upgrade fails.
//
// # Why
//
// An agent that replaces its own binary must survive its own restart in the
// middle of the flow, and a crash at any point. So every action's state is
// persisted in the agent DB (store.Action rows) before and after it runs; a
// finished action is never run again, only re-reported if its report did not
// reach the outbox; and an interrupted one is resumed (Check, BackUp and
// RollBack are safe to repeat) or, for an Upgrade interrupted before its
// swap, failed so that RollBack runs.
//
// # How
//
// Upgrade downloads the binary (HTTP(S), or the first layer of an OCI
// artifact, raw or a tar of one file), verifies its sha256, probes it with
// `<new> --version` (argv, never a shell: DESIGN principle 6), copies it next
// to the running executable, fsyncs and renames it over it, records the
// pending upgrade (versions, backup, health deadline) and re-execs. The new
// process calls Resume at start: once it is connected to a hub before the
// deadline, Upgrade succeeded; otherwise it renames the backup back into
// place, records the pending rollback and re-execs the old binary, whose
// Resume reports RollBack and ends the flow Failed.
//
// # Wiring (the agent core)
//
// At start, after opening the DB: uids, _ := r.Interrupted(ctx) are the
// upgrade items a restart cut short (or that restarted on purpose); the core
// must neither fail nor re-run them, and runs go r.Resume(ctx, reporterFor) once
// its connection loop is started (r.Connected blocks until connected;
// reporterFor(uid) is the item's Reporter), then
// records each Result as the item's end. Per work item of type
// nodejobwire.TypeUpgrade it calls r.Run(ctx, w.UID, w.Spec, report); items of
// type nodejobwire.TypeConfirm need a runner that just succeeds (Run finds them in
// the DB by uid while it waits at WaitingConfirmation).
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
	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
	"github.com/drover-fleet/drover/internal/store"
)

// Reporter sends one action report to the hub (through the agent's durable
// outbox). phase is the work item's phase after the action: nodejobwire.PhaseRunning
// while the flow goes on, else nodejobwire.PhaseSucceeded or nodejobwire.PhaseFailed. A nil
// error means the report is durable.
type Reporter func(ctx context.Context, phase string, r nodejobwire.Report) error

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
	// ConfirmPoll is how often WaitingConfirmation looks for the job's
	// confirmation item in the DB; default DefaultConfirmPoll.
	ConfirmPoll time.Duration
	// ConfirmTimeout bounds WaitingConfirmation (it then fails); default
	// DefaultConfirmTimeout.
	ConfirmTimeout time.Duration
	// Check runs the pre-checks; default checks.Check.
	Check func(ctx context.Context, c nodejobwire.Checks, dir string) error
	// Logger; default discard.
	Logger *slog.Logger
	// Now is the clock of reports and deadlines; default time.Now.
	Now func() time.Time
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
	if r.Check == nil {
		r.Check = checks.Check
	}
	if r.Logger == nil {
		r.Logger = slog.New(slog.DiscardHandler)
	}
	if r.Now == nil {
		r.Now = time.Now
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

// outcome is one action's end, or a stop of the flow (stop=true: the
// flow waits and Run returns phase/reason without recording an end).
type outcome struct {
	success bool
	reason  string
	data    []byte
	stop    bool
	phase   string
}

func ok(reason string, data []byte) outcome {
	return outcome{success: true, reason: reason, data: data}
}
func bad(reason string, data []byte) outcome { return outcome{reason: reason, data: data} }
func stop(phase, reason string) outcome      { return outcome{stop: true, phase: phase, reason: reason} }

// Run runs (or resumes) the flow of work item uid with spec (the JSON of a
// nodejobwire.UpgradeSpec) and returns nodejobwire.PhaseSucceeded or nodejobwire.PhaseFailed
// with a reason. At WaitingConfirmation it blocks until the hub's
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
	return r.run(ctx, uid, f, s, err, report)
}

// run walks f for uid. specErr, when set, fails any action that needs the
// spec (an invalid spec, or none when Resume finishes a flow).
func (r *Runner) run(ctx context.Context, uid string, f *nodejobwire.Flow, s nodejobwire.UpgradeSpec, specErr error, report Reporter) (string, string) {
	rows, err := r.DB.Actions(ctx, uid)
	if err != nil {
		return nodejobwire.PhaseFailed, err.Error()
	}
	done := map[string]store.Action{}
	for _, a := range rows {
		done[a.Action] = a
	}
	for a := f.First; a != nil; {
		row, seen := done[a.Name]
		var out outcome
		if seen && row.State != store.ActionRunning {
			out = outcome{success: row.State == store.ActionSucceeded, reason: row.Reason, data: row.Data}
		} else {
			if !seen {
				// Before the action: a crash from here on finds it Running.
				row = store.Action{UID: uid, Action: a.Name, State: store.ActionRunning}
				if err := r.DB.SetAction(ctx, row); err != nil {
					return nodejobwire.PhaseFailed, err.Error()
				}
			}
			out = r.do(ctx, uid, a.Name, seen, done, s, specErr, report)
			if out.stop {
				return out.phase, out.reason
			}
			if ctx.Err() != nil {
				// Interrupted (the agent stops, or the item was cancelled):
				// record no end. The action stays Running, so the next start's
				// Resume finishes it as after a crash (an Upgrade cut short
				// before its swap goes to RollBack).
				return nodejobwire.PhaseFailed, fmt.Sprintf("%s interrupted: %v", a.Name, context.Cause(ctx))
			}
			state := store.ActionFailed
			if out.success {
				state = store.ActionSucceeded
			}
			row = store.Action{UID: uid, Action: a.Name, State: state, Reason: out.reason, Data: out.data}
			// After the action, before its report: a crash from here on
			// finds it ended and only re-reports it.
			if err := r.DB.SetAction(context.WithoutCancel(ctx), row); err != nil {
				return nodejobwire.PhaseFailed, err.Error()
			}
			done[a.Name] = row
		}
		res := nodejobwire.After(a, out.success)
		phase := map[nodejobwire.Result]string{nodejobwire.Running: nodejobwire.PhaseRunning, nodejobwire.Succeeded: nodejobwire.PhaseSucceeded, nodejobwire.Failed: nodejobwire.PhaseFailed}[res]
		if !row.Reported {
			if err := report(ctx, phase, r.report(a.Name, out)); err != nil {
				return nodejobwire.PhaseFailed, fmt.Sprintf("report %s: %v", a.Name, err)
			}
			if err := r.DB.MarkActionReported(context.WithoutCancel(ctx), uid, a.Name); err != nil {
				return nodejobwire.PhaseFailed, err.Error()
			}
		}
		if res != nodejobwire.Running {
			return phase, out.reason
		}
		a = a.Next(out.success)
	}
	return nodejobwire.PhaseFailed, "empty flow" // cannot happen: flows have a first action
}

// report is the wire report of an action's end.
func (r *Runner) report(action string, out outcome) nodejobwire.Report {
	rep := nodejobwire.Report{Action: action, Success: out.success, Reason: out.reason, Time: r.Now()}
	p := decodePending(out.data)
	switch {
	case action == nodejobwire.Upgrade && out.success:
		rep.CurrentVersion, rep.HistoricVersion = p.To, p.From
	case action == nodejobwire.RollBack && out.success:
		rep.CurrentVersion, rep.HistoricVersion = p.From, p.To
	}
	return rep
}

// do runs one action. interrupted says it was recorded Running before this
// call (a restart cut it short, or it waits); done holds the flow's records.
func (r *Runner) do(ctx context.Context, uid, action string, interrupted bool, done map[string]store.Action,
	s nodejobwire.UpgradeSpec, specErr error, report Reporter) outcome {
	row := done[action]
	switch action {
	case nodejobwire.Check:
		if specErr != nil {
			return bad(specErr.Error(), nil)
		}
		if err := r.Check(ctx, s.Checks, r.StateDir); err != nil {
			return bad(err.Error(), nil)
		}
		return ok("checks passed", nil)

	case nodejobwire.WaitingConfirmation:
		if specErr != nil {
			return bad(specErr.Error(), nil)
		}
		return r.waitConfirmation(ctx, uid, s, report)

	case nodejobwire.BackUp:
		if specErr != nil {
			return bad(specErr.Error(), nil)
		}
		backup := filepath.Join(r.StateDir, "backup", "drover-agent-"+fileSafe(r.CurrentVersion))
		p := pending{From: r.CurrentVersion, To: s.Version, Backup: backup, Executable: r.Executable}
		if err := install(r.Executable, backup, 0o755); err != nil {
			return bad(fmt.Sprintf("back up %s: %v", r.Executable, err), p.encode())
		}
		return ok(fmt.Sprintf("backed up %s to %s", r.CurrentVersion, backup), p.encode())

	case nodejobwire.Upgrade:
		p := decodePending(done[nodejobwire.BackUp].Data)
		if interrupted {
			p = decodePending(row.Data)
		}
		switch {
		case p.Stage == stageSwapped:
			return r.confirm(ctx, uid, p)
		case interrupted:
			// Restarted before the swap: the running binary is still the old
			// one. Failing sends the flow to RollBack, which checks that.
			return bad(fmt.Sprintf("the agent restarted during the upgrade to %s, before the new binary was in place", p.To), p.encode())
		}
		if specErr != nil {
			return bad(specErr.Error(), p.encode())
		}
		return r.upgrade(ctx, uid, s, p)

	case nodejobwire.RollBack:
		p := decodePending(done[nodejobwire.Upgrade].Data)
		p.Why = done[nodejobwire.Upgrade].Reason
		if interrupted {
			if q := decodePending(row.Data); q.Stage == stageRestored {
				p = q
			}
		}
		return r.rollBack(ctx, uid, p)
	}
	return bad(fmt.Sprintf("unknown action %q", action), nil)
}

// waitConfirmation holds the flow until the job is confirmed for this node:
// the hub dispatches an item with uid nodejobwire.ConfirmUID(uid), which the agent
// stores while this item runs (or a spec says Confirmed). It polls the DB
// every ConfirmPoll, for at most ConfirmTimeout.
func (r *Runner) waitConfirmation(ctx context.Context, uid string, s nodejobwire.UpgradeSpec, report Reporter) outcome {
	confirmed := func() (bool, error) {
		if s.Confirmed {
			return true, nil
		}
		_, found, err := r.DB.Work(ctx, nodejobwire.ConfirmUID(uid))
		return found, err
	}
	if yes, err := confirmed(); err != nil || yes {
		if err != nil {
			return stop(nodejobwire.PhaseFailed, err.Error())
		}
		return ok("confirmed", nil)
	}
	rep := nodejobwire.Report{Action: nodejobwire.WaitingConfirmation, Success: true, Running: true, Reason: "waiting for confirmation", Time: r.Now()}
	if err := report(ctx, nodejobwire.PhaseRunning, rep); err != nil {
		return stop(nodejobwire.PhaseFailed, fmt.Sprintf("report %s: %v", nodejobwire.WaitingConfirmation, err))
	}
	tick := time.NewTicker(r.ConfirmPoll)
	defer tick.Stop()
	limit := time.NewTimer(r.ConfirmTimeout)
	defer limit.Stop()
	for {
		select {
		case <-ctx.Done():
			// No end recorded: a later Run waits again.
			return stop(nodejobwire.PhaseFailed, fmt.Sprintf("%s interrupted: %v", nodejobwire.WaitingConfirmation, context.Cause(ctx)))
		case <-limit.C:
			return bad(fmt.Sprintf("not confirmed within %s", r.ConfirmTimeout), nil)
		case <-tick.C:
			yes, err := confirmed()
			if err != nil && ctx.Err() == nil {
				return stop(nodejobwire.PhaseFailed, err.Error())
			}
			if yes {
				return ok("confirmed", nil)
			}
		}
	}
}

// upgrade fetches, verifies, probes and swaps in the new binary, then
// re-execs it.
func (r *Runner) upgrade(ctx context.Context, uid string, s nodejobwire.UpgradeSpec, p pending) outcome {
	p.Stage = stageDownload
	p.Download = filepath.Join(r.StateDir, "download", "drover-agent-"+fileSafe(s.Version))
	if err := r.DB.SetAction(ctx, store.Action{UID: uid, Action: nodejobwire.Upgrade, State: store.ActionRunning, Data: p.encode()}); err != nil {
		return bad(err.Error(), p.encode())
	}
	timeout := DefaultDownloadTimeout
	if s.TimeoutSeconds > 0 {
		timeout = time.Duration(s.TimeoutSeconds) * time.Second
	}
	if err := r.fetch(ctx, s, p.Download, timeout); err != nil {
		return bad(err.Error(), p.encode())
	}
	if err := probe(ctx, p.Download, s.Version); err != nil {
		return bad(err.Error(), p.encode())
	}
	// Record the swap before it happens: a restart after the rename finds
	// "swapped" and confirms or rolls back; one before it finds the old
	// version running, which confirm treats as a failed upgrade.
	p.Stage = stageSwapped
	p.Deadline = r.Now().Add(r.HealthTimeout)
	if err := r.DB.SetAction(ctx, store.Action{UID: uid, Action: nodejobwire.Upgrade, State: store.ActionRunning, Data: p.encode()}); err != nil {
		return bad(err.Error(), p.encode())
	}
	if err := install(p.Download, r.Executable, 0o755); err != nil {
		return bad(fmt.Sprintf("install %s: %v", s.Version, err), p.encode())
	}
	r.Logger.Info("upgrade: restarting as the new version", "uid", uid, "from", p.From, "to", p.To)
	if err := r.Exec(r.Executable, r.Args, os.Environ()); err != nil {
		err = fmt.Errorf("start %s: %w", s.Version, err)
		if rerr := install(p.Backup, r.Executable, 0o755); rerr != nil {
			err = fmt.Errorf("%w; restore %s: %v", err, p.From, rerr)
		}
		p.Stage = stageDownload // the old binary is back in place
		return bad(err.Error(), p.encode())
	}
	return stop(nodejobwire.PhaseRunning, fmt.Sprintf("restarting as %s", p.To))
}

// confirm runs in the process started by the swap: Upgrade succeeds once it
// is connected to a hub before the deadline.
func (r *Runner) confirm(ctx context.Context, uid string, p pending) outcome {
	if r.CurrentVersion != p.To {
		return bad(fmt.Sprintf("the agent restarted as %s, not %s", r.CurrentVersion, p.To), p.encode())
	}
	why := ""
	if r.Connected == nil {
		why = "this agent cannot tell whether it is connected (no Connected func)"
	} else {
		hctx, cancel := context.WithDeadline(ctx, p.Deadline)
		err := r.Connected(hctx)
		cancel()
		switch {
		case err == nil:
			_ = os.Remove(p.Download) // installed; the backup stays for a later rollback
			return ok(fmt.Sprintf("upgraded from %s to %s", p.From, p.To), p.encode())
		case ctx.Err() != nil:
			return stop(nodejobwire.PhaseRunning, fmt.Sprintf("interrupted while waiting for %s to connect", p.To))
		default:
			why = fmt.Sprintf("%s did not connect to a hub within %s: %v", p.To, r.HealthTimeout, err)
		}
	}
	r.Logger.Warn("upgrade: new version unhealthy", "uid", uid, "why", why)
	return bad(why, p.encode())
}

// rollBack makes the old binary the running one again.
func (r *Runner) rollBack(ctx context.Context, uid string, p pending) outcome {
	reason := fmt.Sprintf("upgrade to %s failed: %s; rolled back to %s", p.To, p.Why, p.From)
	if p.Stage == stageRestored {
		if r.CurrentVersion != p.From {
			return bad(fmt.Sprintf("rolled back to %s, but the agent runs %s (upgrade to %s failed: %s)", p.From, r.CurrentVersion, p.To, p.Why), p.encode())
		}
		return ok(reason, p.encode())
	}
	if p.Backup == "" || p.Executable == "" {
		return bad(fmt.Sprintf("upgrade to %s failed: %s; no backup recorded to roll back to", p.To, p.Why), p.encode())
	}
	same, err := sameContent(p.Backup, p.Executable)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return bad(fmt.Sprintf("upgrade to %s failed: %s; roll back: %v", p.To, p.Why, err), p.encode())
	}
	if !same {
		if err := install(p.Backup, p.Executable, 0o755); err != nil {
			return bad(fmt.Sprintf("upgrade to %s failed: %s; restore %s: %v", p.To, p.Why, p.From, err), p.encode())
		}
	}
	if p.Download != "" {
		_ = os.Remove(p.Download)
	}
	if r.CurrentVersion == p.From {
		return ok(reason, p.encode()) // the old binary runs already
	}
	// The new binary runs: restart as the old one, whose Resume ends this.
	p.Stage = stageRestored
	if err := r.DB.SetAction(ctx, store.Action{UID: uid, Action: nodejobwire.RollBack, State: store.ActionRunning, Data: p.encode()}); err != nil {
		return bad(err.Error(), p.encode())
	}
	r.Logger.Warn("upgrade: restarting as the old version", "uid", uid, "from", p.To, "to", p.From)
	if err := r.Exec(p.Executable, r.Args, os.Environ()); err != nil {
		return bad(fmt.Sprintf("upgrade to %s failed: %s; restored %s but could not start it: %v", p.To, p.Why, p.From, err), p.encode())
	}
	return stop(nodejobwire.PhaseRunning, fmt.Sprintf("restarting as %s", p.From))
}

// Interrupted returns the uids whose upgrade flow a restart interrupted
// (an action Running other than WaitingConfirmation): Resume finishes them,
// so the agent core must neither fail nor re-run them itself.
func (r *Runner) Interrupted(ctx context.Context) ([]string, error) {
	rows, err := r.DB.ActionsInState(ctx, store.ActionRunning)
	if err != nil {
		return nil, err
	}
	var uids []string
	seen := map[string]bool{}
	for _, a := range rows {
		if a.Action == nodejobwire.WaitingConfirmation || seen[a.UID] {
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
		case nodejobwire.BackUp, nodejobwire.Upgrade, nodejobwire.RollBack, nodejobwire.WaitingConfirmation:
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
		// No spec here: Check, WaitingConfirmation and BackUp, which need
		// it, fail if they were the ones interrupted (nothing changed yet).
		phase, reason := r.run(ctx, uid, nodejobwire.UpgradeFlow(false), nodejobwire.UpgradeSpec{},
			errors.New("the agent restarted during this action"), reporter(uid))
		results = append(results, Result{UID: uid, Phase: phase, Reason: reason})
	}
	return results, nil
}
