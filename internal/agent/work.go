package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

func secs(n uint32) time.Duration { return time.Duration(n) * time.Second }

// recoverWork decides, after a start, what to do with work the DB holds:
// work that never started runs; work that was running when the agent died
// is reported Failed, because a runner cannot be assumed safe to repeat.
func (a *Agent) recoverWork(ctx context.Context) error {
	ws, err := a.db.ListWork(ctx)
	if err != nil {
		return err
	}
	for _, w := range ws {
		switch w.Phase {
		case "", PhasePending:
			a.schedule(w.UID)
		case PhaseRunning:
			if err := a.finish(ctx, w.UID, PhaseFailed, "the agent restarted while the work was running"); err != nil {
				return err
			}
		}
	}
	return nil
}

func (a *Agent) schedule(uid string) {
	select {
	case a.work <- uid:
	default:
		// The queue is full; the uid stays Pending in the DB and recoverWork
		// or the next snapshot picks it up.
		a.log.Warn("work queue full; item stays pending", "uid", uid)
	}
}

// runWork runs scheduled items one at a time, for the agent's whole life
// (across streams). Runners that take long start their own supervised
// processes; this loop only sequences state changes.
func (a *Agent) runWork(ctx context.Context) error {
	for {
		var uid string
		select {
		case <-ctx.Done():
			return nil
		case uid = <-a.work:
		}
		w, ok, err := a.db.Work(ctx, uid)
		if err != nil {
			return err
		}
		if !ok || (w.Phase != "" && w.Phase != PhasePending) {
			continue // already ran, or cancelled: never run twice
		}
		r, ok := a.opts.Runners[w.Type]
		if !ok {
			if err := a.finish(ctx, uid, PhaseFailed, fmt.Sprintf("this agent has no runner for work type %q", w.Type)); err != nil {
				return err
			}
			continue
		}
		// Persist Running before the effect, so a crash mid-run is visible after restart.
		if err := a.db.SetWorkPhase(ctx, uid, PhaseRunning, ""); err != nil {
			return err
		}
		phase, reason := r.Run(ctx, w)
		// Record the end even when the agent is stopping: the runner's own
		// verdict (it may have been interrupted and said so) beats a restart
		// finding the item Running and calling it Failed.
		if err := a.finish(context.WithoutCancel(ctx), uid, phase, reason); err != nil {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// finish records an item's end and reports it.
func (a *Agent) finish(ctx context.Context, uid, phase, reason string) error {
	a.reportMu.Lock()
	defer a.reportMu.Unlock()
	if err := a.db.SetWorkPhase(ctx, uid, phase, reason); err != nil {
		return err
	}
	rev, err := a.db.NextAgentRevision(ctx)
	if err != nil {
		return err
	}
	return a.enqueue(ctx, protocol.NewStatus(a.opts.Node, rev, &agentv1.WorkStatus{Uid: uid, Phase: phase, Reason: reason}))
}

func (a *Agent) cancel(ctx context.Context, uid, reason string) error {
	w, ok, err := a.db.Work(ctx, uid)
	if err != nil || !ok {
		return err
	}
	if w.Phase == PhaseSucceeded || w.Phase == PhaseFailed || w.Phase == PhaseCancelled {
		return nil
	}
	return a.finish(ctx, uid, PhaseCancelled, reason)
}
