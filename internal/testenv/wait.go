package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/drover-fleet/drover/internal/testkit"
)

const (
	// DefaultTimeout is how long a test waits for something that should
	// happen: a controller reconciling, an agent reporting.
	DefaultTimeout = testkit.DefaultTimeout
	// ShortTimeout is how long a test waits for something that should happen
	// almost at once (an object visible right after it was written), or
	// watches for something that must not happen.
	ShortTimeout = 5 * time.Second
	// PollInterval is how often Eventually and WaitFor check.
	PollInterval = testkit.PollInterval
)

// Eventually polls cond every PollInterval until it returns true, failing t
// (with the last error cond returned, if any) when timeout passes first. An
// error from cond does not stop the polling: it is remembered as the reason.
// what describes the condition for the failure message.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	if err := poll(context.Background(), timeout, cond); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// Never polls cond every PollInterval for the whole of d and fails t if it
// ever returns true (or an error).
func Never(t testing.TB, d time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	testkit.Never(t, d, func() string {
		ok, err := cond(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			return fmt.Sprintf("%s: %v", what, err)
		case ok:
			return what
		}
		return ""
	})
}

// WaitFor polls a Get of key into obj until ready(obj) is true (a nil ready
// means "exists"), failing t after timeout. obj holds the last version read.
func WaitFor(t testing.TB, c client.Client, timeout time.Duration, key client.ObjectKey, obj client.Object, ready func(client.Object) bool) {
	t.Helper()
	kind := fmt.Sprintf("%T", obj)
	err := poll(context.Background(), timeout, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, key, obj); err != nil {
			return false, err
		}
		return ready == nil || ready(obj), nil
	})
	if err != nil {
		t.Fatalf("wait for %s %s: %v", kind, key, err)
	}
}

// CreateAndWait creates obj and then waits, up to DefaultTimeout, until a Get
// returns it and ready(obj) is true (nil ready means "exists"). obj holds the
// last version read.
func CreateAndWait(t testing.TB, c client.Client, obj client.Object, ready func(client.Object) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), DefaultTimeout)
	defer cancel()
	if err := c.Create(ctx, obj); err != nil {
		t.Fatalf("create %T %s: %v", obj, client.ObjectKeyFromObject(obj), err)
	}
	WaitFor(t, c, DefaultTimeout, client.ObjectKeyFromObject(obj), obj, ready)
}

// WaitForDeletion polls until a Get of obj's key returns NotFound.
func WaitForDeletion(t testing.TB, c client.Client, timeout time.Duration, obj client.Object) {
	t.Helper()
	key := client.ObjectKeyFromObject(obj)
	err := poll(context.Background(), timeout, func(ctx context.Context) (bool, error) {
		err := c.Get(ctx, key, obj)
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		return false, fmt.Errorf("still there (deletionTimestamp %v, finalizers %v)", obj.GetDeletionTimestamp(), obj.GetFinalizers())
	})
	if err != nil {
		t.Fatalf("wait for deletion of %T %s: %v", obj, key, err)
	}
}

// poll runs cond until it is true, returning an error naming the timeout
// and cond's last error when timeout passes first.
func poll(ctx context.Context, timeout time.Duration, cond func(ctx context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	if testkit.Wait(ctx, timeout, func() string {
		ok, err := cond(ctx)
		if ok && err == nil {
			return ""
		}
		if err != nil && ctx.Err() == nil {
			last = err
		}
		return "not done"
	}) == "" {
		return nil
	}
	if last != nil {
		return fmt.Errorf("not done within %s; last error: %w", timeout, last)
	}
	return fmt.Errorf("not done within %s", timeout)
}
