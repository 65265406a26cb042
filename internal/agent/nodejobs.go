package agent

import (
	"context"
	"path/filepath"

	"github.com/drover-fleet/drover/internal/agent/prepull"
	"github.com/drover-fleet/drover/internal/agent/upgrade"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
	"github.com/drover-fleet/drover/internal/store"
)

// nodeJobRunners are the runners of node jobs (seed 000): agent upgrades
// and image pre-pulls. Both run their flows on internal/agent/runner, with
// their actions persisted in db.
func (a *Agent) nodeJobRunners(db *store.Store) map[string]Runner {
	up := &upgrade.Runner{StateDir: a.opts.StateDir, DB: db, CurrentVersion: a.opts.Version, Connected: a.waitConnected,
		Clock: a.opts.Clock, Logger: a.log.With("runner", "upgrade")}
	pp := &prepull.Runner{StoreDir: filepath.Join(a.opts.StateDir, "images"), DB: db, Clock: a.opts.Clock,
		Logger: a.log.With("runner", "prepull")}
	return map[string]Runner{
		// A resumed upgrade needs no credentials: it resumes past the download.
		nodejobwire.TypeUpgrade: resumingFlow{run: a.withCredentials(up.Run), resume: up.ResumeItem},
		nodejobwire.TypePrePull: a.withCredentials(pp.Run),
	}
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

// resumingFlow is a flowRunner whose items outlive the agent process (an
// upgrade re-execs the agent): an item found Running at start is resumed.
type resumingFlow struct {
	run    flowRunner
	resume func(ctx context.Context, uid string, report reportFunc) (string, string)
}

func (r resumingFlow) Run(ctx context.Context, w store.Work) (string, string) {
	return r.run.Run(ctx, w)
}

func (r resumingFlow) RunReporting(ctx context.Context, w store.Work, env Env) (string, string, string) {
	return r.run.RunReporting(ctx, w, env)
}

func (r resumingFlow) Resume(ctx context.Context, w store.Work, env Env) (string, string, string) {
	return withReports(env, func(report reportFunc) (string, string) { return r.resume(ctx, w.UID, report) })
}

var (
	_ ReportingRunner = flowRunner(nil)
	_ ReportingRunner = resumingFlow{}
	_ Resumer         = resumingFlow{}
)
