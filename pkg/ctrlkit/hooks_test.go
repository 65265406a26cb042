package ctrlkit

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
)

type ctxKey struct{}

// hookLog records what Hooks see, one line per call.
type hookLog struct {
	mu    sync.Mutex // guards lines
	lines []string
}

func (l *hookLog) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, s)
}

func (l *hookLog) hooks() Hooks {
	return Hooks{
		BeforeAction: func(ctx context.Context, action string) {
			l.add("before " + action + " " + ctx.Value(ctxKey{}).(string))
		},
		AfterAction: func(ctx context.Context, r Report) {
			l.add("after " + r.Name + " " + r.Outcome.String() + " " + r.Duration.String() + " " + ctx.Value(ctxKey{}).(string))
		},
	}
}

func TestHooks(t *testing.T) {
	rows := []struct {
		name string
		wf   func(t *testing.T) Action
		want []string
	}{
		{"every action, before and after", func(t *testing.T) Action {
			return Sequential(newChild(t, kNone), newChild(t, kAfter1))
		}, []string{
			"before Sequential v", "before noRequeue v", "after noRequeue noRequeue 1s v",
			"before requeueAfter 1s v", "after requeueAfter 1s requeueAfter 1s v", "after Sequential requeueAfter 5s v",
		}},
		{"errors and exits", func(t *testing.T) Action {
			return Join(newChild(t, kErr1), newChild(t, kExit))
		}, []string{
			"before Join v", "before error1 v", "after error1 error 1s v",
			"before exit v", "after exit exit 1s v", "after Join error 5s v",
		}},
		{"a panic is reported before it goes on", func(t *testing.T) Action {
			return newChild(t, kPanic)
		}, []string{"before panic v", "after panic panic 1s v"}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			var log hookLog
			wf := row.wf(t)
			a := Instrument(wf, InstrumentOptions{Observer: log.hooks(), Now: fakeNow()})
			_, _ = outcome(context.WithValue(t.Context(), ctxKey{}, "v"), a)
			if !slices.Equal(log.lines, row.want) {
				t.Errorf("Hooks on %s saw\n%s\nwant\n%s", wf.Description(), strings.Join(log.lines, "\n"), strings.Join(row.want, "\n"))
			}
		})
	}
}

func TestNilHooksAreSkipped(t *testing.T) {
	for _, h := range []Hooks{{}, {BeforeAction: func(context.Context, string) {}}} {
		a := Instrument(newChild(t, kAfter1), InstrumentOptions{Observer: h})
		if got, _ := outcome(t.Context(), a); got != "after 1s" {
			t.Errorf("%s with hooks %+v = %q, want after 1s", a.Description(), h, got)
		}
	}
}

// TestInstrumentSeesAnObservedActionOnce checks that instrumenting a
// workflow whose actions already report to hooks (a generated manager's)
// reports each action to each observer once.
func TestInstrumentSeesAnObservedActionOnce(t *testing.T) {
	var hooks, all recorder
	leaf := Observe(newChild(t, kNone), InstrumentOptions{Observer: &hooks})
	wf := Instrument(Join(leaf, newChild(t, kNow)), InstrumentOptions{Observer: &all})
	_, _ = wf.Run(t.Context())
	names := func(r *recorder) []string {
		var out []string
		for _, l := range r.lines {
			out = append(out, strings.Fields(l)[0])
		}
		return out
	}
	if got, want := names(&hooks), []string{"noRequeue"}; !slices.Equal(got, want) {
		t.Errorf("the hooks saw %v, want %v", got, want)
	}
	if got, want := names(&all), []string{"noRequeue", "requeue", "Join"}; !slices.Equal(got, want) {
		t.Errorf("the workflow's observer saw %v, want %v", got, want)
	}
}

func TestObserversLeavesOutNil(t *testing.T) {
	if o := Observers(nil, nil); o != nil {
		t.Errorf("Observers(nil, nil) = %v, want nil", o)
	}
	var rec recorder
	if o := Observers(nil, &rec); o != Observer(&rec) {
		t.Errorf("Observers(nil, rec) = %v, want rec itself", o)
	}
	a := Observe(Nop(), InstrumentOptions{Observer: Observers()})
	if _, ok := a.(nopAction); !ok {
		t.Errorf("Observe(Nop, Observers()) = %T, want the action unchanged", a)
	}
}
