package taskctl

import (
	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	"github.com/drover-fleet/drover/internal/scheduler"
)

// instances are the multi-task group instances the scheduling loop sees:
// the tasks of one instance are placed as one unit on one node, which
// holds the instance's reservation (scheduler.Reservation) for as long as
// any task of it is not final, including the tasks still gated behind its
// inits, so that the room the mains need is not taken while the inits run.
type instances map[string]*instance

type instance struct {
	// node is where the instance runs, once a task of it was placed.
	node string
	// live: some task of it is not final (or is being deleted while its
	// process may still run).
	live    bool
	members []scheduler.Member
	tasks   []scheduler.Task
	group   string
	// placed: the reservation is held on node in this loop's cluster.
	placed bool
}

// instanceOf is t's instance key, "" if t is a single task.
func instanceOf(t *batchv1.Task) string {
	v := t.Labels[batchv1.LabelInstance]
	if v == "" {
		return ""
	}
	return t.Namespace + "/" + v
}

// add records task t (read as st) of instance key; assumedNode is where
// this loop's assume cache says it was placed ("" if nowhere).
func (is instances) add(key string, t *batchv1.Task, st scheduler.Task, assumedNode string) {
	in := is[key]
	if in == nil {
		in = &instance{group: st.Group}
		is[key] = in
	}
	in.members = append(in.members, scheduler.Member{
		Lifecycle: batchv1.TaskLifecycle(t.Labels[batchv1.LabelLifecycle]), Resources: t.Spec.Resources})
	in.tasks = append(in.tasks, st)
	state := t.Status.State
	if !state.Final() || t.DeletionTimestamp != nil && state.Holds() {
		in.live = true
	}
	// Where the instance is: a task holding a node says so; a finished
	// one (an init that completed) says so when none holds.
	switch {
	case assumedNode != "":
		in.node = assumedNode
	case state.Holds() && t.Status.NodeName != "":
		in.node = t.Status.NodeName
	case state.Final() && in.node == "" && t.Status.NodeName != "":
		in.node = t.Status.NodeName
	}
}

// hold holds every live placed instance's reservation in cluster.
func (is instances) hold(cluster *scheduler.Cluster) {
	for key, in := range is {
		if in.live && in.node != "" {
			cluster.Hold(in.reservation(key), in.node)
			in.placed = true
		}
	}
}

// reservation is the instance as one scheduler task holding its room.
func (in *instance) reservation(key string) scheduler.Task {
	return scheduler.Task{Key: key, Group: in.group, Resources: scheduler.Reservation(in.members)}
}

// unitTask is how due task st of instance key is placed: on the
// instance's node with nothing more to hold, or, for the instance's first
// placement, with the instance's reservation where every task of it may
// run.
func (is instances) unitTask(key string, st scheduler.Task) scheduler.Task {
	in := is[key]
	if in.node != "" {
		st.NodeName, st.Resources, st.Group, st.Spread, st.MaxPerNode = in.node, nil, "", nil, 0
		return st
	}
	st.Resources = scheduler.Reservation(in.members)
	st.Unit = st.Unit[:0]
	for _, u := range in.tasks {
		if u.Key != st.Key {
			u.Access = st.Access
			st.Unit = append(st.Unit, u)
		}
	}
	return st
}

// placed records that the instance of key now runs on node (its first
// task was placed there, holding its reservation).
func (is instances) placed(key, node string) {
	if in := is[key]; in != nil && in.node == "" {
		in.node, in.placed = node, true
	}
}
