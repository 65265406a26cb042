package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"
)

// serverLogName is the file under --data-dir that holds the full log of
// `drover server` and `drover up`.
const serverLogName = "server.log"

// serverLog is the logger of `drover server` and `drover up`. Every record
// at --log-level goes to <data-dir>/server.log; the terminal gets warnings
// and errors only, as controller-runtime's info chatter (pages of
// "Starting EventSource") hides Drover's own progress lines, unless
// --verbose asks for everything there too.
type serverLog struct {
	*slog.Logger
	path string
	file *os.File
	// stopping is set once the stop is ours (Ctrl-C): see stopHandler.
	stopping *atomic.Bool
}

func (g *globalOptions) serverLogger(term io.Writer, dataDir string, verbose bool) (*serverLog, error) {
	lvl, err := g.level()
	if err != nil {
		return nil, err
	}
	// The control plane makes it too; the log file must open first.
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create --data-dir: %w", err)
	}
	path, err := filepath.Abs(filepath.Join(dataDir, serverLogName))
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open the server log: %w", err)
	}
	termLvl := max(lvl, slog.LevelWarn)
	if verbose {
		termLvl = lvl
	}
	s := &serverLog{path: path, file: f, stopping: new(atomic.Bool)}
	h := stopHandler{stopping: s.stopping, h: fanout{
		slog.NewTextHandler(f, &slog.HandlerOptions{Level: lvl}),
		slog.NewTextHandler(term, &slog.HandlerOptions{Level: termLvl}),
	}}
	s.Logger = slog.New(h)
	// controller-runtime reads its logger from a process-wide slot; fill it
	// once here, at the program's edge, so library code never touches it.
	ctrl.SetLogger(logr.FromSlogHandler(h))
	return s, nil
}

// stopOn marks the stop as ours once ctx ends.
func (s *serverLog) stopOn(ctx context.Context) (unregister func() bool) {
	return context.AfterFunc(ctx, func() { s.stopping.Store(true) })
}

func (s *serverLog) Close() error { return s.file.Close() }

// fanout hands each record to every handler that takes its level.
type fanout []slog.Handler

var _ slog.Handler = fanout{}

func (f fanout) Enabled(ctx context.Context, l slog.Level) bool {
	for _, h := range f {
		if h.Enabled(ctx, l) {
			return true
		}
	}
	return false
}

func (f fanout) Handle(ctx context.Context, r slog.Record) error {
	var errs []error
	for _, h := range f {
		if h.Enabled(ctx, r.Level) {
			errs = append(errs, h.Handle(ctx, r.Clone()))
		}
	}
	return errors.Join(errs...)
}

func (f fanout) WithAttrs(as []slog.Attr) slog.Handler {
	out := make(fanout, len(f))
	for i, h := range f {
		out[i] = h.WithAttrs(as)
	}
	return out
}

func (f fanout) WithGroup(name string) slog.Handler {
	out := make(fanout, len(f))
	for i, h := range f {
		out[i] = h.WithGroup(name)
	}
	return out
}

// stopHandler lowers to info the errors controller-runtime logs on every
// stop it was asked for: its leader elector always reports "leader
// election lost" when it returns, and the manager logs that as an error
// once its stop sequence runs, even after it released the Lease. A lease
// lost while running is still an error.
type stopHandler struct {
	stopping *atomic.Bool
	h        slog.Handler
}

var _ slog.Handler = stopHandler{}

// The record controller-runtime logs as an error on every stop with
// leader election.
const (
	stopSequenceMessage = "error received after stop sequence was engaged"
	leaseLostError      = "leader election lost"
)

func (s stopHandler) Enabled(ctx context.Context, l slog.Level) bool { return s.h.Enabled(ctx, l) }

func (s stopHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError && r.Message == stopSequenceMessage && s.stopping.Load() && leaseLost(r) {
		out := slog.NewRecord(r.Time, slog.LevelInfo, r.Message+" (a normal stop)", r.PC)
		r.Attrs(func(a slog.Attr) bool { out.AddAttrs(a); return true })
		r = out
		if !s.h.Enabled(ctx, r.Level) {
			return nil
		}
	}
	return s.h.Handle(ctx, r)
}

// leaseLost reports whether r's error is the leader elector's.
func leaseLost(r slog.Record) bool {
	lost := false
	r.Attrs(func(a slog.Attr) bool {
		if err, ok := a.Value.Any().(error); ok && err.Error() == leaseLostError {
			lost = true
		}
		return !lost
	})
	return lost
}

func (s stopHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return stopHandler{stopping: s.stopping, h: s.h.WithAttrs(as)}
}

func (s stopHandler) WithGroup(name string) slog.Handler {
	return stopHandler{stopping: s.stopping, h: s.h.WithGroup(name)}
}
