package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/drover-fleet/drover/internal/agent/taskexec"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/store"
)

// Task logs. A task attempt's output is in
//
//	<state dir>/tasks/<work id>/stdout.log and stderr.log
//
// and rotation moves a full file to <stream>.log.1 (one old file kept)
// and starts a new one: taskexec's log shim renames it before a write
// would take it past the bound. A LogRequest from the hub streams one of them back
// in LogChunks over SendMessage, one call per chunk, so the hub's answer
// paces the agent: a slow reader slows the reading here, and a hub that
// answers with an error (the request is over) stops it.

const (
	// logPoll is how often a followed log is checked for more output.
	logPoll = 200 * time.Millisecond
	// logFollowLimit bounds one log request, followed or not.
	logFollowLimit = 12 * time.Hour
)

// logUIDRE is what a work id must look like to name a log directory: no
// separators, no dots, so it cannot climb out of <state dir>/tasks.
var logUIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// logError is a reason to tell the requester, as the stream's last chunk.
type logError struct{ msg string }

func (e *logError) Error() string { return e.msg }

// serveLogs answers one LogRequest. It runs on its own goroutine, for as
// long as the request lasts: the stream to the hub (ctx) bounds it.
func (a *Agent) serveLogs(ctx context.Context, client agentv1.AgentHubClient, req *agentv1.LogRequest) {
	ctx, cancel := context.WithTimeout(ctx, logFollowLimit)
	defer cancel()
	send := func(c *agentv1.LogChunk) error {
		c.RequestId = req.GetRequestId()
		_, err := a.call(ctx, client, protocol.NewLogChunk(a.opts.Node, c))
		return err
	}
	err := a.streamLog(ctx, req, send)
	var le *logError
	switch {
	case err == nil:
	case errors.As(err, &le):
		if err := send(&agentv1.LogChunk{Error: le.msg}); err != nil {
			a.log.Debug("log request: could not send the error", "request", req.GetRequestId(), "err", err)
		}
	default:
		// The hub ended the request (the reader left) or the stream broke.
		a.log.Debug("log request ended", "request", req.GetRequestId(), "uid", req.GetUid(), "err", err)
	}
}

// streamLog sends the requested file's content as chunks, then a last
// chunk with eof.
func (a *Agent) streamLog(ctx context.Context, req *agentv1.LogRequest, send func(*agentv1.LogChunk) error) error {
	uid, stream := req.GetUid(), req.GetStream()
	if !logUIDRE.MatchString(uid) || (stream != protocol.LogStdout && stream != protocol.LogStderr) {
		return &logError{fmt.Sprintf("no log %q of work %q: not a task's log", stream, uid)}
	}
	// An empty first chunk says the request arrived: a followed log may
	// stay quiet for long, and the hub must not take that for an agent
	// that does not answer.
	if err := send(&agentv1.LogChunk{}); err != nil {
		return err
	}
	cur := filepath.Join(a.opts.StateDir, "tasks", uid, stream+".log")
	old := cur + ".1"

	// ended reports whether the item will write no more: it ended, or the
	// agent does not hold it (any more).
	ended := func() (bool, error) {
		w, ok, err := a.db.Work(ctx, uid)
		if err != nil {
			return false, err
		}
		return !ok || terminal(w.Phase), nil
	}

	f, err := os.Open(cur)
	for errors.Is(err, os.ErrNotExist) {
		_, known, derr := a.db.Work(ctx, uid)
		if derr != nil {
			return derr
		}
		done, derr := ended()
		if derr != nil {
			return derr
		}
		if done {
			// An attempt the agent no longer holds is done: without its
			// task dir this is an error; with it (kept for the retention
			// period), the attempt ended before it wrote a log.
			if gone := a.logsGone(ctx, uid, known); gone != nil {
				return gone
			}
		}
		if !req.GetFollow() || done {
			// It has not written anything (yet): an empty log.
			return send(&agentv1.LogChunk{Eof: true})
		}
		if err := a.sleep(ctx, logPoll); err != nil {
			return err
		}
		f, err = os.Open(cur)
	}
	if err != nil {
		return &logError{fmt.Sprintf("open %s log of %s: %v", stream, uid, err)}
	}
	defer func() { f.Close() }()

	// Where to start: the whole of the rotated file first, or tail_bytes
	// before the end across both files.
	st, err := f.Stat()
	if err != nil {
		return err
	}
	var fromOld int64 = -1 // offset in the old file to send from; -1: none
	tail := int64(req.GetTailBytes())
	switch {
	case tail == 0:
		fromOld = 0
	case tail <= st.Size():
		if _, err := f.Seek(st.Size()-tail, io.SeekStart); err != nil {
			return err
		}
	default:
		if ost, err := os.Stat(old); err == nil {
			fromOld = max(0, ost.Size()-(tail-st.Size()))
		}
	}
	buf := make([]byte, protocol.MaxLogChunkBytes)
	// The .1 file as it was when we started: a different one later means
	// a rotation.
	oldSeen, _ := os.Stat(old)
	if fromOld >= 0 {
		if err := sendOld(old, fromOld, buf, send); err != nil {
			return err
		}
	}

	// drain sends what is left of f.
	drain := func() error {
		for {
			n, err := f.Read(buf)
			if n > 0 {
				if err := send(&agentv1.LogChunk{Data: buf[:n]}); err != nil {
					return err
				}
			}
			if err != nil {
				return nil
			}
		}
	}
	// checkRotation finds out whether the log was rotated since we last
	// looked, and moves to where the rest of the output is. Two ways:
	//   - by rename (the log shim's way: the file we hold became .1 and a
	//     new one took its name): send the rest of ours, then go on with
	//     the new file;
	//   - by copy-truncate (attempts an older agent started, which write
	//     their files themselves): a new .1 holds a copy of ours and ours
	//     was emptied; the rest of what we were reading is in the copy
	//     from our offset on, and ours starts again from 0.
	checkRotation := func() (bool, error) {
		fst, err := f.Stat()
		if err != nil {
			return false, err
		}
		if cst, err := os.Stat(cur); err == nil && !os.SameFile(cst, fst) {
			if err := drain(); err != nil {
				return false, err
			}
			nf, err := os.Open(cur)
			if err != nil {
				return false, nil // gone again: look next time
			}
			f.Close()
			f = nf
			oldSeen, _ = os.Stat(old)
			return true, nil
		}
		ost, err := os.Stat(old)
		if err != nil || (oldSeen != nil && os.SameFile(ost, oldSeen)) {
			return false, nil
		}
		oldSeen = ost
		if os.SameFile(ost, fst) {
			// Renamed, and the new file is not there yet.
			return false, drain()
		}
		pos, err := f.Seek(0, io.SeekCurrent)
		if err != nil {
			return false, err
		}
		if err := sendOld(old, pos, buf, send); err != nil {
			return false, err
		}
		_, err = f.Seek(0, io.SeekStart)
		return true, err
	}

	finalSeen := false
	for {
		n, rerr := f.Read(buf)
		if n > 0 {
			if err := send(&agentv1.LogChunk{Data: buf[:n]}); err != nil {
				return err
			}
			continue
		}
		if rerr != nil && !errors.Is(rerr, io.EOF) {
			return &logError{fmt.Sprintf("read %s log of %s: %v", stream, uid, rerr)}
		}
		if !req.GetFollow() {
			return send(&agentv1.LogChunk{Eof: true})
		}
		// At the end of the file we hold. Was the log rotated meanwhile?
		if rotated, err := checkRotation(); err != nil {
			return err
		} else if rotated {
			continue
		}
		if finalSeen {
			return send(&agentv1.LogChunk{Eof: true})
		}
		// Seen ended before one more read: what it wrote before ending is
		// then read before eof.
		if finalSeen, err = ended(); err != nil {
			return err
		}
		if finalSeen {
			continue
		}
		if err := a.sleep(ctx, logPoll); err != nil {
			return err
		}
		// Before reading on: output written after a copy-truncate rotation
		// must not be read at the old offset.
		if _, err := checkRotation(); err != nil {
			return err
		}
	}
}

// logsGone is why an ended attempt has no log: its task dir is gone
// (taskexec's collector removed it), not just the file (an attempt that
// ended before writing anything, which has an empty log). Nil when the
// dir is there, or the attempt never had one. known says whether the
// agent still holds the work.
func (a *Agent) logsGone(ctx context.Context, uid string, known bool) error {
	if _, err := os.Stat(filepath.Join(a.opts.StateDir, "tasks", uid)); !errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if known {
		// The exec runner records its action once the task dir and log
		// files are made: without it the attempt failed before (a bad
		// spec, a missing artifact) and its empty log is the truth.
		acts, err := a.db.Actions(ctx, uid)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(acts, func(x store.Action) bool { return x.Action == execAction }) {
			return nil
		}
	}
	retention := a.opts.TaskRetention
	if retention == 0 {
		retention = taskexec.DefaultRetention
	}
	switch {
	case retention < 0:
		// The collector does not run: someone removed it by hand.
		return &logError{fmt.Sprintf("the logs of task attempt %s are not on this node: its task directory is missing", uid)}
	case !known:
		// The hub no longer lists the attempt (it finished, or was
		// dropped): its dir stayed for the retention period after it ended.
		return &logError{fmt.Sprintf("the logs of task attempt %s are not on this node: the agent never ran it here, "+
			"or removed its task directory once --task-retention (%s) had passed since it ended", uid, shortDuration(retention))}
	default:
		return &logError{fmt.Sprintf("the logs of task attempt %s were removed from this node: "+
			"the agent keeps an ended attempt's logs for --task-retention (%s)", uid, shortDuration(retention))}
	}
}

// shortDuration is d without trailing zero units: 24h, not 24h0m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// sendOld sends the rotated file from offset; a missing one is no error.
func sendOld(path string, offset int64, buf []byte, send func(*agentv1.LogChunk) error) error {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return err
	}
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if err := send(&agentv1.LogChunk{Data: buf[:n]}); err != nil {
				return err
			}
		}
		if err != nil {
			return nil
		}
	}
}
