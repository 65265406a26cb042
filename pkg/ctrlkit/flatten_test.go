package ctrlkit

import (
	"testing"
)

func TestFlatten(t *testing.T) {
	a, b, c := newChild(t, kNone), newChild(t, kNow), newChild(t, kAfter1)
	rows := []struct {
		name string
		in   Action
		want string
	}{
		{"nested joins are spliced", Join(Join(a, b), c), "Join(noRequeue, requeue, requeueAfter 1s)"},
		{"deeply nested joins are spliced", Join(a, Join(b, Join(c))), "Join(noRequeue, requeue, requeueAfter 1s)"},
		{"nested sequences are spliced", Sequential(Sequential(a), Sequential(b, c)), "Sequential(noRequeue, requeue, requeueAfter 1s)"},
		{"nested parallel joins are spliced", ParallelJoin(a, ParallelJoin(b, c)), "ParallelJoin(noRequeue, requeue, requeueAfter 1s)"},
		{"joins of different kinds are kept", Join(ParallelJoin(a, b), Sequential(c)), "Join(ParallelJoin(noRequeue, requeue), requeueAfter 1s)"},
		{"joins under other combinators are flattened", If(true, Join(Join(a, b))), "If(true, Join(noRequeue, requeue))"},
		{"a join of one is its child", Join(a), "noRequeue"},
	}
	for _, row := range rows {
		if got := Flatten(row.in).Description(); got != row.want {
			t.Errorf("Flatten(%s) = %s, want %s", row.in.Description(), got, row.want)
		}
	}
}

func TestFlattenKeepsOutcomesAndSharing(t *testing.T) {
	c := newChild(t, kAfter1)
	s := Shared(c)
	in := Join(s, Join(Join(newChild(t, kErr1), s), newChild(t, kNow)))
	out := Flatten(in)
	want, _ := outcome(WithSharedScope(t.Context()), in)
	got, _ := outcome(WithSharedScope(t.Context()), out)
	if got != want {
		t.Errorf("Flatten(%s) = %q, want %q as before", in.Description(), got, want)
	}
	if n := c.runs.Load(); n != 2 {
		t.Errorf("the shared action ran %d times in two reconciles, want 2", n)
	}
}
