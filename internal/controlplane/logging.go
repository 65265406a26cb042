package controlplane

import (
	"context"
	"io"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// openLog opens (appending) one of the control plane's log files.
func openLog(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
}

// teeHandler writes every record to a file handler and forwards records at
// Error and above to the caller's handler: the full log stays in a file, and
// the operator still sees what went wrong.
type teeHandler struct {
	file slog.Handler
	errs slog.Handler
}

var _ slog.Handler = teeHandler{}

// newTeeHandler returns a handler writing records of level >= fileLevel as
// text to w, and records of level >= Error also to errs.
func newTeeHandler(w io.Writer, fileLevel slog.Level, errs slog.Handler) teeHandler {
	return teeHandler{
		file: slog.NewTextHandler(w, &slog.HandlerOptions{Level: fileLevel}),
		errs: errs,
	}
}

func (h teeHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.file.Enabled(ctx, l) || (l >= slog.LevelError && h.errs.Enabled(ctx, l))
}

func (h teeHandler) Handle(ctx context.Context, r slog.Record) error {
	var err error
	if h.file.Enabled(ctx, r.Level) {
		err = h.file.Handle(ctx, r.Clone())
	}
	if r.Level >= slog.LevelError && h.errs.Enabled(ctx, r.Level) {
		if e := h.errs.Handle(ctx, r); err == nil {
			err = e
		}
	}
	return err
}

func (h teeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return teeHandler{file: h.file.WithAttrs(as), errs: h.errs.WithAttrs(as)}
}

func (h teeHandler) WithGroup(name string) slog.Handler {
	return teeHandler{file: h.file.WithGroup(name), errs: h.errs.WithGroup(name)}
}

// newEtcdLogger returns a zap logger for embedded etcd that writes JSON lines
// at info and above to w and forwards errors to errs.
func newEtcdLogger(w io.Writer, errs slog.Handler) *zap.Logger {
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	fileCore := zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.AddSync(w), zapcore.InfoLevel)
	return zap.New(zapcore.NewTee(fileCore, &slogCore{h: errs}))
}

// slogCore is a zapcore.Core that forwards entries at Error and above to a
// slog.Handler.
type slogCore struct {
	h      slog.Handler
	fields []zapcore.Field
}

var _ zapcore.Core = (*slogCore)(nil)

func (c *slogCore) Enabled(l zapcore.Level) bool { return l >= zapcore.ErrorLevel }

func (c *slogCore) With(fs []zapcore.Field) zapcore.Core {
	return &slogCore{h: c.h, fields: append(slices.Clone(c.fields), fs...)}
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fs []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fs {
		f.AddTo(enc)
	}
	keys := make([]string, 0, len(enc.Fields))
	for k := range enc.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	r := slog.NewRecord(e.Time, slog.LevelError, e.Message, 0)
	for _, k := range keys {
		r.AddAttrs(slog.Any(k, enc.Fields[k]))
	}
	return c.h.Handle(context.Background(), r)
}

func (c *slogCore) Sync() error { return nil }

// errGate decides what happens to the errors forwarded to the operator's
// logger. kube-apiserver and etcd log a handful of harmless errors on every
// start (an empty metrics manifest, "kube-system not found" before the
// bootstrap controller made it) and at shutdown (closed listeners). So:
// while starting, errors are held back (the last maxHeld), and shown only if
// the start fails; while serving they are forwarded as they come; once
// stopping they stay in the files only.
type errGate struct {
	mu    sync.Mutex
	state gateState
	held  []heldRecord
}

type gateState int

const (
	gateStarting gateState = iota
	gateServing
	gateStopping
)

const maxHeld = 50

type heldRecord struct {
	h slog.Handler
	r slog.Record
}

// serving drops what was held back and forwards from now on.
func (g *errGate) serving() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.state, g.held = gateServing, nil
}

// failed forwards what was held back, for a start that failed.
func (g *errGate) failed() {
	g.mu.Lock()
	held := g.held
	g.state, g.held = gateStopping, nil
	g.mu.Unlock()
	for _, h := range held {
		_ = h.h.Handle(context.Background(), h.r)
	}
}

// stopping stops forwarding.
func (g *errGate) stopping() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.state, g.held = gateStopping, nil
}

// handler wraps h so that records pass through the gate.
func (g *errGate) handler(h slog.Handler) slog.Handler { return gatedHandler{h: h, g: g} }

type gatedHandler struct {
	h slog.Handler
	g *errGate
}

var _ slog.Handler = gatedHandler{}

func (h gatedHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.h.Enabled(ctx, l) }

// retried lists errors the embedded components log and then recover from
// by themselves, which the operator can do nothing about: they stay in the
// files. The garbage collector's graph builder, on a loaded machine, may
// take longer than its sync allows; it says so as an error and syncs on
// its next period.
var retried = []string{
	"timed out waiting for dependency graph builder sync during GC sync",
}

// isRetried reports whether r is one of the retried errors, in its message
// or (utilruntime.HandleError's "Unhandled Error") in its err attribute.
func isRetried(r slog.Record) bool {
	texts := []string{r.Message}
	r.Attrs(func(a slog.Attr) bool {
		texts = append(texts, a.Value.String())
		return true
	})
	for _, t := range texts {
		for _, m := range retried {
			if strings.Contains(t, m) {
				return true
			}
		}
	}
	return false
}

func (h gatedHandler) Handle(ctx context.Context, r slog.Record) error {
	if isRetried(r) {
		return nil
	}
	h.g.mu.Lock()
	switch h.g.state {
	case gateStarting:
		if len(h.g.held) == maxHeld {
			h.g.held = h.g.held[1:]
		}
		h.g.held = append(h.g.held, heldRecord{h: h.h, r: r.Clone()})
		h.g.mu.Unlock()
		return nil
	case gateStopping:
		h.g.mu.Unlock()
		return nil
	}
	h.g.mu.Unlock()
	return h.h.Handle(ctx, r)
}

func (h gatedHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return gatedHandler{h: h.h.WithAttrs(as), g: h.g}
}

func (h gatedHandler) WithGroup(name string) slog.Handler {
	return gatedHandler{h: h.h.WithGroup(name), g: h.g}
}
