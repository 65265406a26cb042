// Package clocktest is a fake clock.Clock for tests: time moves only when
// the test calls Step, and BlockUntilWaiters tells when the code under test
// waits on a timer, so tests need no sleeps.
package clocktest

import (
	"context"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/drover-fleet/drover/internal/clock"
)

// Fake is a clock.Clock that a test steps.
type Fake struct {
	clock.Clock
	f *clockwork.FakeClock
}

// New returns a fake clock at start (a fixed date when zero).
func New(start time.Time) *Fake {
	if start.IsZero() {
		start = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	}
	f := clockwork.NewFakeClockAt(start)
	return &Fake{Clock: clock.Wrap(f), f: f}
}

// Step moves time forward by d, firing the timers it passes.
func (f *Fake) Step(d time.Duration) { f.f.Advance(d) }

// BlockUntilWaiters waits until n timers, tickers or After calls wait on the
// clock, or ctx ends.
func (f *Fake) BlockUntilWaiters(ctx context.Context, n int) error {
	return f.f.BlockUntilContext(ctx, n)
}

var _ clock.Clock = (*Fake)(nil)
