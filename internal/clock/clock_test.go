package clock_test

import (
	"context"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/clock/clocktest"
)

func TestFakeTimerFiresOnlyWhenStepped(t *testing.T) {
	c := clocktest.New(time.Time{})
	start := c.Now()
	tm := c.NewTimer(time.Minute)
	c.Step(59 * time.Second)
	select {
	case <-tm.Chan():
		t.Fatal("timer fired before its time")
	default:
	}
	c.Step(time.Second)
	select {
	case got := <-tm.Chan():
		if !got.Equal(start.Add(time.Minute)) {
			t.Fatalf("timer fired at %v, want %v", got, start.Add(time.Minute))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("timer did not fire after a Step past it")
	}
	if c.Since(start) != time.Minute {
		t.Fatalf("Since = %v, want 1m", c.Since(start))
	}
}

func TestBlockUntilWaiters(t *testing.T) {
	c := clocktest.New(time.Time{})
	done := make(chan struct{})
	go func() { <-c.After(time.Hour); close(done) }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.BlockUntilWaiters(ctx, 1); err != nil {
		t.Fatal(err)
	}
	c.Step(time.Hour)
	<-done
}

func TestOrDefaultsToTheWallClock(t *testing.T) {
	if d := time.Since(clock.Or(nil).Now()); d < 0 || d > time.Minute {
		t.Fatalf("Or(nil).Now() is %v off the wall clock", d)
	}
}
