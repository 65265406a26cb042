package upgrade

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/drover-fleet/drover/internal/agent/runner"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
)

// job is one upgrade flow's actions. specErr, when set, fails any action
// that needs the spec (an invalid spec, or none when Resume finishes a flow).
type job struct {
	r       *Runner
	s       nodejobwire.UpgradeSpec
	specErr error
}

// actions: Check, Confirm and BackUp change nothing and run
// again when cut short; Upgrade and RollBack resume from what they saved.
func (j *job) actions() runner.Actions {
	return runner.Actions{
		nodejobwire.Check:    runner.ActionFunc(j.check),
		nodejobwire.Confirm:  runner.ActionFunc(j.waitConfirmation),
		nodejobwire.BackUp:   runner.ActionFunc(j.backUp),
		nodejobwire.Upgrade:  runner.WithResume(j.upgrade, j.resumeUpgrade),
		nodejobwire.RollBack: runner.WithResume(j.rollBack, j.resumeRollBack),
	}
}

func (j *job) check(ctx context.Context, _ *runner.Step) (runner.Outcome, error) {
	if j.specErr != nil {
		return runner.Fail(j.specErr.Error(), nil), nil
	}
	if err := j.r.Check(ctx, j.s.Checks, j.r.StateDir); err != nil {
		return runner.Fail(err.Error(), nil), nil
	}
	return runner.OK("checks passed", nil), nil
}

func (j *job) backUp(context.Context, *runner.Step) (runner.Outcome, error) {
	if j.specErr != nil {
		return runner.Fail(j.specErr.Error(), nil), nil
	}
	r := j.r
	backup := filepath.Join(r.StateDir, "backup", "drover-agent-"+fileSafe(r.CurrentVersion))
	p := pending{From: r.CurrentVersion, To: j.s.Version, Backup: backup, Executable: r.Executable}
	if err := install(r.Executable, backup, 0o755); err != nil {
		return runner.Fail(fmt.Sprintf("back up %s: %v", r.Executable, err), p.encode()), nil
	}
	return runner.OK(fmt.Sprintf("backed up %s to %s", r.CurrentVersion, backup), p.encode()), nil
}

// waitConfirmation holds the flow until the job is confirmed for this node:
// the hub dispatches an item with uid nodejobwire.ConfirmUID(uid), which the agent
// stores while this item runs (or a spec says Confirmed). It polls the DB
// every ConfirmPoll, for at most ConfirmTimeout. While it waits it gives up
// the node-job lane (Step.Wait): the node's other node jobs go on. Its end
// names who confirmed (the confirmation's ConfirmSpec.By). Stopped, it
// records no end: a later Run waits again.
func (j *job) waitConfirmation(ctx context.Context, st *runner.Step) (runner.Outcome, error) {
	if j.specErr != nil {
		return runner.Fail(j.specErr.Error(), nil), nil
	}
	r := j.r
	var by string
	confirmed := func() (bool, error) {
		if j.s.Confirmed {
			return true, nil
		}
		w, found, err := r.DB.Work(ctx, nodejobwire.ConfirmUID(st.UID))
		if found {
			var c nodejobwire.ConfirmSpec
			_ = json.Unmarshal(w.Spec, &c) // the hub's JSON; without it, who is unknown
			by = nodejobwire.Clip(c.By, 253)
		}
		return found, err
	}
	ok := func() runner.Outcome {
		reason := "confirmed"
		if by != "" {
			reason = "confirmed by " + by
		}
		data, _ := json.Marshal(nodejobwire.ConfirmSpec{By: by})
		return runner.OK(reason, data)
	}
	if yes, err := confirmed(); err != nil || yes {
		return ok(), err
	}
	if err := st.Wait(ctx, "waiting for confirmation"); err != nil {
		return runner.Outcome{}, err
	}
	tick := r.Clock.NewTicker(r.ConfirmPoll)
	defer tick.Stop()
	limit := r.Clock.NewTimer(r.ConfirmTimeout)
	defer limit.Stop()
	for {
		select {
		case <-ctx.Done():
			return runner.Outcome{}, ctx.Err()
		case <-limit.Chan():
			return runner.Fail(fmt.Sprintf("not confirmed within %s", r.ConfirmTimeout), nil), nil
		case <-tick.Chan():
			if yes, err := confirmed(); err != nil || yes {
				return ok(), err
			}
		}
	}
}

// upgrade starts the Upgrade from BackUp's record.
func (j *job) upgrade(ctx context.Context, st *runner.Step) (runner.Outcome, error) {
	backup, _ := st.Recorded(nodejobwire.BackUp)
	p := decodePending(backup.Data)
	if j.specErr != nil {
		return runner.Fail(j.specErr.Error(), p.encode()), nil
	}
	return j.r.upgrade(ctx, st, j.s, p)
}

// resumeUpgrade finishes an Upgrade a restart cut short.
func (j *job) resumeUpgrade(ctx context.Context, st *runner.Step) (runner.Outcome, error) {
	p := decodePending(st.Record.Data)
	if p.Stage == stageSwapped {
		return j.r.confirm(ctx, st.UID, p)
	}
	// Restarted before the swap: the running binary is still the old one.
	// Failing sends the flow to RollBack, which checks that.
	return runner.Fail(fmt.Sprintf("the agent restarted during the upgrade to %s, before the new binary was in place", p.To), p.encode()), nil
}

// rollBack starts the RollBack from the failed Upgrade's record.
func (j *job) rollBack(ctx context.Context, st *runner.Step) (runner.Outcome, error) {
	up, _ := st.Recorded(nodejobwire.Upgrade)
	p := decodePending(up.Data)
	p.Why = up.Reason
	return j.r.rollBack(ctx, st, p)
}

// resumeRollBack finishes a RollBack: in the old binary once the backup is
// back in place (restored), else from the start.
func (j *job) resumeRollBack(ctx context.Context, st *runner.Step) (runner.Outcome, error) {
	if q := decodePending(st.Record.Data); q.Stage == stageRestored {
		return j.r.rollBack(ctx, st, q)
	}
	return j.rollBack(ctx, st)
}
