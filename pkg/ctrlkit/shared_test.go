package ctrlkit

import (
	"testing"
)

func TestSharedRunsOncePerReconcile(t *testing.T) {
	for _, k := range allKinds {
		for _, comb := range combinators[:4] {
			t.Run(comb.name+" of a shared "+string(k), func(t *testing.T) {
				c := newChild(t, k)
				s := Shared(c)
				a := comb.make(s, s, Join(s))
				got, _ := outcome(WithSharedScope(t.Context()), a)
				want := single[k]
				if got != want {
					t.Errorf("%s = %q, want %q", a.Description(), got, want)
				}
				if n := c.runs.Load(); n != 1 {
					t.Errorf("%s ran the shared action %d times, want 1", a.Description(), n)
				}
			})
		}
	}
}

func TestSharedScopes(t *testing.T) {
	c := newChild(t, kAfter1)
	a := Join(Shared(c), Shared(c)) // two Shared values: two actions
	s := Shared(c)
	b := Join(s, s)

	for range 2 {
		_, _ = b.Run(WithSharedScope(t.Context()))
	}
	if n := c.runs.Load(); n != 2 {
		t.Errorf("%s in two scopes ran %d times, want once per scope", b.Description(), n)
	}

	c.runs.Store(0)
	_, _ = a.Run(WithSharedScope(t.Context()))
	if n := c.runs.Load(); n != 2 {
		t.Errorf("%s ran %d times, want 2: each Shared value is its own action", a.Description(), n)
	}

	c.runs.Store(0)
	for range 2 {
		_, _ = b.Run(t.Context())
	}
	if n := c.runs.Load(); n != 1 {
		t.Errorf("%s twice without a scope ran %d times, want 1: the value remembers its first run", b.Description(), n)
	}
}

func TestSharedConcurrentReferencesWait(t *testing.T) {
	cs, as := children(t, kSlow)
	s := Shared(as[0])
	a := ParallelJoin(s, s, s)
	got, _ := outcomeAsync(t, a, true, cs)
	if got != "noRequeue" || cs[0].runs.Load() != 1 {
		t.Errorf("%s = %q after %d runs, want noRequeue after 1", a.Description(), got, cs[0].runs.Load())
	}
}
