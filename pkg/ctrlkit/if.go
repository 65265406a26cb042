package ctrlkit

import (
	"context"
	"strconv"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// If runs action only when cond is true; otherwise it is NoRequeue. cond is
// evaluated when If is called, while the workflow is built; use IfFunc to
// decide when the workflow reaches it.
func If(cond bool, action Action) Action {
	mustActions("If", []Action{action})
	return &ifAction{cond: func(context.Context) bool { return cond }, fixed: &cond, child: action}
}

// IfFunc runs action only when cond(ctx) returns true at the moment the
// workflow reaches it, for example after an earlier action in a Sequential
// has changed what cond looks at.
func IfFunc(cond func(ctx context.Context) bool, action Action) Action {
	mustActions("IfFunc", []Action{action})
	if cond == nil {
		panic("ctrlkit.IfFunc: cond is nil")
	}
	return &ifAction{cond: cond, child: action}
}

type ifAction struct {
	cond  func(context.Context) bool
	fixed *bool // the constant condition of If, for the description
	child Action
}

var _ Composite = (*ifAction)(nil)

func (a *ifAction) Description() string {
	switch {
	case a.fixed == nil:
		return "IfFunc(" + a.child.Description() + ")"
	case *a.fixed:
		return "If(true, " + a.child.Description() + ")"
	default:
		return "If(false, " + a.child.Description() + ")"
	}
}

func (a *ifAction) Children() []Action { return []Action{a.child} }

func (a *ifAction) WithChildren(children []Action) Action {
	mustActions("If", children)
	return &ifAction{cond: a.cond, fixed: a.fixed, child: children[0]}
}

func (a *ifAction) Run(ctx context.Context) (reconcile.Result, error) {
	if !a.cond(ctx) {
		return NoRequeue()
	}
	return a.child.Run(ctx)
}

// Name implements the short name used by NameOf.
func (a *ifAction) Name() string {
	if a.fixed == nil {
		return "IfFunc"
	}
	return "If"
}

// IfElse runs then when cond is true and otherwise the other action; its
// outcome is the branch's. Like If, cond is evaluated while the workflow is
// built.
func IfElse(cond bool, then, otherwise Action) Action {
	mustActions("IfElse", []Action{then, otherwise})
	return &ifElseAction{cond: cond, then: then, els: otherwise}
}

type ifElseAction struct {
	cond      bool
	then, els Action
}

var _ Composite = (*ifElseAction)(nil)

// Name implements the short name used by NameOf.
func (a *ifElseAction) Name() string { return "IfElse" }

func (a *ifElseAction) Description() string {
	return "IfElse(" + strconv.FormatBool(a.cond) + ", " + a.then.Description() + ", " + a.els.Description() + ")"
}

func (a *ifElseAction) Children() []Action { return []Action{a.then, a.els} }

func (a *ifElseAction) WithChildren(children []Action) Action {
	mustActions("IfElse", children)
	return &ifElseAction{cond: a.cond, then: children[0], els: children[1]}
}

func (a *ifElseAction) Run(ctx context.Context) (reconcile.Result, error) {
	if a.cond {
		return a.then.Run(ctx)
	}
	return a.els.Run(ctx)
}

// branch is the action IfElse runs.
func (a *ifElseAction) branch() Action {
	if a.cond {
		return a.then
	}
	return a.els
}

// ExitIf returns an action that exits the workflow (ErrExit, see Exit) when
// cond is true and is NoRequeue otherwise. In a Sequential it ends the
// sequence early without a failure: Sequential(ExitIf(deleting),
// mgr.Sync()). cond is evaluated while the workflow is built.
func ExitIf(cond bool) Action {
	return exitIfAction(cond)
}

type exitIfAction bool

// Name implements the short name used by NameOf.
func (a exitIfAction) Name() string { return "ExitIf" }

func (a exitIfAction) Description() string { return "ExitIf(" + strconv.FormatBool(bool(a)) + ")" }

func (a exitIfAction) Run(context.Context) (reconcile.Result, error) {
	if a {
		return Exit()
	}
	return NoRequeue()
}
