package ctrlkit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// combinators are every combinator taking a list (or one) child, each
// described as a constructor so that the tables below can run against all of
// them.
var combinators = []struct {
	name string
	make func(children ...Action) Action
}{
	{"Join", Join},
	{"JoinOrdered", JoinOrdered},
	{"ParallelJoin", ParallelJoin},
	{"Sequential", Sequential},
	{"Timeout", func(cs ...Action) Action { return Timeout(defaultTestTimeout, Join(cs...)) }},
	{"If", func(cs ...Action) Action { return If(true, Join(cs...)) }},
	{"IfElse then", func(cs ...Action) Action { return IfElse(true, Join(cs...), ExitIf(true)) }},
	{"IfElse else", func(cs ...Action) Action { return IfElse(false, ExitIf(true), Join(cs...)) }},
	{"Retry", func(cs ...Action) Action {
		return Retry(RetryOptions{Attempts: 1}, Join(cs...))
	}},
	{"Shared", func(cs ...Action) Action { return Shared(Join(cs...)) }},
}

// TestCombinatorOfOneChildHasTheChildsOutcome checks every combinator
// against every kind of child on its own: each is transparent then.
func TestCombinatorOfOneChildHasTheChildsOutcome(t *testing.T) {
	for _, comb := range combinators {
		for _, k := range allKinds {
			t.Run(comb.name+" of "+string(k), func(t *testing.T) {
				cs, as := children(t, k)
				a := comb.make(as...)
				got, _ := outcomeAsync(t, a, false, cs)
				if want := single[k]; got != want {
					t.Errorf("%s = %q, want %q", a.Description(), got, want)
				}
				if got := runs(cs); got[0] != 1 {
					t.Errorf("%s ran its child %d times, want 1", a.Description(), got[0])
				}
			})
		}
	}
}

// joinRows apply to Join, JoinOrdered and ParallelJoin alike: they run every
// child and join the outcomes by the same rules.
var joinRows = []struct {
	name  string
	kinds []kind
	want  string
	block bool // a slow child holds the join until released
}{
	{"an empty join asks for nothing", nil, "noRequeue", false},
	{"successes stay successes", []kind{kNone, kNone}, "noRequeue", false},
	{"any requeue wins", []kind{kNone, kNow}, "requeue", false},
	{"requeue wins over a later success", []kind{kNow, kNone}, "requeue", false},
	{"the shortest requeue-after wins", []kind{kAfter2, kAfter1}, "after 1s", false},
	{"the shortest requeue-after wins in either order", []kind{kAfter1, kAfter2}, "after 1s", false},
	{"a requeue-after survives a success", []kind{kNone, kAfter2}, "after 2s", false},
	{"requeue and requeue-after are both kept", []kind{kAfter1, kNow}, "requeue after 1s", false},
	{"errors are aggregated in order", []kind{kErr1, kErr2}, "error: error1 | error2", false},
	{"an error keeps the requeue-after beside it", []kind{kAfter2, kErr1}, "after 2s; error: error1", false},
	{"a real error outranks exit", []kind{kExit, kErr1}, "error: error1", false},
	{"a real error outranks exit in either order", []kind{kErr1, kExit, kErr2}, "error: error1 | error2", false},
	{"exits join into an exit", []kind{kExit, kExit}, "exit", false},
	{"an exit keeps the requeue-after beside it", []kind{kExit, kAfter1}, "after 1s; exit", false},
	{"a panic is re-raised after the others ran", []kind{kPanic, kErr1, kNow}, "panic: boom", false},
	{"a panic outranks errors before it", []kind{kErr1, kExit, kPanic}, "panic: boom", false},
	{"a slow child is waited for", []kind{kSlow, kAfter1}, "after 1s", true},
	{"everything at once", []kind{kNow, kAfter2, kAfter1, kErr1, kExit, kNone}, "requeue after 1s; error: error1", false},
}

func TestJoinRules(t *testing.T) {
	for _, comb := range combinators[:3] {
		for _, row := range joinRows {
			t.Run(comb.name+": "+row.name, func(t *testing.T) {
				cs, as := children(t, row.kinds...)
				a := comb.make(as...)
				got, _ := outcomeAsync(t, a, row.block, cs)
				if got != row.want {
					t.Errorf("%s = %q, want %q", a.Description(), got, row.want)
				}
				for i, n := range runs(cs) {
					if n != 1 {
						t.Errorf("%s ran child %d (%s) %d times, want 1", a.Description(), i, cs[i].kind, n)
					}
				}
			})
		}
	}
}

func TestJoinErrorsMatchEveryChildError(t *testing.T) {
	for _, comb := range combinators[:3] {
		_, as := children(t, kErr1, kExit, kErr2)
		a := comb.make(as...)
		_, err := a.Run(t.Context())
		for _, want := range []error{errOne, errTwo} {
			if !errors.Is(err, want) {
				t.Errorf("%s = %v, want it to match %v", a.Description(), err, want)
			}
		}
		if IsExit(err) {
			t.Errorf("IsExit(%s) = true, want false: a real error outranks exit", a.Description())
		}
	}
}

func TestJoinPanicReportsTheActionThatPanicked(t *testing.T) {
	for _, comb := range combinators[:3] {
		_, as := children(t, kNone, kPanic)
		a := comb.make(Join(as...), newChild(t, kNone))
		func() {
			defer func() {
				p, ok := recover().(*PanicError)
				if !ok {
					t.Fatalf("%s panicked with %T, want *PanicError", a.Description(), p)
				}
				if p.Action != "panic" || p.Value != "boom" || len(p.Stack) == 0 {
					t.Errorf("%s panicked with {%q, %v, %d bytes of stack}, want {\"panic\", boom, a stack}",
						a.Description(), p.Action, p.Value, len(p.Stack))
				}
			}()
			_, _ = a.Run(t.Context())
		}()
	}
}

func TestJoinOrderedRunsInOrder(t *testing.T) {
	var order []int
	var as []Action
	for i := range 5 {
		as = append(as, NewAction("step", func(ctx context.Context) (reconcile.Result, error) {
			order = append(order, i)
			return NoRequeue()
		}))
	}
	if _, err := JoinOrdered(as...).Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	if want := []int{0, 1, 2, 3, 4}; !slices.Equal(order, want) {
		t.Errorf("JoinOrdered ran %v, want %v", order, want)
	}
}

func TestParallelJoinRunsConcurrently(t *testing.T) {
	// Each child waits for the other to start: run one after the other
	// they would deadlock.
	a, b := make(chan struct{}), make(chan struct{})
	ping := func(mine, theirs chan struct{}) Action {
		return NewAction("ping", func(ctx context.Context) (reconcile.Result, error) {
			close(mine)
			select {
			case <-theirs:
				return NoRequeue()
			case <-ctx.Done():
				return RequeueIfError(ctx.Err())
			}
		})
	}
	ctx, cancel := context.WithTimeout(t.Context(), defaultTestTimeout)
	defer cancel()
	if _, err := ParallelJoin(ping(a, b), ping(b, a)).Run(ctx); err != nil {
		t.Errorf("ParallelJoin(ping, ping) = %v, want both to see each other", err)
	}
}

// TestJoinReportsEveryPanic checks that a join re-raises one *PanicError
// holding every panic of its actions, in argument order, after running all
// of them; a Shared action referenced twice panics once.
func TestJoinReportsEveryPanic(t *testing.T) {
	for _, comb := range combinators[:3] {
		rows := []struct {
			name  string
			build func(t *testing.T) (Action, []*child)
			want  []string // action: value, in order
		}{
			{"two panics", func(t *testing.T) (Action, []*child) {
				cs, as := children(t, kPanic, kNone, kBang)
				return comb.make(as...), cs
			}, []string{"panic: boom", "bang: bang"}},
			{"panics of a nested join are kept", func(t *testing.T) (Action, []*child) {
				cs, as := children(t, kBang, kPanic, kErr1, kBang)
				return comb.make(ParallelJoin(as[0], as[1]), as[2], Join(as[3])), cs
			}, []string{"bang: bang", "panic: boom", "bang: bang"}},
			{"a shared panic is reported once", func(t *testing.T) (Action, []*child) {
				cs, as := children(t, kPanic)
				s := Shared(as[0])
				return comb.make(s, s), cs
			}, []string{"panic: boom"}},
			{"a shared panic inside a nested join is reported once", func(t *testing.T) (Action, []*child) {
				cs, as := children(t, kPanic, kBang)
				s := Shared(as[0])
				return comb.make(s, ParallelJoin(s, as[1])), cs
			}, []string{"panic: boom", "bang: bang"}},
		}
		for _, row := range rows {
			t.Run(comb.name+": "+row.name, func(t *testing.T) {
				a, cs := row.build(t)
				var p *PanicError
				func() {
					defer func() { p, _ = recover().(*PanicError) }()
					_, _ = a.Run(WithSharedScope(t.Context()))
				}()
				if p == nil {
					t.Fatalf("%s did not panic with a *PanicError", a.Description())
				}
				var got []string
				for _, q := range append([]*PanicError{p}, p.Also...) {
					got = append(got, fmt.Sprintf("%s: %v", q.Action, q.Value))
					if len(q.Stack) == 0 {
						t.Errorf("the panic of %s has no stack", q.Action)
					}
				}
				if !slices.Equal(got, row.want) {
					t.Errorf("%s panicked with %q, want %q", a.Description(), got, row.want)
				}
				for _, w := range row.want {
					if v := strings.SplitN(w, ": ", 2)[1]; !strings.Contains(p.Error(), "panicked: "+v) {
						t.Errorf("the panic's message does not name %q:\n%s", v, p.Error())
					}
				}
				for i, c := range cs {
					if n := c.runs.Load(); n != 1 {
						t.Errorf("%s ran child %d %d times, want 1", a.Description(), i, n)
					}
				}
			})
		}
	}
}

func TestPanicErrorMatchesEveryErrorValue(t *testing.T) {
	a := ParallelJoin(
		NewAction("one", func(context.Context) (reconcile.Result, error) { panic(errOne) }),
		NewAction("two", func(context.Context) (reconcile.Result, error) { panic(errTwo) }),
	)
	defer func() {
		err, _ := recover().(error)
		if !errors.Is(err, errOne) || !errors.Is(err, errTwo) {
			t.Errorf("%s panicked with %v, want it to match error1 and error2", a.Description(), err)
		}
	}()
	_, _ = a.Run(t.Context())
}
