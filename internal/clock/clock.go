// Package clock is the one time source of Drover's hubs, agents and
// controllers. Code takes a Clock in its Options (default Real()) instead of
// calling time.Now, so that tests step time with clocktest.Fake rather than
// sleep, and no rule depends on how fast the machine is.
//
// It imports nothing from k8s.io: the agent uses it too.
package clock

import (
	"time"

	"github.com/jonboulle/clockwork"
)

// Clock tells the time and makes timers.
type Clock interface {
	Now() time.Time
	Since(t time.Time) time.Duration
	// After is time.After: the channel receives once d has passed.
	After(d time.Duration) <-chan time.Time
	NewTimer(d time.Duration) Timer
	NewTicker(d time.Duration) Ticker
}

// Timer is time.Timer behind an interface; read from Chan.
type Timer interface {
	Chan() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

// Ticker is time.Ticker behind an interface; read from Chan.
type Ticker interface {
	Chan() <-chan time.Time
	Stop()
	Reset(d time.Duration)
}

// Real is the wall clock.
func Real() Clock { return Wrap(clockwork.NewRealClock()) }

// Or returns c, or the wall clock when c is nil: the default of every
// Options.Clock field.
func Or(c Clock) Clock {
	if c == nil {
		return Real()
	}
	return c
}

// Wrap adapts a clockwork clock (real or fake). The dependency stays
// behind this package, so it can be swapped.
func Wrap(c clockwork.Clock) Clock { return wrapped{c} }

type wrapped struct{ c clockwork.Clock }

func (w wrapped) Now() time.Time                         { return w.c.Now() }
func (w wrapped) Since(t time.Time) time.Duration        { return w.c.Since(t) }
func (w wrapped) After(d time.Duration) <-chan time.Time { return w.c.After(d) }
func (w wrapped) NewTimer(d time.Duration) Timer         { return w.c.NewTimer(d) }
func (w wrapped) NewTicker(d time.Duration) Ticker       { return w.c.NewTicker(d) }

var _ Clock = wrapped{}
