// Package ctrlkit composes reconcile logic from small actions, as the
// CtrlKit RFC describes: an Action is one step with one responsibility, and
// combinators (Join, ParallelJoin, JoinOrdered, Sequential, Timeout, If,
// IfElse, ExitIf, Parallel, Retry, Shared) build a workflow out of steps. A
// workflow is itself an Action, run with one call at the end of Reconcile:
//
//	return ctrlkit.Reconcile(ctx, ctrlkit.Join(
//		mgr.SyncConfigMap(),
//		mgr.SyncPods(),
//		ctrlkit.If(!suspended, mgr.RunNextJob()),
//	))
//
// The generator in pkg/ctrlkit/gen writes the typed state loaders and the
// action plumbing for a controller from a small DSL; see docs/ctrlkit.md.
//
// # Outcomes
//
// An action returns a reconcile.Result and an error. The result helpers
// name the outcomes:
//
//	RequeueImmediately()        Result{Requeue: true}        interrupts; retried now (rate-limited)
//	RequeueAfter(d)             Result{RequeueAfter: d}      interrupts; retried after d
//	RequeueIfError(err)         err                          interrupts if err != nil; retried with backoff
//	RequeueIfErrorAndWrap(m, err)  "m: err"                  as above, with context
//	NoRequeue()                 zero                         no effect
//	Exit()                      ErrExit                      interrupts; not a failure
//	IgnoreExit(res, err)        exit → (res, nil)            at the top of Reconcile; a real error zeroes res
//	Reconcile(ctx, wf)          IgnoreExit(wf.Run(ctx))      plus the shared and Parallel scopes
//
// An exit is ErrExit, possibly wrapped, or an aggregate made only of exits
// (IsExit). A timeout (ErrTimeout) is a real error.
//
// # Join rules
//
// Join, JoinOrdered and ParallelJoin run every action and join the outcomes:
//
//	Requeue                 OR-ed: any requeue wins
//	RequeueAfter            the shortest non-zero one wins, else zero
//	errors                  nil join err = err; err1 join err2 = errors.Join(err1, err2), in argument order;
//	                        the very same error value returned twice (a Shared action) is kept once
//	exit                    a real error outranks exit: exits are dropped when any real error is present;
//	                        exits alone join into an exit
//	result next to error    kept (IgnoreExit keeps it after an exit and zeroes it beside a real error)
//	panic                   recovered; the other actions still run; then the first panic (in argument
//	                        order) is re-raised as a *PanicError carrying the value and the original stack,
//	                        with every other panic of the join in its Also
//
// So a joined workflow comes back no later than any part of it asked for,
// and never hides a failure. Join runs the actions in order but does not
// promise to; JoinOrdered does. ParallelJoin runs each in its own goroutine
// and waits for all of them.
//
// # Sequential rules
//
// Sequential runs actions one by one and stops at the first interruption
// (Interrupts): an error, an exit, Requeue, or RequeueAfter > 0. That
// action's outcome is the sequence's; the rest do not run. A panic
// propagates unchanged. With no interruption the outcome is NoRequeue.
//
// # Other combinators
//
//	Timeout(d, a)    runs a with a context ending after d. When d passes, a *TimeoutError (ErrTimeout and
//	                 context.DeadlineExceeded) is returned at once, even if a ignores its context; a is left
//	                 to finish in its goroutine and its late outcome is dropped. A panic in time is re-raised.
//	If(cond, a)      a if cond, else NoRequeue; IfFunc(f, a) asks f when the workflow reaches it.
//	IfElse(c, a, b)  a if c, else b.
//	ExitIf(cond)     exits (ErrExit) if cond, else NoRequeue: ends a Sequential early, not a failure.
//	Parallel(a)      starts a and returns NoRequeue at once; a's outcome is ignored (errors logged). a runs
//	                 with ctx's values under the context Reconcile was given, and Reconcile waits for it
//	                 before returning (outside Reconcile, a runs in place).
//	Retry(opts, a)   re-runs a while it fails with a retryable error, with exponential backoff through an
//	                 injectable Sleep. Requeues, exits, terminal errors and successes are returned at once.
//	Shared(a)        runs a at most once per WithSharedScope context (or per Shared value without a scope);
//	                 every reference gets the same outcome.
//	Flatten(a)       splices directly nested joins of the same kind and unwraps joins of one action.
//	Optimize(a)      the RFC's optimizer: Flatten, plus no-ops removed, fixed conditions resolved, nested
//	                 timeouts reduced to the tightest; same outcome, smaller tree.
//
// Constructors refuse at once what could only fail inside a reconcile: a nil
// action (typed nils too), a non-positive Timeout, negative RetryOptions.
//
// # Tracing
//
// Instrument wraps every action of a workflow so that an Observer sees its
// start and its end (Report: name, description, start, duration, outcome,
// result, error, panic) without changing the actions. LogObserver logs with
// logr; package ctrlkitotel records OpenTelemetry spans. Observers(...)
// combines several. Hooks (BeforeAction, AfterAction) are the RFC's
// lifecycle hooks as an Observer; the generated manager takes them to see
// each of its actions.
//
// # What it does not do
//
// ctrlkit does not read or write objects (the generated state loaders do
// that with controller-runtime's client), keeps no state between reconciles
// and starts no goroutines except ParallelJoin's, Timeout's and Parallel's,
// which end with their action (Parallel's before Reconcile returns).
package ctrlkit
