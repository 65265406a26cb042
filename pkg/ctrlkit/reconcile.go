package ctrlkit

import (
	"context"
	"sync"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Reconcile runs workflow as one reconcile and returns what
// controller-runtime should get. Call it at the end of a Reconcile method
// (the generated reconciler does):
//
//	return ctrlkit.Reconcile(ctx, ctrlkit.Join(mgr.SyncConfig(), mgr.SyncPods()))
//
// Around the workflow it
//
//   - opens a shared scope (WithSharedScope) unless ctx already has one, so
//     that every Shared action runs once;
//   - opens the scope Parallel runs its actions in, and returns only after
//     every one of them has finished (see Parallel);
//   - ignores an exit (IgnoreExit) and never returns a requeue next to an
//     error: the error wins and the result is zeroed, because
//     controller-runtime would ignore the result and log a warning;
//   - re-raises, after that wait, a panic of the workflow or of a Parallel
//     action as a *PanicError carrying all of them, for controller-runtime's
//     panic recovery.
func Reconcile(ctx context.Context, workflow Action) (res reconcile.Result, err error) {
	mustActions("Reconcile", []Action{workflow})
	if _, ok := ctx.Value(sharedScopeKey{}).(*sharedScope); !ok {
		ctx = WithSharedScope(ctx)
	}
	s := &parallelScope{ctx: ctx}
	ctx = context.WithValue(ctx, parallelScopeKey{}, s)
	finished := false
	defer func() {
		var v any
		if !finished {
			v = recover()
		}
		// Wait even when the workflow panicked: nothing Parallel
		// started may outlive the reconcile.
		bg := s.close()
		switch {
		case v != nil && bg == nil:
			panic(v)
		case v != nil:
			panic(joinPanics([]*PanicError{asPanicError(workflow, v), bg}))
		case bg != nil:
			panic(bg)
		}
	}()
	res, err = workflow.Run(ctx)
	finished = true
	return IgnoreExit(res, err)
}

// Parallel starts action and returns NoRequeue at once, without waiting for
// it: the workflow goes on while action runs in its own goroutine, and
// action's outcome is ignored (an error is logged to the logger in ctx; an
// exit or a requeue is dropped). Use it for best-effort side work that must
// not hold up or interrupt the workflow: emitting an event, warming a cache.
//
// The action runs under the reconcile's context: with ctx's values (logger,
// trace span, shared scope) and cancelled when the context Reconcile was
// given ends, not when the combinator around Parallel returns (a Timeout's
// context ends as soon as it returns). Reconcile returns only after every
// action Parallel started in it has finished: this is the point where the
// spawned work ends, so that no goroutine outlives the reconcile, the next
// reconcile of the same object never overlaps it (controller-runtime's
// promise of one reconcile per object at a time holds), and a panic in it
// reaches controller-runtime's recovery through Reconcile. Wrap action in
// Timeout to bound how long it may hold the reconcile.
//
// Run outside Reconcile (no scope in ctx), Parallel runs action in place
// and waits for it, ignoring its outcome: the same work, only sooner.
func Parallel(action Action) Action {
	mustActions("Parallel", []Action{action})
	return &parallelAction{child: action}
}

type parallelAction struct {
	child Action
}

var _ Composite = (*parallelAction)(nil)

// Name implements the short name used by NameOf.
func (a *parallelAction) Name() string { return "Parallel" }

func (a *parallelAction) Description() string { return "Parallel(" + a.child.Description() + ")" }

func (a *parallelAction) Children() []Action { return []Action{a.child} }

func (a *parallelAction) WithChildren(children []Action) Action {
	mustActions("Parallel", children)
	return &parallelAction{child: children[0]}
}

func (a *parallelAction) Run(ctx context.Context) (reconcile.Result, error) {
	s, _ := ctx.Value(parallelScopeKey{}).(*parallelScope)
	if s == nil || !s.start(ctx, a.child) {
		ignore(ctx, a.child, a.child.Run)
	}
	return NoRequeue()
}

// ignore runs fn and drops its outcome, logging a real error: a failure
// nobody waits for must still be seen somewhere.
func ignore(ctx context.Context, a Action, fn func(context.Context) (reconcile.Result, error)) {
	if _, err := fn(ctx); err != nil && !IsExit(err) {
		logr.FromContextOrDiscard(ctx).Error(err, "parallel action failed; its outcome is ignored", "action", NameOf(a))
	}
}

type parallelScopeKey struct{}

// parallelScope is one Reconcile's set of Parallel actions.
type parallelScope struct {
	// ctx is the context Reconcile was given: the actions stop with it.
	ctx context.Context
	wg  sync.WaitGroup

	mu     sync.Mutex // guards closed and panics
	closed bool
	panics []*PanicError
}

// start runs a in a goroutine of the scope, with the values of ctx and the
// lifetime of the scope's context. It returns false, and starts nothing,
// once the scope is closing: the caller then runs a in place.
func (s *parallelScope) start(ctx context.Context, a Action) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	actx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	stop := context.AfterFunc(s.ctx, func() { cancel(context.Cause(s.ctx)) })
	s.wg.Go(func() {
		defer cancel(nil)
		defer stop()
		var p *PanicError
		ignore(actx, a, func(ctx context.Context) (res reconcile.Result, err error) {
			res, err, p = runRecover(ctx, a)
			return res, err
		})
		if p != nil {
			s.mu.Lock()
			s.panics = append(s.panics, p)
			s.mu.Unlock()
		}
	})
	return true
}

// close waits for every action of the scope and returns their panics. It
// closes the scope first, so that nothing starts behind Wait's back: an
// action that starts another while we wait runs it in place, in its own
// goroutine, which Wait waits for.
func (s *parallelScope) close() *PanicError {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return joinPanics(s.panics)
}
