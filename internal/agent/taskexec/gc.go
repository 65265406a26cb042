package taskexec

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Defaults of the collection of task dirs (Options.Retention, GCInterval).
const (
	DefaultRetention  = 24 * time.Hour
	DefaultGCInterval = time.Minute
)

// EndedFile is written in an attempt's task dir when its process is known
// to have ended (or it never started), holding the time (RFC 3339). A dir
// without it is never collected: its process may be running, perhaps
// started by an agent process before this one and not adopted yet.
const EndedFile = "ended"

// gcPrefix names a task dir being removed: it is renamed first, under d.mu,
// so that no attempt can start in it meanwhile; a name that cannot be a
// work id (workIDRE allows no leading dot).
const gcPrefix = ".gc-"

// Removed is a task dir the collector removed, and why.
type Removed struct {
	ID string
	// Ended is when the attempt ended.
	Ended time.Time
}

// markEnded records that attempt id's process is over: from now the task
// dir is the collector's, after the retention period.
func (d *Driver) markEnded(id string) {
	name := filepath.Join(d.TaskDir(id), EndedFile)
	err := os.WriteFile(name, []byte(d.opts.Clock.Now().UTC().Format(time.RFC3339Nano)), 0o640)
	if errors.Is(err, fs.ErrNotExist) {
		return // no task dir (removed by hand, or never made): nothing to collect
	}
	if err != nil {
		// The dir stays until someone removes it by hand; nothing else breaks.
		d.log.Warn("cannot mark a task dir as ended; it will not be collected", "id", id, "err", err)
	}
}

// endedAt is when the attempt of dir ended; false when it has no mark.
func endedAt(dir string) (time.Time, bool) {
	b, err := os.ReadFile(filepath.Join(dir, EndedFile))
	if err != nil {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(string(b)))
	if err != nil {
		// Written by hand or cut short: the file's own time is the next best.
		fi, err := os.Stat(filepath.Join(dir, EndedFile))
		if err != nil {
			return time.Time{}, false
		}
		return fi.ModTime(), true
	}
	return t, true
}

// busy reports whether attempt id is being prepared or runs; d.mu is held.
func (d *Driver) busy(id string) bool {
	if d.preparing[id] > 0 {
		return true
	}
	for p := range d.procs {
		if p.id == id {
			return true
		}
	}
	return false
}

// GC removes the task dirs of attempts that ended more than the retention
// period ago, and no other: whether the caller still holds the attempt's
// work does not matter (an attempt the hub dropped after it finished, or
// that was stopped because the hub dropped it, keeps its logs for the
// retention period too, from when it ended). It never removes the dir of
// an attempt that is being prepared or runs, nor one without an EndedFile.
// It returns what it removed; an error leaves the rest for the next pass,
// as does the end of ctx. The driver runs it at its start and every
// Options.GCInterval; it does nothing when Options.Retention is negative or
// the driver is closed.
func (d *Driver) GC(ctx context.Context) ([]Removed, error) {
	if d.opts.Retention < 0 {
		return nil, nil
	}
	root := filepath.Join(d.opts.StateDir, "tasks")
	entries, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list task dirs: %w", err)
	}
	now := d.opts.Clock.Now()
	var (
		expired []Removed
		errs    []error
	)
	// Attempt dirs whose removal was cut short (their task dir may be gone).
	if work, err := os.ReadDir(d.opts.WorkDir); err == nil {
		for _, e := range work {
			if strings.HasPrefix(e.Name(), gcPrefix) {
				if err := os.RemoveAll(filepath.Join(d.opts.WorkDir, e.Name())); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() {
			continue
		}
		if strings.HasPrefix(name, gcPrefix) {
			// A removal cut short (the agent stopped): finish it.
			if err := os.RemoveAll(filepath.Join(root, name)); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if !workIDRE.MatchString(name) {
			continue // not the driver's
		}
		if ended, ok := endedAt(filepath.Join(root, name)); ok && now.Sub(ended) >= d.opts.Retention {
			expired = append(expired, Removed{ID: name, Ended: ended})
		}
	}
	var removed []Removed
	for _, r := range expired {
		if ctx.Err() != nil {
			break
		}
		ok, err := d.remove(r.ID)
		if err != nil {
			errs = append(errs, err)
		}
		if !ok {
			continue
		}
		removed = append(removed, r)
		d.log.Info("removed the directory of a finished task", "id", r.ID, "ended", r.Ended.UTC().Format(time.RFC3339),
			"why", "its retention period is over", "retention", d.opts.Retention)
	}
	return removed, errors.Join(errs...)
}

// remove removes the dirs of attempt id (its logs' and its own) unless it
// is busy (or the driver is closed, and its processes unwatched). It
// reports whether it did.
func (d *Driver) remove(id string) (bool, error) {
	dir, work := d.TaskDir(id), d.WorkDir(id)
	tmp, workTmp := filepath.Join(filepath.Dir(dir), gcPrefix+id), filepath.Join(d.opts.WorkDir, gcPrefix+id)
	d.mu.Lock()
	if d.closed || d.busy(id) {
		d.mu.Unlock()
		return false, nil
	}
	// Checked again under the lock: an attempt of this id prepared since
	// the listing removed the mark.
	if _, ok := endedAt(dir); !ok {
		d.mu.Unlock()
		return false, nil
	}
	// The attempt's own dir first: while the task dir stays, its mark
	// brings the next pass back to finish.
	err := os.Rename(work, workTmp)
	if errors.Is(err, fs.ErrNotExist) {
		err = nil
	}
	if err == nil {
		err = os.Rename(dir, tmp)
	}
	d.mu.Unlock()
	if err != nil {
		return false, fmt.Errorf("remove task dir %s: %w", dir, err)
	}
	// Out of the lock: a big working dir takes a while.
	if err := errors.Join(os.RemoveAll(workTmp), os.RemoveAll(tmp)); err != nil {
		return true, fmt.Errorf("remove the dirs of task %s: %w", id, err)
	}
	return true, nil
}

// collect runs GC at once and then GCInterval after each pass, until the
// driver closes.
func (d *Driver) collect(ctx context.Context) {
	defer close(d.gcDone)
	for {
		if _, err := d.GC(ctx); err != nil && ctx.Err() == nil {
			d.log.Warn("cannot remove every finished task dir; trying again later", "err", err)
		}
		// Made after the pass, not before: a fake clock has a waiter only
		// once the pass is over (see Options.Clock).
		t := d.opts.Clock.NewTimer(d.opts.GCInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.Chan():
		}
	}
}
