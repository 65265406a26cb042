package agent

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/drover-fleet/drover/internal/agent/prepull"
	"github.com/drover-fleet/drover/internal/agent/runner"
	"github.com/drover-fleet/drover/internal/agent/taskexec"
	"github.com/drover-fleet/drover/internal/agent/upgrade"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
	"github.com/drover-fleet/drover/internal/store"
)

// nodeJobRunners are the runners of node jobs (seed 000): agent upgrades
// and image pre-pulls. Both run their flows on internal/agent/runner, with
// their actions persisted in db.
//
// Their items run beside the work loop (ConcurrentRunner), and their
// actions take turns on one lane: an upgrade waiting up to a day at
// Confirm gives the lane up, so the node's other node jobs (and every
// other item) go on meanwhile, while two flows never change the machine at
// once.
func (a *Agent) nodeJobRunners(db *store.Store) map[string]Runner {
	lane := runner.NewLane()
	up := &upgrade.Runner{StateDir: a.opts.StateDir, DB: db, CurrentVersion: a.opts.Version, Connected: a.waitConnected,
		Clock: a.opts.Clock, Logger: a.log.With("runner", "upgrade"), Lane: lane}
	pp := &prepull.Runner{StoreDir: filepath.Join(a.opts.StateDir, "images"), DB: db, Clock: a.opts.Clock,
		Logger: a.log.With("runner", "prepull"), Lane: lane}
	if c := a.opts.Containerd; c != nil {
		pp.Import = func(ctx context.Context, image string) error {
			// Looked at per image: containerd may be installed later.
			if err := c.Available(); err != nil {
				return fmt.Errorf("%w: %v", prepull.ErrNoRuntime, err)
			}
			return importIntoContainerd(ctx, c, pp.StoreDir, image)
		}
	}
	pull := a.withCredentials(pp.Run)
	return map[string]Runner{
		// A resumed upgrade needs no credentials: it resumes past the download.
		nodejobwire.TypeUpgrade: concurrentFlow{run: a.withCredentials(up.Run), resume: func(ctx context.Context, w store.Work, report reportFunc) (string, string) {
			return up.ResumeItem(ctx, w.UID, report)
		}},
		// A pre-pull's actions are safe to repeat: resumed, it runs again
		// from its records.
		nodejobwire.TypePrePull: concurrentFlow{run: pull, resume: func(ctx context.Context, w store.Work, report reportFunc) (string, string) {
			return pull(ctx, w.UID, w.Spec, report)
		}},
	}
}

// concurrentFlow runs a node job flow as a ConcurrentRunner.
type concurrentFlow struct {
	run    flowRunner
	resume func(ctx context.Context, w store.Work, report reportFunc) (string, string)
}

func (c concurrentFlow) Run(ctx context.Context, w store.Work) (string, string) {
	return c.run.Run(ctx, w)
}

func (c concurrentFlow) RunReporting(ctx context.Context, w store.Work, env Env) (string, string, string) {
	phase, reason, message := withReports(env, func(report reportFunc) (string, string) { return c.run(ctx, w.UID, w.Spec, report) })
	return ended(ctx, phase, reason, message)
}

func (c concurrentFlow) Resume(ctx context.Context, w store.Work, env Env) (string, string, string) {
	phase, reason, message := withReports(env, func(report reportFunc) (string, string) { return c.resume(ctx, w, report) })
	return ended(ctx, phase, reason, message)
}

func (concurrentFlow) RunsConcurrently() {}

// ended is how a flow's item ends once its run returned: Cancelled when
// the hub cancelled it, still Running (resumed after the next start: the
// records make that safe) when the agent is stopping, else the flow's
// verdict.
func ended(ctx context.Context, phase, reason, message string) (string, string, string) {
	switch {
	case ctx.Err() == nil || phase == PhaseSucceeded:
		return phase, reason, message
	case errors.Is(context.Cause(ctx), ErrCancelled):
		return PhaseCancelled, reason, message
	}
	return PhaseRunning, reason, message
}

// reportFunc is the progress callback of a node job's flow: phase is the
// item's phase after the report.
type reportFunc = func(ctx context.Context, phase string, r nodejobwire.Report) error

// withReports runs a node job flow with env: Running reports go out as
// progress; the last report (the flow's end) travels with the item's end,
// as its message.
func withReports(env Env, run func(reportFunc) (phase, reason string)) (phase, reason, message string) {
	phase, reason = run(func(ctx context.Context, p string, r nodejobwire.Report) error {
		msg := nodejobwire.EncodeReport(r)
		if p == nodejobwire.PhaseRunning {
			return env.Report(ctx, r.Action, msg)
		}
		message = msg
		return nil
	})
	return phase, reason, message
}

// flowRunner runs a node job flow with progress reports.
type flowRunner func(ctx context.Context, uid string, spec []byte, report reportFunc) (string, string)

func (f flowRunner) Run(context.Context, store.Work) (string, string) {
	return PhaseFailed, "a node job runs only with progress reports"
}

func (f flowRunner) RunReporting(ctx context.Context, w store.Work, env Env) (string, string, string) {
	return withReports(env, func(report reportFunc) (string, string) { return f(ctx, w.UID, w.Spec, report) })
}

var (
	_ ReportingRunner  = flowRunner(nil)
	_ ConcurrentRunner = concurrentFlow{}
)

// importIntoContainerd runs the containerd companion's import of image from
// the pre-pull store: an argv, never a shell, bounded in time.
func importIntoContainerd(ctx context.Context, c *taskexec.Containerd, store, image string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.Companion, "import", "--address", c.Address, "--namespace", c.Namespace,
		"--layout", store, "--image", image)
	out, err := cmd.CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if len(msg) > 512 {
			msg = msg[len(msg)-512:]
		}
		return fmt.Errorf("%s import %s: %w: %s", c.Companion, image, err, msg)
	}
	return nil
}
