// The action flows of node jobs (KubeEdge's Flow: next on success, next on
// failure). The agent runs them and the manager reads them.

package nodejobwire

// Action names, as they appear in NodeTaskSlice action records.
const (
	Check = "Check"
	// Confirm waits for an operator's `drover confirm` (the seed's Confirm
	// → WaitingConfirmation): reported Running while it waits, then ended
	// with who confirmed.
	Confirm = "Confirm"
	// WaitingConfirmation is what agents before Confirm reported while
	// they waited; hubs still accept it.
	WaitingConfirmation = "WaitingConfirmation"
	BackUp              = "BackUp"
	Upgrade             = "Upgrade"
	RollBack            = "RollBack"
	Pull                = "Pull"

	// Dispatch and Agent are written by a hub, never by an agent: the
	// hub could not send the work (Dispatch), or the agent ended the item
	// without a flow's report (Agent).
	Dispatch = "Dispatch"
	Agent    = "Agent"
)

// AgentActions returns whether an agent may report action name for a work
// item of type typ: the actions of its flow. A report naming anything else
// is refused, never written into a node's action flow.
func AgentActions(typ, name string) bool {
	switch typ {
	case TypeUpgrade:
		switch name {
		case Check, Confirm, WaitingConfirmation, BackUp, Upgrade, RollBack:
			return true
		}
	case TypePrePull:
		return name == Check || name == Pull
	}
	return false
}

// Waits reports whether action name, while it runs, waits for an operator
// and not for the node: no timeout applies.
func Waits(name string) bool { return name == Confirm || name == WaitingConfirmation }

// Action is one step of a node's flow, with where to go next.
type Action struct {
	Name string
	// OnSuccess and OnFailure are the next actions; nil ends the flow.
	OnSuccess, OnFailure *Action
	// FailsTask marks an action whose success still ends the task in
	// Failure: a RollBack restores the old version, but the upgrade failed.
	FailsTask bool
}

// Next returns the action after a, given how a ended.
func (a *Action) Next(success bool) *Action {
	if success {
		return a.OnSuccess
	}
	return a.OnFailure
}

// Final reports whether nothing follows a, whatever its outcome.
func (a *Action) Final() bool { return a.OnSuccess == nil && a.OnFailure == nil }

// Flow is a tree of actions from First.
type Flow struct {
	First *Action
}

// Find returns the action named name, or nil.
func (f *Flow) Find(name string) *Action {
	seen := map[*Action]bool{}
	var walk func(a *Action) *Action
	walk = func(a *Action) *Action {
		if a == nil || seen[a] {
			return nil
		}
		seen[a] = true
		if a.Name == name {
			return a
		}
		if r := walk(a.OnSuccess); r != nil {
			return r
		}
		return walk(a.OnFailure)
	}
	return walk(f.First)
}

// UpgradeFlow is Check → [Confirm] → BackUp → Upgrade, and RollBack when
// Upgrade fails. A failed Check, confirmation or BackUp ends the flow with
// nothing changed on the node.
func UpgradeFlow(requireConfirmation bool) *Flow {
	rollback := &Action{Name: RollBack, FailsTask: true}
	upgrade := &Action{Name: Upgrade, OnFailure: rollback}
	backup := &Action{Name: BackUp, OnSuccess: upgrade}
	next := backup
	if requireConfirmation {
		next = &Action{Name: Confirm, OnSuccess: backup}
	}
	return &Flow{First: &Action{Name: Check, OnSuccess: next}}
}

// PrePullFlow is Check → Pull.
func PrePullFlow() *Flow {
	return &Flow{First: &Action{Name: Check, OnSuccess: &Action{Name: Pull}}}
}

// Result is where a node task is once an action ended.
type Result int

const (
	// Running: the flow goes on.
	Running Result = iota
	// Succeeded: the flow ended well.
	Succeeded
	// Failed: the flow ended badly (a failed action, or a RollBack).
	Failed
)

// After is the task's result once action a ended with success.
func After(a *Action, success bool) Result {
	if a.Next(success) != nil {
		return Running
	}
	if success && !a.FailsTask {
		return Succeeded
	}
	return Failed
}
