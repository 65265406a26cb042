package agent

import (
	"context"
	"path/filepath"
	"sync"

	"github.com/drover-fleet/drover/internal/agent/prepull"
	"github.com/drover-fleet/drover/internal/agent/upgrade"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
	"github.com/drover-fleet/drover/internal/store"
)

// nodeJobRunners are the runners of node jobs (seed 000): agent upgrades
// and image pre-pulls, with their actions persisted in db.
func (a *Agent) nodeJobRunners(db *store.Store) map[string]Runner {
	up := &upgrade.Runner{StateDir: a.opts.StateDir, DB: db, CurrentVersion: a.opts.Version, Connected: a.waitConnected,
		Logger: a.log.With("runner", "upgrade")}
	pp := &prepull.Runner{StoreDir: filepath.Join(a.opts.StateDir, "images"), DB: db, Logger: a.log.With("runner", "prepull")}
	return map[string]Runner{
		nodejobwire.TypeUpgrade: &upgradeRunner{r: up},
		nodejobwire.TypePrePull: flowRunner(pp.Run),
	}
}

// finalReport adapts a Reporter-style runner to Env: Running reports go
// out as progress; the last report travels with the item's end.
type finalReport struct {
	env Env
	mu  sync.Mutex
	msg string
}

func (f *finalReport) report(ctx context.Context, phase string, r nodejobwire.Report) error {
	msg := nodejobwire.EncodeReport(r)
	if phase == nodejobwire.PhaseRunning {
		return f.env.Report(ctx, r.Action, msg)
	}
	f.mu.Lock()
	f.msg = msg
	f.mu.Unlock()
	return nil
}

func (f *finalReport) last() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.msg
}

// flowRunner runs a node job flow with progress reports.
type flowRunner func(ctx context.Context, uid string, spec []byte, report prepull.Reporter) (string, string)

func (f flowRunner) Run(ctx context.Context, w store.Work) (string, string) {
	return PhaseFailed, "a node job runs only with progress reports"
}

func (f flowRunner) RunReporting(ctx context.Context, w store.Work, env Env) (string, string, string) {
	fr := &finalReport{env: env}
	phase, reason := f(ctx, w.UID, w.Spec, fr.report)
	return phase, reason, fr.last()
}

// upgradeRunner also resumes an upgrade the agent's re-exec interrupted.
type upgradeRunner struct {
	r *upgrade.Runner

	once    sync.Once
	results map[string]upgrade.Result
	reports map[string]*finalReport
	err     error
}

func (u *upgradeRunner) Run(ctx context.Context, w store.Work) (string, string) {
	return PhaseFailed, "a node job runs only with progress reports"
}

func (u *upgradeRunner) RunReporting(ctx context.Context, w store.Work, env Env) (string, string, string) {
	fr := &finalReport{env: env}
	phase, reason := u.r.Run(ctx, w.UID, w.Spec, fr.report)
	return phase, reason, fr.last()
}

// Resume finishes every interrupted upgrade once (the runner resumes them
// together) and answers for w.
func (u *upgradeRunner) Resume(ctx context.Context, w store.Work, env Env) (string, string, string) {
	u.once.Do(func() {
		u.results, u.reports = map[string]upgrade.Result{}, map[string]*finalReport{}
		var mu sync.Mutex
		res, err := u.r.Resume(ctx, func(uid string) upgrade.Reporter {
			mu.Lock()
			defer mu.Unlock()
			fr := u.reports[uid]
			if fr == nil {
				// Reports of other items than w go out with their own end.
				fr = &finalReport{env: env}
				u.reports[uid] = fr
			}
			return fr.report
		})
		u.err = err
		for _, r := range res {
			u.results[r.UID] = r
		}
	})
	if u.err != nil {
		return PhaseFailed, "resume the upgrade: " + u.err.Error(), ""
	}
	r, ok := u.results[w.UID]
	if !ok {
		return PhaseFailed, "the agent restarted while the upgrade was running, before it changed anything", ""
	}
	msg := ""
	if fr := u.reports[w.UID]; fr != nil {
		msg = fr.last()
	}
	return r.Phase, r.Reason, msg
}

var (
	_ ReportingRunner = flowRunner(nil)
	_ ReportingRunner = (*upgradeRunner)(nil)
	_ Resumer         = (*upgradeRunner)(nil)
)
