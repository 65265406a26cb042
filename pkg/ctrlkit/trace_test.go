package ctrlkit

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
)

// recorder is an Observer that keeps one line per report.
type recorder struct {
	mu    sync.Mutex // guards lines
	lines []string
}

func (r *recorder) ObserveAction(ctx context.Context, a Action) (context.Context, func(Report)) {
	return ctx, func(rep Report) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.lines = append(r.lines, rep.Name+" "+rep.Outcome.String()+" "+rep.Duration.String())
	}
}

// fakeNow is a clock that moves one second per reading.
func fakeNow() func() time.Time {
	var mu sync.Mutex
	now := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		now = now.Add(time.Second)
		return now
	}
}

func TestInstrumentReportsEveryAction(t *testing.T) {
	var rec recorder
	s := Shared(newChild(t, kAfter2))
	wf := Join(
		newChild(t, kNone),
		Sequential(newChild(t, kExit), newChild(t, kNow)),
		If(true, newChild(t, kErr1)),
		s, s,
	)
	a := Instrument(wf, InstrumentOptions{Observer: &rec, Now: fakeNow()})
	got, _ := outcome(t.Context(), a)
	if want, _ := outcome(t.Context(), wf); got != want {
		t.Errorf("Instrument(%s) = %q, want %q as uninstrumented", wf.Description(), got, want)
	}
	want := []string{
		"noRequeue noRequeue 1s",
		"exit exit 1s",
		"Sequential exit 3s",
		"error1 error 1s",
		"If error 3s",
		"requeueAfter 2s requeueAfter 1s", // once, though referenced twice
		"Join error 13s",
	}
	if !slices.Equal(rec.lines, want) {
		t.Errorf("Instrument(%s) reported\n%s\nwant\n%s", wf.Description(), strings.Join(rec.lines, "\n"), strings.Join(want, "\n"))
	}
	if a.Description() != wf.Description() {
		t.Errorf("Instrument changed the description to %s", a.Description())
	}
}

func TestInstrumentReportsPanicsAndTimeouts(t *testing.T) {
	var rec recorder
	a := Instrument(Join(newChild(t, kPanic), Timeout(shortTimeout, newChild(t, kSlow))), InstrumentOptions{Observer: &rec})
	got, _ := outcome(t.Context(), a)
	if got != "panic: boom" {
		t.Errorf("%s = %q, want the panic", a.Description(), got)
	}
	var outcomes []string
	for _, l := range rec.lines {
		f := strings.Fields(l)
		outcomes = append(outcomes, f[0]+" "+f[1])
	}
	want := []string{"panic panic", "Timeout timeout", "Join panic"}
	if !slices.Equal(outcomes, want) {
		t.Errorf("reports = %v, want %v", outcomes, want)
	}
}

func TestLogObserver(t *testing.T) {
	var lines []string
	logger := funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{Verbosity: 1})
	a := Instrument(Join(newChild(t, kAfter1), newChild(t, kErr1)), InstrumentOptions{
		Observer: LogObserver{Level: 1},
		Now:      fakeNow(),
	})
	_, _ = a.Run(logr.NewContext(t.Context(), logger))
	want := []string{
		`"level"=1 "msg"="action started" "action"="Join"`,
		`"level"=1 "msg"="action started" "action"="requeueAfter 1s"`,
		`"level"=1 "msg"="action finished" "action"="requeueAfter 1s" "outcome"="requeueAfter" "duration"="1s" "requeueAfter"="1s"`,
		`"level"=1 "msg"="action started" "action"="error1"`,
		`"level"=1 "msg"="action finished" "action"="error1" "outcome"="error" "duration"="1s" "error"="error1"`,
		`"level"=1 "msg"="action finished" "action"="Join" "outcome"="error" "duration"="5s" "requeueAfter"="1s" "error"="error1"`,
	}
	if !slices.Equal(lines, want) {
		t.Errorf("LogObserver logged\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}

	lines = nil
	_, _ = Instrument(newChild(t, kNone), InstrumentOptions{Observer: LogObserver{Logger: logger, Level: 2}}).Run(t.Context())
	if len(lines) != 0 {
		t.Errorf("LogObserver at level 2 logged %q with verbosity 1, want nothing", lines)
	}
}

func TestObserversNest(t *testing.T) {
	var order []string
	obs := func(name string) Observer {
		return ObserverFunc(func(ctx context.Context, a Action) (context.Context, func(Report)) {
			order = append(order, name+" start")
			return ctx, func(Report) { order = append(order, name+" end") }
		})
	}
	_, _ = Observe(Nop(), InstrumentOptions{Observer: Observers(obs("a"), obs("b"))}).Run(t.Context())
	if want := []string{"a start", "b start", "b end", "a end"}; !slices.Equal(order, want) {
		t.Errorf("Observers(a, b) ran %v, want %v", order, want)
	}
}
