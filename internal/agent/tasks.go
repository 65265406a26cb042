package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/drover-fleet/drover/internal/agent/taskexec"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/store"
	taskwire "github.com/drover-fleet/drover/internal/task/taskwire"
)

// execAction is the work_actions row of a task attempt: written before its
// process starts (Running, no info), once it runs (Running, with the pid
// and start ticks to find it after a restart), and at its end (Succeeded or
// Failed, with the result, so a restart between the end and its report
// neither loses nor repeats it).
const execAction = "Exec"

// execRecord is the data of an execAction row.
type execRecord struct {
	Info   *taskexec.Info   `json:"info,omitempty"`
	Result *taskexec.Result `json:"result,omitempty"`
}

// taskSet is the task runners and what to close when the agent stops.
type taskSet struct {
	runners map[string]Runner
	close   func()
	// driver runs the tasks' processes, and the serverless instances'.
	driver *taskexec.Driver
}

// taskRunners are the runners of tasks (batch.drover.io, seed 001): the exec
// driver, its processes recorded in db.
func (a *Agent) taskRunners(ctx context.Context, db *store.Store) (taskSet, error) {
	log := a.log.With("runner", taskwire.TypeExec)
	// An attempt's dir outlives the work item: the hub drops finished
	// items from its snapshots, and `drover logs` reads an ended attempt's
	// logs until the retention period is over.
	d, err := taskexec.New(taskexec.Options{StateDir: a.opts.StateDir, WorkDir: a.opts.WorkDir, TaskUser: a.opts.TaskUser,
		AllowRoot: a.opts.AllowRootTasks, Logger: log,
		Retention: a.opts.TaskRetention, MaxArtifactBytes: a.opts.MaxArtifactBytes, Clock: a.opts.Clock, Cgroups: a.opts.Cgroups,
		Containerd: a.opts.Containerd})
	if err != nil {
		return taskSet{}, err
	}
	r := &taskRunner{d: d, db: db, log: log}
	if a.opts.StopTasksOnExit {
		r.stopOnExit = cmp.Or(a.opts.StopTasksGrace, 5*time.Second)
	}
	if err := r.prune(ctx); err != nil {
		d.Close()
		return taskSet{}, err
	}
	return taskSet{runners: map[string]Runner{taskwire.TypeExec: r, taskwire.TypeContainerd: r}, close: d.Close, driver: d}, nil
}

// taskRunner runs task attempts through the exec driver, many at once.
type taskRunner struct {
	d   *taskexec.Driver
	db  *store.Store
	log *slog.Logger
	// stopOnExit, when set, is the grace before SIGKILL for the processes
	// the runner stops when the agent stops (StopTasksOnExit).
	stopOnExit time.Duration
}

var _ ConcurrentRunner = (*taskRunner)(nil)

func (r *taskRunner) RunsConcurrently() {}

func (r *taskRunner) Run(context.Context, store.Work) (string, string) {
	return PhaseFailed, "a task runs only with progress reports"
}

// RunReporting runs one attempt: a Running report once its process has
// started, then its end.
func (r *taskRunner) RunReporting(ctx context.Context, w store.Work, env Env) (string, string, string) {
	spec, err := taskwire.DecodeSpec(w.Spec)
	if err != nil {
		return failed(taskwire.ReasonStartError, err)
	}
	prep, err := r.d.Prepare(ctx, w.UID, spec)
	if err == nil && ctx.Err() != nil {
		prep.Close()
		err = ctx.Err()
	}
	if err != nil {
		if ctx.Err() != nil {
			return interrupted(ctx)
		}
		var e *taskexec.Error
		if errors.As(err, &e) {
			return failed(e.Reason, err)
		}
		return failed(taskwire.ReasonStartError, err)
	}
	// Recorded before the start: a restart that finds this row without a
	// pid cannot know whether the process started, and does not start it
	// again.
	if err := r.record(ctx, w.UID, store.ActionRunning, execRecord{}); err != nil {
		prep.Close()
		return failed(taskwire.ReasonStartError, err)
	}
	proc, err := prep.Start()
	if err != nil {
		res := taskexec.Result{Phase: PhaseFailed, Reason: taskwire.ReasonStartError, Report: taskwire.Report{Message: err.Error()}}
		return r.end(ctx, w.UID, execRecord{Result: &res})
	}
	info := proc.Info()
	started := taskwire.Report{PID: info.PID, StartTime: info.StartTime.UTC().Format(time.RFC3339Nano),
		Message: fmt.Sprintf("started as pid %d", info.PID)}
	// The record a restart goes by and the Running report, in one commit.
	// Written even when ctx has ended, as record does.
	data, err := json.Marshal(execRecord{Info: &info})
	if err == nil {
		err = env.RecordAndReport(context.WithoutCancel(ctx), store.Action{UID: w.UID, Action: execAction, State: store.ActionRunning, Data: data},
			"Started", started.Encode())
	}
	if err != nil {
		// It runs; only a restart would not find it.
		r.log.Error("cannot record and report a started task process", "uid", w.UID, "pid", info.PID, "err", err)
	}
	return r.watch(ctx, w.UID, proc)
}

// Resume takes over an attempt found Running after a start.
func (r *taskRunner) Resume(ctx context.Context, w store.Work, env Env) (string, string, string) {
	spec, err := taskwire.DecodeSpec(w.Spec)
	if err != nil {
		return failed(taskwire.ReasonStartError, err)
	}
	// Read even when ctx has ended: a cancelled item's process must be found to be stopped.
	rec, found, err := r.load(context.WithoutCancel(ctx), w.UID)
	switch {
	case err != nil:
		return failed(taskwire.ReasonLost, fmt.Errorf("the agent restarted while the task ran and cannot read what it recorded: %w", err))
	case !found:
		// The last agent stopped before it started anything: start now.
		return r.RunReporting(ctx, w, env)
	case rec.Result != nil:
		return r.end(ctx, w.UID, rec) // ended before the restart could report it
	case rec.Info == nil:
		return failed(taskwire.ReasonLost, errors.New("the agent restarted while it was starting the task's process; "+
			"whether the process started is unknown, so it is not started again"))
	}
	return r.watch(ctx, w.UID, r.d.Adopt(w.UID, spec, *rec.Info))
}

// watch waits for proc to end, stops it when the hub cancels it, and
// leaves it running when the agent stops.
func (r *taskRunner) watch(ctx context.Context, uid string, proc *taskexec.Proc) (string, string, string) {
	select {
	case <-proc.Done():
	case <-ctx.Done():
		if errors.Is(context.Cause(ctx), ErrCancelled) {
			proc.Cancel()
			<-proc.Done() // at most the kill timeout: the monitor SIGKILLs then
		} else if r.stopOnExit > 0 {
			proc.Stop(r.stopOnExit)
			<-proc.Done() // at most stopOnExit
			res := proc.Result()
			if res.Phase == PhaseCancelled {
				res.Phase, res.Reason = PhaseFailed, taskwire.ReasonAgentStopped
				res.Report.Message = "the agent stopped and stopped its tasks (--stop-tasks-on-exit): " + res.Report.Message
			}
			info := proc.Info()
			return r.end(ctx, uid, execRecord{Info: &info, Result: &res})
		} else if proc.Detach() {
			return PhaseRunning, "the agent is stopping; the task's process goes on", ""
		}
	}
	res := proc.Result()
	info := proc.Info()
	return r.end(ctx, uid, execRecord{Info: &info, Result: &res})
}

// end records how the attempt ended and returns it.
func (r *taskRunner) end(ctx context.Context, uid string, rec execRecord) (string, string, string) {
	res := rec.Result
	state := store.ActionFailed
	if res.Phase == PhaseSucceeded {
		state = store.ActionSucceeded
	}
	if err := r.record(ctx, uid, state, rec); err != nil {
		r.log.Error("cannot record the end of a task", "uid", uid, "err", err)
	}
	return res.Phase, res.Reason, encodeReport(res.Report)
}

// interrupted is the end of an attempt whose context ended before its
// process started.
func interrupted(ctx context.Context) (string, string, string) {
	if errors.Is(context.Cause(ctx), ErrCancelled) {
		return PhaseCancelled, taskwire.ReasonCancelled, taskwire.Report{Message: "cancelled before the process started"}.Encode()
	}
	// Nothing started and nothing is recorded: Resume starts it after the
	// next start of the agent.
	return PhaseRunning, "the agent is stopping before the task started", ""
}

func failed(reason string, err error) (string, string, string) {
	return PhaseFailed, reason, taskwire.Report{Message: err.Error()}.Encode()
}

// encodeReport encodes rep within the protocol's message bound, shortening
// the output tail if its escapes make the JSON too long.
func encodeReport(rep taskwire.Report) string {
	msg := rep.Encode()
	for len(msg) > protocol.MaxMessageBytes && rep.OutputTail != "" {
		rep.OutputTail = rep.OutputTail[len(rep.OutputTail)/2:]
		msg = rep.Encode()
	}
	return msg
}

// record writes uid's exec row. It runs even when ctx has ended: the row is
// what a restart goes by.
func (r *taskRunner) record(ctx context.Context, uid, state string, rec execRecord) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return r.db.SetAction(context.WithoutCancel(ctx), store.Action{UID: uid, Action: execAction, State: state, Data: data})
}

func (r *taskRunner) load(ctx context.Context, uid string) (execRecord, bool, error) {
	acts, err := r.db.Actions(ctx, uid)
	if err != nil {
		return execRecord{}, false, err
	}
	for _, a := range acts {
		if a.Action != execAction {
			continue
		}
		var rec execRecord
		if len(a.Data) > 0 {
			if err := json.Unmarshal(a.Data, &rec); err != nil {
				return execRecord{}, true, fmt.Errorf("exec record of %s: %w", uid, err)
			}
		}
		return rec, true, nil
	}
	return execRecord{}, false, nil
}

// prune forgets the exec rows of work the DB no longer holds (the hub
// dropped it; DeleteWork keeps actions). A process still running for such
// work is stopped: nobody would ever report it. Its task dir stays for the
// retention period after it stopped, as any ended attempt's.
func (r *taskRunner) prune(ctx context.Context) error {
	for _, state := range []string{store.ActionSucceeded, store.ActionFailed, store.ActionRunning} {
		acts, err := r.db.ActionsInState(ctx, state)
		if err != nil {
			return err
		}
		for _, a := range acts {
			if a.Action != execAction {
				continue
			}
			if _, ok, err := r.db.Work(ctx, a.UID); err != nil || ok {
				if err != nil {
					return err
				}
				continue
			}
			var rec execRecord
			if json.Unmarshal(a.Data, &rec) == nil && rec.Info != nil && rec.Result == nil {
				r.log.Info("stopping the process of a task the hub dropped while the agent was down", "uid", a.UID, "pid", rec.Info.PID)
				r.d.Adopt(a.UID, &taskwire.Spec{}, *rec.Info).Cancel()
			}
			if err := r.db.DeleteActions(ctx, a.UID); err != nil {
				return err
			}
		}
	}
	return nil
}
