package agent

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/store"
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
			if _, ok := a.opts.Runners[w.Type].(Resumer); ok {
				a.resume = append(a.resume, w)
				continue
			}
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
		// The queue is full; the uid stays Pending in the DB, and the work
		// loop looks for such items once it has emptied the queue.
		if !a.overflow.Swap(true) {
			a.log.Warn("work queue full; items stay pending until it drains", "uid", uid)
		}
	}
}

// rescheduleDropped schedules the Pending items the DB holds, after the
// queue overflowed and schedule dropped some.
func (a *Agent) rescheduleDropped(ctx context.Context) error {
	ws, err := a.db.ListWork(ctx)
	if err != nil {
		return err
	}
	for _, w := range ws {
		if w.Phase == "" || w.Phase == PhasePending {
			a.schedule(w.UID) // may overflow again: the next empty queue looks again
		}
	}
	return nil
}

// runWork runs scheduled items one at a time, for the agent's whole life
// (across streams). Runners that take long start their own supervised
// processes; this loop only sequences state changes.
func (a *Agent) runWork(ctx context.Context) error {
	// Concurrent items see ctx end too; wait for their ends to be recorded.
	defer a.async.Wait()
	for _, w := range a.resume {
		if err := a.resumeOne(ctx, w); err != nil || ctx.Err() != nil {
			return err
		}
	}
	a.resume = nil
	for {
		var uid string
		select {
		case <-ctx.Done():
			return nil
		case uid = <-a.work:
		default:
			if a.overflow.Swap(false) {
				if err := a.rescheduleDropped(ctx); err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return err
				}
				continue
			}
			select {
			case <-ctx.Done():
				return nil
			case uid = <-a.work:
			}
		}
		w, rctx, ok, err := a.claim(ctx, uid)
		if err != nil {
			if ctx.Err() != nil {
				return nil // stopping: the DB call was cancelled, the item stays Pending
			}
			return err
		}
		if !ok {
			continue // already ran, cancelled or dropped: never run twice
		}
		if cr, ok := a.opts.Runners[w.Type].(ConcurrentRunner); ok {
			a.runConcurrent(ctx, rctx, w, cr.RunReporting)
			continue
		}
		phase, reason, message := PhaseFailed, fmt.Sprintf("this agent has no runner for work type %q", w.Type), ""
		if r, found := a.opts.Runners[w.Type]; found {
			if rr, ok := r.(ReportingRunner); ok {
				phase, reason, message = rr.RunReporting(rctx, w, a.env(uid))
			} else {
				phase, reason = r.Run(rctx, w)
			}
			if !terminal(phase) {
				// Left as it is, the item would never end, or ("") run again.
				phase, reason = PhaseFailed, fmt.Sprintf("the %s runner ended with phase %q, not %s, %s or %s: %s",
					w.Type, phase, PhaseSucceeded, PhaseFailed, PhaseCancelled, reason)
			}
		}
		// Record the end even when the agent is stopping: the runner's own
		// verdict (it may have been interrupted and said so) beats a restart
		// finding the item Running and calling it Failed.
		if err := a.finishWith(context.WithoutCancel(ctx), uid, phase, reason, message); err != nil {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// runConcurrent runs the item of a ConcurrentRunner on a goroutine of its
// own and records its end.
func (a *Agent) runConcurrent(ctx, rctx context.Context, w store.Work, run func(context.Context, store.Work, Env) (string, string, string)) {
	a.async.Add(1)
	go func() {
		defer a.async.Done()
		phase, reason, message := run(rctx, w, a.env(w.UID))
		if phase == PhaseRunning && ctx.Err() != nil {
			// The agent is stopping and the item goes on outside it: it
			// stays Running, for its runner's Resume after the next start.
			a.reportMu.Lock()
			if _, ok := a.running[w.UID]; ok {
				delete(a.running, w.UID)
				a.opts.Metrics.workEnded(w.Type, "")
			}
			a.reportMu.Unlock()
			return
		}
		if !terminal(phase) {
			phase, reason = PhaseFailed, fmt.Sprintf("the %s runner ended with phase %q, not %s, %s or %s: %s",
				w.Type, phase, PhaseSucceeded, PhaseFailed, PhaseCancelled, reason)
		}
		if err := a.finishWith(context.WithoutCancel(ctx), w.UID, phase, reason, message); err != nil {
			// The item stays Running in the DB: a restart reports it.
			a.log.Error("cannot record the end of a work item", "uid", w.UID, "phase", phase, "err", err)
		}
	}()
}

// runningItem is an item being run.
type runningItem struct {
	stop       context.CancelCauseFunc
	typ        string // the item's work type, for metrics
	concurrent bool   // its runner is a ConcurrentRunner: it reports its own cancel
}

// setRunning records uid as running and returns its context. reportMu is held.
func (a *Agent) setRunning(ctx context.Context, w store.Work) context.Context {
	rctx, stop := context.WithCancelCause(ctx)
	if a.running == nil {
		a.running = map[string]runningItem{}
	}
	if old, ok := a.running[w.UID]; ok {
		old.stop(ErrCancelled) // cannot happen: an item is claimed once
	} else {
		a.opts.Metrics.workStarted(w.Type)
	}
	_, concurrent := a.opts.Runners[w.Type].(ConcurrentRunner)
	a.running[w.UID] = runningItem{stop: stop, concurrent: concurrent, typ: w.Type}
	return rctx
}

// cancelAction is the work_actions row of a cancel the runner of a
// ConcurrentRunner's item had not finished when the agent stopped.
const cancelAction = "Cancel"

// resumeOne hands an item found Running after a start to its Resumer.
func (a *Agent) resumeOne(ctx context.Context, w store.Work) error {
	a.reportMu.Lock()
	rctx := a.setRunning(ctx, w)
	a.reportMu.Unlock()
	a.log.Info("resuming work that outlived the last agent process", "uid", w.UID, "type", w.Type)
	if cr, ok := a.opts.Runners[w.Type].(ConcurrentRunner); ok {
		// Cancelled before the restart (a recorded cancel), or since the
		// start, before setRunning (the item ended in the DB): the runner
		// must stop what still runs.
		cur, found, err := a.db.Work(ctx, w.UID)
		if err != nil {
			return err
		}
		acts, err := a.db.Actions(ctx, w.UID)
		if err != nil {
			return err
		}
		cancelled := !found || terminal(cur.Phase)
		for _, act := range acts {
			cancelled = cancelled || act.Action == cancelAction
		}
		if cancelled {
			a.reportMu.Lock()
			if it, ok := a.running[w.UID]; ok {
				it.stop(ErrCancelled)
			}
			a.reportMu.Unlock()
		}
		a.runConcurrent(ctx, rctx, w, cr.Resume)
		return nil
	}
	phase, reason, message := a.opts.Runners[w.Type].(Resumer).Resume(rctx, w, a.env(w.UID))
	if !terminal(phase) {
		phase, reason = PhaseFailed, fmt.Sprintf("the %s runner resumed with phase %q: %s", w.Type, phase, reason)
	}
	return a.finishWith(context.WithoutCancel(ctx), w.UID, phase, reason, message)
}

// env is the Env of running item uid.
func (a *Agent) env(uid string) Env {
	return Env{
		Report: func(ctx context.Context, reason, message string) error {
			return a.progress(ctx, uid, nil, reason, message)
		},
		RecordAndReport: func(ctx context.Context, act store.Action, reason, message string) error {
			if act.UID != uid {
				return fmt.Errorf("work %s: cannot record an action of work %s", uid, act.UID)
			}
			return a.progress(ctx, uid, &act, reason, message)
		},
		Connected: a.waitConnected,
	}
}

// progress reports uid still Running, with what it is doing, and records
// act with it when act is not nil.
func (a *Agent) progress(ctx context.Context, uid string, act *store.Action, reason, message string) error {
	a.reportMu.Lock()
	defer a.reportMu.Unlock()
	if _, ok := a.running[uid]; !ok {
		return fmt.Errorf("work %s is not running", uid)
	}
	if len(message) > protocol.MaxMessageBytes {
		return fmt.Errorf("work %s: progress message of %d bytes is over the protocol's %d", uid, len(message), protocol.MaxMessageBytes)
	}
	build := func(rev uint64) *agentv1.Envelope {
		return protocol.NewStatus(a.opts.Node, rev, &agentv1.WorkStatus{Uid: uid, Phase: PhaseRunning,
			Reason: clipText(reason, protocol.MaxTextBytes), Message: strings.ToValidUTF8(message, "")})
	}
	if act == nil {
		_, err := a.report(ctx, uid, "", "", build)
		return err
	}
	if it, ok := a.running[uid]; ok {
		a.opts.Metrics.action(it.typ, act.Action, act.State)
	}
	_, err := a.db.ReportAction(ctx, *act, func(rev uint64) (string, []byte, error) {
		env := build(rev)
		b, err := protocol.Encode(env)
		return env.GetId(), b, err
	})
	if err == nil {
		a.wake()
	}
	return err
}

// claim marks uid Running, persisted before the runner's effect so that a
// crash mid-run is visible after a restart, and returns the context to run
// it with (cancel interrupts it). It reports false when uid is not Pending
// any more (it ran, was cancelled, or the hub dropped it).
func (a *Agent) claim(ctx context.Context, uid string) (store.Work, context.Context, bool, error) {
	a.reportMu.Lock()
	defer a.reportMu.Unlock()
	w, ok, err := a.db.Work(ctx, uid)
	if err != nil || !ok || (w.Phase != "" && w.Phase != PhasePending) {
		return w, nil, false, err
	}
	if err := a.db.SetWorkPhase(ctx, uid, PhaseRunning, ""); err != nil {
		return w, nil, false, err
	}
	return w, a.setRunning(ctx, w), true, nil
}

// terminal reports whether phase is an end: nothing changes an item after it.
func terminal(phase string) bool {
	return phase == PhaseSucceeded || phase == PhaseFailed || phase == PhaseCancelled
}

// finish records an item's end and reports it, once: an item that already
// ended (cancelled while its runner ran) or that is gone (the hub dropped
// it) keeps what was reported.
func (a *Agent) finish(ctx context.Context, uid, phase, reason string) error {
	a.reportMu.Lock()
	defer a.reportMu.Unlock()
	return a.finishLocked(ctx, uid, phase, reason)
}

// finishWith is finish with a message (e.g. a node job's last action report).
func (a *Agent) finishWith(ctx context.Context, uid, phase, reason, message string) error {
	a.reportMu.Lock()
	defer a.reportMu.Unlock()
	return a.finishMessage(ctx, uid, phase, reason, message)
}

func (a *Agent) finishLocked(ctx context.Context, uid, phase, reason string) error {
	return a.finishMessage(ctx, uid, phase, reason, "")
}

func (a *Agent) finishMessage(ctx context.Context, uid, phase, reason, message string) error {
	// A runner's verdict goes into a report: keep it within the protocol, or
	// the report could never be encoded (and the item never reported).
	phase, reason = clipText(phase, protocol.MaxTextBytes), clipText(reason, protocol.MaxTextBytes)
	a.held.drop(uid) // ended: its credentials are no longer needed
	if it, ok := a.running[uid]; ok {
		it.stop(ErrCancelled)
		delete(a.running, uid)
		a.opts.Metrics.workEnded(it.typ, phase)
	}
	w, ok, err := a.db.Work(ctx, uid)
	if err != nil || !ok || terminal(w.Phase) {
		return err
	}
	if len(message) > protocol.MaxMessageBytes {
		message = "" // the phase and reason still tell the end
	}
	_, err = a.report(ctx, uid, phase, reason, func(rev uint64) *agentv1.Envelope {
		return protocol.NewStatus(a.opts.Node, rev, &agentv1.WorkStatus{Uid: uid, Phase: phase, Reason: reason, Message: strings.ToValidUTF8(message, "")})
	})
	return err
}

// cancel ends uid as Cancelled, interrupting its runner if it is running.
// An item that already ended is left as it is. The item of a
// ConcurrentRunner is only interrupted: its runner reports the end once
// the item has stopped.
func (a *Agent) cancel(ctx context.Context, uid, reason string) error {
	a.reportMu.Lock()
	defer a.reportMu.Unlock()
	if it, ok := a.running[uid]; ok && it.concurrent {
		// Recorded first: the hub does not send an acked cancel again, and
		// an agent that dies before the item stopped must stop it after
		// its restart.
		if err := a.db.SetAction(ctx, store.Action{UID: uid, Action: cancelAction, State: store.ActionRunning, Reason: reason}); err != nil {
			return err
		}
		it.stop(ErrCancelled)
		return nil
	}
	return a.finishLocked(ctx, uid, PhaseCancelled, reason)
}

// clipText makes s valid UTF-8 of at most max bytes, marking a cut with "…".
func clipText(s string, max int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= max {
		return s
	}
	const more = "…"
	cut := s[:max-len(more)]
	for !utf8.ValidString(cut) {
		cut = cut[:len(cut)-1]
	}
	return cut + more
}
