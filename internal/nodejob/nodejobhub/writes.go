package nodejobhub

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	"github.com/drover-fleet/drover/internal/nodejob"
)

// writeLoop writes queued reports, one write per slice per flush.
func (e *Executor) writeLoop(ctx context.Context) error {
	var held <-chan time.Time // fires when the earliest held report is due
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-e.kick:
		case <-held:
		}
		// Gather what else arrives meanwhile into the same writes.
		select {
		case <-ctx.Done():
			return nil
		case <-e.opts.Clock.After(e.opts.FlushInterval):
		}
		held = nil
		if next := e.flush(ctx); !next.IsZero() {
			held = e.opts.Clock.After(max(next.Sub(e.opts.Clock.Now()), 0))
		}
	}
}

// due is when a node's queued reports rs must be written at the latest.
// Held reports must reach the slice well before the manager would time the
// node out (ref.since + timeout).
func (e *Executor) due(job jobRef, ref nodeRef, rs []report) time.Time {
	if urgent(rs) || ref.since.IsZero() {
		return time.Time{}
	}
	d := rs[0].at.Add(e.opts.HoldInterval)
	if t := ref.since.Add(job.timeout / 2); t.Before(d) {
		d = t
	}
	return d
}

// flush writes the queued reports that are due and returns when the
// earliest held one will be (zero: none held).
func (e *Executor) flush(ctx context.Context) (next time.Time) {
	now := e.opts.Clock.Now()
	e.mu.Lock()
	batches := map[string]map[string][]report{} // slice → node → reports
	jobOfSlice := map[string]string{}
	for uid, nodes := range e.queue {
		job := e.jobs[uid]
		for node, rs := range nodes {
			ref, ok := e.where[uid][node]
			if !ok {
				continue // slice not indexed yet: keep for the next flush
			}
			if d := e.due(job, ref, rs); d.After(now) {
				if next.IsZero() || d.Before(next) {
					next = d
				}
				continue
			}
			if batches[ref.slice] == nil {
				batches[ref.slice] = map[string][]report{}
				jobOfSlice[ref.slice] = uid
			}
			batches[ref.slice][node] = rs
			delete(nodes, node)
		}
		if len(nodes) == 0 {
			delete(e.queue, uid)
		}
	}
	e.mu.Unlock()
	// Slices are independent objects: write them side by side. One at a
	// time, a flush of a 10,000-node job (63 slices of ~80 KB) took
	// seconds, and reports waited for it.
	var wg sync.WaitGroup
	var failed atomic.Bool
	sem := make(chan struct{}, flushParallelism)
	for sliceName, byNode := range batches {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := e.writeSlice(ctx, sliceName, byNode); err != nil {
				// Whatever the error (a conflict that outlasted its
				// retries, the apiserver away, a webhook): keep the reports
				// for a later flush. Dropped, a node that succeeded
				// would go Unknown.
				e.log.Error("write node job reports; retrying", "slice", sliceName, "nodes", len(byNode), "in", writeRetry, "err", err)
				e.requeue(jobOfSlice[sliceName], byNode)
				failed.Store(true)
			}
		}()
	}
	wg.Wait()
	if failed.Load() {
		if retry := now.Add(writeRetry); next.IsZero() || retry.Before(next) {
			next = retry
		}
	}
	return next
}

// writeRetry is how long reports whose write failed wait for the next try.
const writeRetry = time.Second

// requeue puts reports whose write failed back in front of those that
// arrived meanwhile, unless the job is gone.
func (e *Executor) requeue(uid string, byNode map[string][]report) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.jobs[uid]; !ok {
		return
	}
	if e.queue[uid] == nil {
		e.queue[uid] = map[string][]report{}
	}
	for node, rs := range byNode {
		e.queue[uid][node] = append(append([]report(nil), rs...), e.queue[uid][node]...)
	}
}

// flushParallelism bounds the slice writes of one flush in flight at once.
const flushParallelism = 8

// fresher returns the newer of the cached slice and the one this executor
// last wrote: right after a write the cache lags, and writing on the
// cached copy would only conflict.
func (e *Executor) fresher(s *opsv1.NodeTaskSlice) {
	e.mu.Lock()
	w, ok := e.written[s.Name]
	e.mu.Unlock()
	if ok && w.UID == s.UID && newerRV(w.ResourceVersion, s.ResourceVersion) {
		w.DeepCopyInto(s)
	}
}

func (e *Executor) remember(s *opsv1.NodeTaskSlice) {
	e.mu.Lock()
	e.written[s.Name] = s.DeepCopy()
	e.mu.Unlock()
}

// updateTime is the entry's updateTime, or zero.
func updateTime(n opsv1.NodeTaskStatus) time.Time {
	if n.UpdateTime == nil {
		return time.Time{}
	}
	return n.UpdateTime.Time
}

// newerRV compares resourceVersions as etcd revisions. They are opaque to
// clients in general; when either does not parse, the cache wins and a
// conflict, if any, re-reads the slice.
func newerRV(a, b string) bool {
	x, err1 := strconv.ParseUint(a, 10, 64)
	y, err2 := strconv.ParseUint(b, 10, 64)
	return err1 == nil && err2 == nil && x > y
}

func (e *Executor) writeSlice(ctx context.Context, sliceName string, byNode map[string][]report) error {
	first := true
	return retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		var s opsv1.NodeTaskSlice
		var err error
		if first {
			err = e.opts.Client.Get(ctx, client.ObjectKey{Name: sliceName}, &s)
			if err == nil {
				e.fresher(&s)
			}
		} else {
			err = e.opts.APIReader.Get(ctx, client.ObjectKey{Name: sliceName}, &s)
		}
		first = false
		if err != nil {
			return client.IgnoreNotFound(err)
		}
		// An Unknown node follows a late report only while its job runs.
		job, err := e.getJob(ctx, s.Job)
		if err != nil {
			return err
		}
		final := job == nil || job.JobStatus().Phase.Final()
		changed := false
		for i := range s.Nodes {
			for _, rp := range byNode[s.Nodes[i].NodeName] {
				// The entry's updateTime is when the report came in, not
				// when it was written: the timeout counts from the node.
				if nodejob.ApplyReport(&s.Nodes[i], rp.phase, rp.r, rp.at, final) {
					changed = true
				}
			}
		}
		if !changed {
			return nil
		}
		if err := e.opts.Client.Update(ctx, &s); err != nil {
			return err
		}
		e.remember(&s)
		e.writes.Inc()
		return nil
	})
}
