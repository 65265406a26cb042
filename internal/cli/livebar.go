package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
	"golang.org/x/term"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
)

// isTerminal reports whether w is a terminal: `drover watch` draws a live
// bar there and prints one line per change anywhere else (pipes, logs, CI).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// liveBar is a node job's progress as an mpb bar redrawn in place.
type liveBar struct {
	p    *mpb.Progress
	name string

	// statusMu guards status alone: the decorator reads it while mpb
	// renders, and mu is held around calls into mpb.
	statusMu sync.Mutex
	status   string

	mu       sync.Mutex
	b        *mpb.Bar // made once the job knows its node count
	total    int64
	done     int64
	finished bool
}

// newLiveBar draws on out; width 0 means the terminal's.
func newLiveBar(ctx context.Context, out io.Writer, name string, width int) *liveBar {
	opts := []mpb.ContainerOption{mpb.WithOutput(out), mpb.WithAutoRefresh()}
	if width > 0 {
		opts = append(opts, mpb.WithWidth(width))
	}
	return &liveBar{p: mpb.NewWithContext(ctx, opts...), name: name}
}

// set shows st: done nodes out of the total, and the counts by phase.
func (l *liveBar) set(st *opsv1.NodeJobStatus) {
	c := st.Counts
	l.setCounts(int64(c.Total), int64(c.Successful+c.Failure+c.Unknown),
		fmt.Sprintf("%s: %d ok, %d failed, %d unknown, %d running", orNone(string(st.Phase)), c.Successful, c.Failure, c.Unknown, c.InProgress))
}

// setCounts shows done nodes out of total, and status after the bar.
func (l *liveBar) setCounts(total, done int64, status string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.finished || total == 0 {
		return
	}
	l.statusMu.Lock()
	l.status = status
	l.statusMu.Unlock()
	l.done = done
	if l.b == nil || total != l.total {
		l.total = total
		if l.b == nil {
			l.b = l.p.AddBar(l.total,
				mpb.PrependDecorators(decor.Name(l.name+" "), decor.CountersNoUnit("%d/%d nodes ")),
				mpb.AppendDecorators(decor.Any(func(decor.Statistics) string {
					l.statusMu.Lock()
					defer l.statusMu.Unlock()
					return " " + l.status
				})),
			)
		} else {
			l.b.SetTotal(l.total, false)
		}
	}
	l.b.SetCurrent(l.done)
}

// stop completes the bar (or leaves it as it is if the job has not ended)
// and waits until it is drawn for the last time.
func (l *liveBar) stop() {
	l.mu.Lock()
	if l.finished {
		l.mu.Unlock()
		return
	}
	l.finished = true
	b, complete, total := l.b, l.done >= l.total, l.total
	l.mu.Unlock()
	switch {
	case b == nil:
	case complete:
		b.SetTotal(total, true)
	default:
		b.Abort(false)
	}
	l.p.Wait()
}
