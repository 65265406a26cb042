package taskhub

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
)

// writeParallelism bounds the task writes in flight at once. Tasks are
// independent objects: a burst of short tasks is written side by side, not
// one at a time behind the apiserver's latency.
const writeParallelism = 16

// latestTTL is how long a write's result is preferred to an older cache
// copy; the cache catches up well within it.
const latestTTL = 10 * time.Second

// runWriters starts the writers of what was queued before the cache
// loaded, then serves deleted tasks waiting for their end and forgets old
// write results, until ctx ends.
func (d *Dispatcher) runWriters(ctx context.Context) error {
	d.mu.Lock()
	d.run = ctx
	for uid := range d.queue {
		d.wakeLocked(uid)
	}
	d.mu.Unlock()
	sweep := d.opts.Clock.NewTicker(latestTTL)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case key := <-d.requeue:
			var t batchv1.Task
			if err := d.opts.APIReader.Get(ctx, key, &t); err == nil && t.DeletionTimestamp != nil {
				if _, err := d.cleanup(ctx, &t); err != nil {
					// A conflict or a task already gone is the normal
					// race with another writer: the Task's next event
					// brings its cleanup back through the reconciler.
					if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
						d.log.Debug("clean up deleted task: retried on its next change", "task", key, "err", err)
					} else {
						d.log.Warn("clean up deleted task", "task", key, "err", err)
					}
				}
			}
		case now := <-sweep.Chan():
			d.mu.Lock()
			for uid, w := range d.latest {
				if now.Sub(w.at) > latestTTL {
					delete(d.latest, uid)
				}
			}
			d.mu.Unlock()
		}
	}
}

// writeTask writes what is queued for task uid until nothing is: an
// agent's report at once (what arrives while a write is in flight goes
// into the next one); a dispatch alone after FlushInterval, since the
// agent's Running report usually comes within it and one write then
// carries both; and then the finalizer of an attempt still running, beside
// the status writes.
func (d *Dispatcher) writeTask(ctx context.Context, uid types.UID, wake chan struct{}) {
	for {
		d.mu.Lock()
		p := d.queue[uid]
		if p == nil || ctx.Err() != nil {
			delete(d.writers, uid)
			d.mu.Unlock()
			return
		}
		statusDue := len(p.reports) > 0 || (p.dispatched && d.opts.Clock.Since(p.since) >= d.opts.FlushInterval)
		d.mu.Unlock()
		held := false
		if statusDue {
			// A slot first, then what is due: what arrives while all slots
			// are busy goes into this task's next write, so that under load
			// (a burst, the apiserver's pace) its reports share writes.
			select {
			case d.slots <- struct{}{}:
				held = true
			case <-ctx.Done():
				continue
			}
		}
		d.mu.Lock()
		take, wait := d.takeDue(uid)
		d.mu.Unlock()
		if take.finalizer {
			// Beside the status writes: the Running write must not wait
			// for it, and does not conflict with it (see writeStatus).
			go d.finalize(ctx, uid, take.node, take.attempt)
			take.finalizer = false
		}
		if take.empty() {
			if held {
				<-d.slots
			}
			select {
			case <-ctx.Done():
			case <-wake:
			case <-d.opts.Clock.After(wait):
			}
			continue
		}
		if !held {
			d.slots <- struct{}{} // a report came after the check
		}
		err := d.writeStatus(ctx, uid, take)
		<-d.slots
		if err == nil {
			continue
		}
		d.log.Error("write task status", "uid", uid, "node", take.node, "attempt", take.attempt, "err", err)
		// Keep it for the next try, unless a newer attempt came.
		d.mu.Lock()
		switch q := d.queue[uid]; {
		case q == nil:
			d.queue[uid] = take
		case q.attempt == take.attempt:
			take.merge(q)
			d.queue[uid] = take
		}
		d.mu.Unlock()
		// Try again after a pause, not at once.
		select {
		case <-ctx.Done():
		case <-d.opts.Clock.After(time.Second):
		}
	}
}

// takeDue takes from uid's queue what is due to be written now, and says
// how long until the rest is. d.mu is held.
func (d *Dispatcher) takeDue(uid types.UID) (take *pending, wait time.Duration) {
	p := d.queue[uid]
	if p == nil {
		return &pending{}, 0
	}
	take = &pending{node: p.node, attempt: p.attempt}
	elapsed := d.opts.Clock.Since(p.since)
	ready := elapsed >= d.opts.FlushInterval
	if len(p.reports) > 0 || (p.dispatched && ready) {
		take.dispatched, take.since, take.reports = p.dispatched, p.since, p.reports
		p.dispatched, p.reports = false, nil
	}
	if p.finalizer && ready {
		take.finalizer, p.finalizer = true, false
	}
	if (p.dispatched || p.finalizer) && !ready {
		wait = d.opts.FlushInterval - elapsed
	}
	if p.empty() {
		delete(d.queue, uid)
	}
	return take, wait
}

// current is the newest copy of task uid this hub knows: the cache's, or
// its own last write's while the cache has not caught up with it. It is
// nil when the cache does not hold the task.
func (d *Dispatcher) current(ctx context.Context, uid types.UID) (*batchv1.Task, error) {
	var l batchv1.TaskList
	if err := d.opts.Client.List(ctx, &l, client.MatchingFields{IndexUID: string(uid)}); err != nil {
		return nil, err
	}
	if len(l.Items) == 0 {
		return nil, nil // gone, or not in the cache yet (it was just created: the agent cannot report on it yet)
	}
	t := &l.Items[0]
	d.mu.Lock()
	w, ok := d.latest[uid]
	d.mu.Unlock()
	if ok && newer(w.task.ResourceVersion, t.ResourceVersion) {
		return w.task.DeepCopy(), nil
	}
	return t.DeepCopy(), nil
}

// newer reports whether resource version a is after b. Versions are
// opaque to clients; etcd's are numbers, and anything else is not newer
// (the cache's copy is used, and a conflict reads afresh).
func newer(a, b string) bool {
	x, errA := strconv.ParseUint(a, 10, 64)
	y, errB := strconv.ParseUint(b, 10, 64)
	return errA == nil && errB == nil && x > y
}

// remember keeps what a write to t returned.
func (d *Dispatcher) remember(t *batchv1.Task) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.sent[t.UID]; ok || d.queue[t.UID] != nil || d.writers[t.UID] != nil {
		d.latest[t.UID] = written{task: t.DeepCopy(), at: d.opts.Clock.Now()}
	}
}

// writeStatus applies p to the status of the task with uid. The patch
// tests the state, attempt and node it was made from instead of the
// resource version: a write to the task's metadata in between (its
// finalizer) does not make it fail. A failed test or any other error is
// tried again on a fresh read, with the resource version.
func (d *Dispatcher) writeStatus(ctx context.Context, uid types.UID, p *pending) error {
	t, err := d.current(ctx, uid)
	if err != nil || t == nil {
		return err
	}
	key := client.ObjectKeyFromObject(t)
	hub := ""
	if h := d.getHub(); h != nil {
		hub = h.HubName()
	}
	orig := t.DeepCopy()
	if !applyReports(t, p, hub, d.opts.Clock.Now()) {
		return nil
	}
	patch, err := statusPatch(&orig.Status, &t.Status)
	if err == nil {
		if err = d.opts.Client.Status().Patch(ctx, t, client.RawPatch(types.JSONPatchType, patch)); err == nil {
			d.m.writes.Inc()
			d.remember(t)
			d.failedEvent(orig, t)
			return nil
		}
	}
	if apierrors.IsNotFound(err) || ctx.Err() != nil {
		return nil
	}
	d.m.conflicts.Inc()
	return client.IgnoreNotFound(retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		t = &batchv1.Task{}
		if err := d.opts.APIReader.Get(ctx, key, t); err != nil || t.UID != uid {
			return err
		}
		orig := t.DeepCopy()
		if !applyReports(t, p, hub, d.opts.Clock.Now()) {
			return nil
		}
		if err := d.opts.Client.Status().Patch(ctx, t, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
			if apierrors.IsConflict(err) {
				d.m.conflicts.Inc()
			}
			return err
		}
		d.m.writes.Inc()
		d.remember(t)
		d.failedEvent(orig, t)
		return nil
	}))
}

// failedEvent records a Warning Event on a task whose attempt this write
// ended Failed, so that `kubectl describe task` says why even when no
// restart follows (the manager records restarts and the final give-up).
// Completions get none: they are the common case, and each Event is one
// more apiserver write.
func (d *Dispatcher) failedEvent(before, after *batchv1.Task) {
	if before.Status.State == batchv1.TaskFailed || after.Status.State != batchv1.TaskFailed {
		return
	}
	st := &after.Status
	note := fmt.Sprintf("attempt %d on node %s failed: %s", st.Attempt, st.NodeName, st.Reason)
	if st.ExitCode != nil {
		note += fmt.Sprintf(", exit code %d", *st.ExitCode)
	}
	if st.Message != "" {
		note += " (" + clipNote(st.Message) + ")"
	}
	d.event(after, corev1.EventTypeWarning, "Failed", "Run", "%s", note)
}

// clipNote keeps an Event's note short: the full message is in the status.
func clipNote(s string) string {
	const max = 256
	if len(s) <= max {
		return s
	}
	return strings.ToValidUTF8(s[:max], "") + "…"
}

// statusPatch is a JSON patch from status a to b that applies only while
// the state, attempt and node are still a's: what apply decided from.
func statusPatch(a, b *batchv1.TaskStatus) ([]byte, error) {
	var am, bm map[string]json.RawMessage
	for _, x := range []struct {
		st  *batchv1.TaskStatus
		out *map[string]json.RawMessage
	}{{a, &am}, {b, &bm}} {
		raw, err := json.Marshal(x.st)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(raw, x.out); err != nil {
			return nil, err
		}
	}
	type op struct {
		Op    string          `json:"op"`
		Path  string          `json:"path"`
		Value json.RawMessage `json:"value,omitempty"`
	}
	null := json.RawMessage("null")
	var ops []op
	for _, k := range []string{"state", "attempt", "nodeName"} {
		v, ok := am[k]
		if !ok {
			v = null // absent: a test of null passes only while it is absent
		}
		ops = append(ops, op{Op: "test", Path: "/status/" + k, Value: v})
	}
	keys := make([]string, 0, len(bm))
	for k := range bm {
		keys = append(keys, k)
	}
	slices.Sort(keys) // one patch for one change
	for _, k := range keys {
		if !bytes.Equal(am[k], bm[k]) {
			ops = append(ops, op{Op: "add", Path: "/status/" + k, Value: bm[k]})
		}
	}
	for k := range am {
		if _, ok := bm[k]; !ok {
			ops = append(ops, op{Op: "remove", Path: "/status/" + k})
		}
	}
	return json.Marshal(ops)
}

// finalize adds FinalizerCleanup to a task whose attempt was sent, so that
// deleting it stops the process first. It tries again until it is written
// or the attempt is over.
func (d *Dispatcher) finalize(ctx context.Context, uid types.UID, node string, attempt int32) {
	d.slots <- struct{}{}
	err := d.addFinalizer(ctx, uid, node, attempt)
	<-d.slots
	if err == nil || ctx.Err() != nil {
		return
	}
	d.log.Error("add the task's finalizer", "uid", uid, "node", node, "attempt", attempt, "err", err)
	select {
	case <-ctx.Done():
	case <-d.opts.Clock.After(time.Second):
		d.enqueue(uid, node, attempt, func(p *pending) { p.finalizer = true })
	}
}

func (d *Dispatcher) addFinalizer(ctx context.Context, uid types.UID, node string, attempt int32) error {
	t, err := d.current(ctx, uid)
	if err != nil || t == nil {
		return err
	}
	key := client.ObjectKeyFromObject(t)
	first := true
	return client.IgnoreNotFound(retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		if !first {
			d.m.conflicts.Inc()
			t = &batchv1.Task{}
			if err := d.opts.APIReader.Get(ctx, key, t); err != nil {
				return err
			}
		}
		first = false
		if t.UID != uid || t.DeletionTimestamp != nil || controllerutil.ContainsFinalizer(t, FinalizerCleanup) {
			return nil
		}
		if t.Status.Attempt != attempt || t.Status.NodeName != node || !active(t) {
			return nil // the attempt is over: nothing of it to stop
		}
		patch := client.MergeFromWithOptions(t.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.AddFinalizer(t, FinalizerCleanup)
		if err := d.opts.Client.Patch(ctx, t, patch); err != nil {
			return err
		}
		d.remember(t)
		return nil
	}))
}
