// Package testkit holds the waits that Drover's tests share: Eventually
// polls a condition until it holds, Never checks that one stays false for a
// while. Both report the last reason the condition gave, and neither needs
// Kubernetes, so the agent's tests use them too.
//
// Timeouts are named and generous: a CI machine may be busy, and a test
// that fails because the machine is slow tests the machine, not Drover.
package testkit

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
)

const (
	// DefaultTimeout bounds a wait for something that must happen.
	DefaultTimeout = 60 * time.Second
	// ShortTimeout is how long a test watches for something that must not
	// happen (Never). It cannot prove a negative; it catches the common case.
	ShortTimeout = 500 * time.Millisecond
	// PollInterval is how often a condition is evaluated.
	PollInterval = 20 * time.Millisecond
)

// Eventually calls cond until it returns "" (done) or within passes, then
// fails the test with cond's last answer. cond returns why it is not done
// yet, e.g. "task phase Pending, want Running".
func Eventually(t testing.TB, within time.Duration, cond func() string) {
	t.Helper()
	if why := Wait(context.Background(), within, cond); why != "" {
		t.Fatalf("not within %v: %s", within, why)
	}
}

// Wait is Eventually without a test: it returns "" when cond held, or
// cond's last answer when within passed or ctx ended.
func Wait(ctx context.Context, within time.Duration, cond func() string) string {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	tick := time.NewTicker(PollInterval)
	defer tick.Stop()
	for {
		why := cond()
		if why == "" {
			return ""
		}
		select {
		case <-ctx.Done():
			return why
		case <-tick.C:
		}
	}
}

// Never calls cond for the whole of d and fails the test the first time it
// returns something other than "": cond says what happened that must not.
func Never(t testing.TB, d time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if what := cond(); what != "" {
			t.Fatalf("must not happen, but did: %s", what)
		}
		if !time.Now().Before(deadline) {
			return
		}
		time.Sleep(PollInterval)
	}
}

// VerifyNoLeaks runs a package's tests and then fails if goroutines they
// started are still running: call it from TestMain in packages that start
// goroutines (hub, agent, transports), as grpc-go's tests do.
func VerifyNoLeaks(m *testing.M, ignore ...goleak.Option) {
	goleak.VerifyTestMain(m, ignore...)
}

// VerifyNoLeaksAfter is VerifyNoLeaks for a TestMain that sets something
// up for all its tests (a control plane): teardown runs after the tests and
// before the check, so that what it stops is not taken for a leak.
func VerifyNoLeaksAfter(m *testing.M, teardown func(), ignore ...goleak.Option) {
	goleak.VerifyTestMain(runThen{m, teardown}, ignore...)
}

// runThen runs the tests, then teardown.
type runThen struct {
	m        *testing.M
	teardown func()
}

func (r runThen) Run() int {
	defer r.teardown()
	return r.m.Run()
}

// IgnorePahoBackoff ignores the goroutines the paho MQTT client leaves for
// up to its reconnect backoff after Disconnect (a reconnect attempt asleep
// in its backoff, and Disconnect's own waiter for it): they belong to the
// library, end by themselves within a second or so, and nothing outside
// paho can stop them sooner.
func IgnorePahoBackoff() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("github.com/eclipse/paho%2emqtt%2egolang.(*backoffController).sleepWithBackoff"),
		goleak.IgnoreTopFunction("github.com/eclipse/paho%2emqtt%2egolang.(*connectionStatus).Disconnecting"),
	}
}
