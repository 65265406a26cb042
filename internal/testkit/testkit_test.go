package testkit_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/testkit"
)

func TestEventuallyReturnsOnceTheConditionHolds(t *testing.T) {
	var n atomic.Int32
	testkit.Eventually(t, testkit.DefaultTimeout, func() string {
		if n.Add(1) < 3 {
			return fmt.Sprintf("called %d times", n.Load())
		}
		return ""
	})
	if n.Load() != 3 {
		t.Fatalf("cond called %d times, want 3", n.Load())
	}
}

func TestWaitGivesTheLastReason(t *testing.T) {
	got := testkit.Wait(context.Background(), 50*time.Millisecond, func() string { return "still pending" })
	if got != "still pending" {
		t.Fatalf("Wait = %q, want the condition's last reason", got)
	}
}

func TestNeverPassesWhenNothingHappens(t *testing.T) {
	calls := 0
	testkit.Never(t, 60*time.Millisecond, func() string { calls++; return "" })
	if calls < 2 {
		t.Fatalf("cond called %d times over the window, want it polled", calls)
	}
}

func TestMain(m *testing.M) { testkit.VerifyNoLeaks(m) }
