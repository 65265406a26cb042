package ctrlkit

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

func TestResultHelpers(t *testing.T) {
	rows := []struct {
		name string
		res  reconcile.Result
		err  error
		want string
	}{
		{"RequeueImmediately", must(RequeueImmediately()), nil, "requeue"},
		{"RequeueAfter(3s)", must(RequeueAfter(3 * time.Second)), nil, "after 3s"},
		{"RequeueAfter(-1s)", must(RequeueAfter(-time.Second)), nil, "noRequeue"},
		{"NoRequeue", must(NoRequeue()), nil, "noRequeue"},
	}
	res, err := RequeueIfError(errOne)
	rows = append(rows, struct {
		name string
		res  reconcile.Result
		err  error
		want string
	}{"RequeueIfError(error1)", res, err, "error: error1"})
	res, err = RequeueIfErrorAndWrap("update status", errOne)
	rows = append(rows, struct {
		name string
		res  reconcile.Result
		err  error
		want string
	}{"RequeueIfErrorAndWrap(update status, error1)", res, err, "error: update status: error1"})
	res, err = Exit()
	rows = append(rows, struct {
		name string
		res  reconcile.Result
		err  error
		want string
	}{"Exit", res, err, "exit"})
	for _, row := range rows {
		if got := show(row.res, row.err); got != row.want {
			t.Errorf("%s = %q, want %q", row.name, got, row.want)
		}
	}
	if _, err := RequeueIfErrorAndWrap("x", nil); err != nil {
		t.Errorf("RequeueIfErrorAndWrap(x, nil) = %v, want nil", err)
	}
	if !errors.Is(err, ErrExit) {
		t.Errorf("Exit() = %v, want ErrExit", err)
	}
}

func must(res reconcile.Result, err error) reconcile.Result {
	if err != nil {
		panic(err)
	}
	return res
}

func TestIsExit(t *testing.T) {
	rows := []struct {
		err  error
		want bool
	}{
		{nil, false},
		{ErrExit, true},
		{fmt.Errorf("being deleted: %w", ErrExit), true},
		{errors.Join(ErrExit, fmt.Errorf("x: %w", ErrExit)), true},
		{fmt.Errorf("outer: %w", errors.Join(ErrExit, ErrExit)), true},
		{errors.Join(ErrExit, errOne), false},
		{fmt.Errorf("%w and %w", ErrExit, errOne), false},
		{errOne, false},
	}
	for _, row := range rows {
		if got := IsExit(row.err); got != row.want {
			t.Errorf("IsExit(%v) = %v, want %v", row.err, got, row.want)
		}
	}
}

func TestIgnoreExit(t *testing.T) {
	res, err := IgnoreExit(reconcile.Result{RequeueAfter: d1}, fmt.Errorf("done: %w", ErrExit))
	if got := show(res, err); got != "after 1s" {
		t.Errorf("IgnoreExit(after 1s, exit) = %q, want %q", got, "after 1s")
	}
	mixed := errors.Join(ErrExit, errOne)
	if _, err := IgnoreExit(reconcile.Result{}, mixed); err != mixed { //nolint:errorlint // identity wanted
		t.Errorf("IgnoreExit(exit and error1) = %v, want the error unchanged", err)
	}
}

func TestOutcomeOf(t *testing.T) {
	rows := []struct {
		res  reconcile.Result
		err  error
		want Outcome
	}{
		{reconcile.Result{}, nil, OutcomeNoRequeue},
		{reconcile.Result{Requeue: true}, nil, OutcomeRequeue},
		{reconcile.Result{RequeueAfter: d1}, nil, OutcomeRequeueAfter},
		{reconcile.Result{RequeueAfter: d1}, ErrExit, OutcomeExit},
		{reconcile.Result{}, &TimeoutError{Action: "x", After: d1}, OutcomeTimeout},
		{reconcile.Result{Requeue: true}, errOne, OutcomeError},
	}
	for _, row := range rows {
		if got := OutcomeOf(row.res, row.err); got != row.want {
			t.Errorf("OutcomeOf(%s) = %s, want %s", show(row.res, row.err), got, row.want)
		}
	}
}
