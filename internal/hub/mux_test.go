package hub

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

func TestMuxRoutes(t *testing.T) {
	var tasksWork, jobsWork works
	var tasks, jobs sink
	tasksWork.add("n1", &agentv1.WorkItem{Uid: "task-a-1", Type: "task-exec"})
	jobsWork.add("n1", &agentv1.WorkItem{Uid: "job-x", Type: "upgrade"})
	m := NewMux(
		Route{Name: "tasks", Owns: func(uid string) bool { return strings.HasPrefix(uid, "task-") }, Work: &tasksWork, Status: &tasks},
		Route{Name: "node jobs", Work: &jobsWork, Status: &jobs},
	)
	ctx := context.Background()
	items, err := m.WorkFor(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	var uids []string
	for _, it := range items {
		uids = append(uids, it.GetUid())
	}
	if !slices.Equal(uids, []string{"task-a-1", "job-x"}) {
		t.Errorf("WorkFor = %v, want both components' items", uids)
	}

	m.WorkStatus(ctx, "n1", &agentv1.WorkStatus{Uid: "task-a-1", Phase: "Running"})
	m.WorkStatus(ctx, "n1", &agentv1.WorkStatus{Uid: "job-x", Phase: "Succeeded"})
	if got := tasks.statuses("n1", "task-a-1"); len(got) != 1 || len(tasks.statuses("n1", "job-x")) != 0 {
		t.Errorf("tasks got %d of its own statuses and some of the node jobs'", len(got))
	}
	if got := jobs.statuses("n1", "job-x"); len(got) != 1 || len(jobs.statuses("n1", "task-a-1")) != 0 {
		t.Errorf("node jobs got %d of its own statuses and some of the tasks'", len(got))
	}

	m.NodeState(ctx, "n1", []*agentv1.WorkStatus{{Uid: "job-x"}, {Uid: "job-y"}})
	ts, js := tasks.nodeStates("n1"), jobs.nodeStates("n1")
	if len(ts) != 1 || len(ts[0].work) != 0 {
		t.Errorf("tasks got NodeStates %v, want one, empty (it replaces what tasks knew)", ts)
	}
	if len(js) != 1 || len(js[0].work) != 2 {
		t.Errorf("node jobs got NodeStates %v, want one with both items", js)
	}
}
