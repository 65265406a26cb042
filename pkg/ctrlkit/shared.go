package ctrlkit

import (
	"context"
	"sync"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Shared returns an action that runs action at most once per reconcile,
// however many times the workflow references it; every reference gets the
// same outcome. Use it for a step several branches depend on, such as
// loading an expensive state or ensuring a Secret exists.
//
// "Once per reconcile" means once per shared scope: call WithSharedScope on
// the reconcile's context (the generated reconciler does) and every Shared
// action run under that context runs once in it. Without a scope in ctx the
// Shared value itself remembers the outcome, which is once per reconcile
// only if the workflow is built afresh in every Reconcile, as the RFC's
// examples do.
//
// Concurrent references (from ParallelJoin) wait for the first run; a
// waiter whose ctx ends first returns ctx's error. A panic is remembered and
// re-raised, as a *PanicError, for every reference.
func Shared(action Action) Action {
	mustActions("Shared", []Action{action})
	return &sharedAction{child: action}
}

// WithSharedScope returns a context in which each Shared action runs at most
// once. Call it once at the top of Reconcile.
func WithSharedScope(ctx context.Context) context.Context {
	return context.WithValue(ctx, sharedScopeKey{}, &sharedScope{cells: map[*sharedAction]*sharedCell{}})
}

type sharedScopeKey struct{}

type sharedScope struct {
	mu    sync.Mutex // guards cells
	cells map[*sharedAction]*sharedCell
}

type sharedAction struct {
	child Action
	// own is the cell used when ctx carries no scope.
	own sharedCell
}

var _ Composite = (*sharedAction)(nil)

func (a *sharedAction) Name() string { return "Shared" }

func (a *sharedAction) Description() string { return "Shared(" + a.child.Description() + ")" }

func (a *sharedAction) Children() []Action { return []Action{a.child} }

func (a *sharedAction) WithChildren(children []Action) Action {
	mustActions("Shared", children)
	return &sharedAction{child: children[0]}
}

func (a *sharedAction) cell(ctx context.Context) *sharedCell {
	scope, ok := ctx.Value(sharedScopeKey{}).(*sharedScope)
	if !ok {
		return &a.own
	}
	scope.mu.Lock()
	defer scope.mu.Unlock()
	c, ok := scope.cells[a]
	if !ok {
		c = &sharedCell{}
		scope.cells[a] = c
	}
	return c
}

func (a *sharedAction) Run(ctx context.Context) (reconcile.Result, error) {
	return a.cell(ctx).run(ctx, a.child)
}

// sharedCell holds one run's outcome.
type sharedCell struct {
	mu      sync.Mutex // guards started and done
	started bool
	done    chan struct{} // closed when out is set
	out     childOutcome
}

func (c *sharedCell) run(ctx context.Context, a Action) (reconcile.Result, error) {
	c.mu.Lock()
	if !c.started {
		c.started = true
		c.done = make(chan struct{})
		c.mu.Unlock()
		var o childOutcome
		o.res, o.err, o.panic = runRecover(ctx, a)
		c.out = o
		close(c.done)
	} else {
		done := c.done
		c.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return reconcile.Result{}, context.Cause(ctx)
		}
	}
	if c.out.panic != nil {
		panic(c.out.panic)
	}
	return c.out.res, c.out.err
}
