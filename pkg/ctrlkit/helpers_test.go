package ctrlkit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/drover-fleet/drover/internal/testkit"
)

const (
	// defaultTestTimeout bounds anything that must happen.
	defaultTestTimeout = testkit.DefaultTimeout
	// shortTimeout is how long we wait for something that must not
	// happen, and the deadline given to actions that never finish.
	shortTimeout = 20 * time.Millisecond

	d1 = 1 * time.Second
	d2 = 2 * time.Second
)

var (
	errOne = errors.New("error1")
	errTwo = errors.New("error2")
)

// kind is one kind of child outcome.
type kind string

const (
	kNone    kind = "noRequeue"
	kNow     kind = "requeue"
	kAfter1  kind = "requeueAfter 1s"
	kAfter2  kind = "requeueAfter 2s"
	kErr1    kind = "error1"
	kErr2    kind = "error2"
	kExit    kind = "exit"
	kPanic   kind = "panic"
	kBang    kind = "bang"    // a second panic, with value "bang"
	kSlow    kind = "slow"    // ignores ctx; returns noRequeue when released
	kSlowCtx kind = "slowCtx" // waits for ctx to end and returns its error
)

// allKinds are the kinds that finish on their own.
var allKinds = []kind{kNone, kNow, kAfter1, kAfter2, kErr1, kExit, kPanic}

// child is a test action of one kind that counts its runs.
type child struct {
	kind    kind
	runs    atomic.Int32
	release chan struct{}
	started chan struct{} // closed at the first run
	once    atomic.Bool
}

func newChild(t *testing.T, k kind) *child {
	c := &child{kind: k, release: make(chan struct{}), started: make(chan struct{})}
	// Slow children must not outlive the test, even one that failed.
	t.Cleanup(c.unblock)
	return c
}

func (c *child) unblock() {
	select {
	case <-c.release:
	default:
		close(c.release)
	}
}

func (c *child) Description() string { return string(c.kind) }

func (c *child) Run(ctx context.Context) (reconcile.Result, error) {
	c.runs.Add(1)
	if c.once.CompareAndSwap(false, true) {
		close(c.started)
	}
	switch c.kind {
	case kNow:
		return RequeueImmediately()
	case kAfter1:
		return RequeueAfter(d1)
	case kAfter2:
		return RequeueAfter(d2)
	case kErr1:
		return RequeueIfError(errOne)
	case kErr2:
		return RequeueIfError(errTwo)
	case kExit:
		return Exit()
	case kPanic:
		panic("boom")
	case kBang:
		panic("bang")
	case kSlow:
		<-c.release
		return NoRequeue()
	case kSlowCtx:
		<-ctx.Done()
		return RequeueIfError(ctx.Err())
	default:
		return NoRequeue()
	}
}

var _ Action = (*child)(nil)

func children(t *testing.T, kinds ...kind) ([]*child, []Action) {
	cs := make([]*child, len(kinds))
	as := make([]Action, len(kinds))
	for i, k := range kinds {
		cs[i] = newChild(t, k)
		as[i] = cs[i]
	}
	return cs, as
}

// show renders an outcome compactly so that table rows and failure
// messages read like the rules: "requeue after 1s; error: error1".
func show(res reconcile.Result, err error) string {
	var parts []string
	var r []string
	if res.Requeue { //nolint:staticcheck // testing the deprecated field on purpose
		r = append(r, "requeue")
	}
	if res.RequeueAfter > 0 {
		r = append(r, "after "+res.RequeueAfter.String())
	}
	if len(r) == 0 && err == nil {
		r = append(r, "noRequeue")
	}
	if len(r) > 0 {
		parts = append(parts, strings.Join(r, " "))
	}
	switch {
	case err == nil:
	case IsExit(err):
		parts = append(parts, "exit")
	default:
		parts = append(parts, "error: "+strings.ReplaceAll(err.Error(), "\n", " | "))
	}
	return strings.Join(parts, "; ")
}

// outcome runs a and renders its outcome, or its panic as "panic: value".
func outcome(ctx context.Context, a Action) (got string, err error) {
	defer func() {
		if v := recover(); v != nil {
			if p, ok := v.(*PanicError); ok {
				v = p.Value
			}
			got = fmt.Sprintf("panic: %v", v)
		}
	}()
	res, err := a.Run(ctx)
	return show(res, err), err
}

// outcomeAsync runs a in a goroutine. If block is set it first checks that
// a is still running after shortTimeout, then releases the slow children.
func outcomeAsync(t *testing.T, a Action, block bool, cs []*child) (string, error) {
	t.Helper()
	type out struct {
		got string
		err error
	}
	done := make(chan out, 1)
	go func() {
		got, err := outcome(context.Background(), a)
		done <- out{got, err}
	}()
	if block {
		select {
		case o := <-done:
			t.Fatalf("%s returned %q before its slow child was released", a.Description(), o.got)
		case <-time.After(shortTimeout):
		}
		for _, c := range cs {
			c.unblock()
		}
	}
	select {
	case o := <-done:
		return o.got, o.err
	case <-time.After(defaultTestTimeout):
		t.Fatalf("%s did not return within %s", a.Description(), defaultTestTimeout)
		return "", nil
	}
}

func runs(cs []*child) []int {
	out := make([]int, len(cs))
	for i, c := range cs {
		out[i] = int(c.runs.Load())
	}
	return out
}

// single is the outcome of one child of each kind run on its own.
var single = map[kind]string{
	kNone:   "noRequeue",
	kNow:    "requeue",
	kAfter1: "after 1s",
	kAfter2: "after 2s",
	kErr1:   "error: error1",
	kErr2:   "error: error2",
	kExit:   "exit",
	kPanic:  "panic: boom",
}
