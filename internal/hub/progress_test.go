package hub

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/drover-fleet/drover/internal/agent"
	"github.com/drover-fleet/drover/internal/store"
	"github.com/drover-fleet/drover/internal/testkit"
)

// stepper reports two progress steps, then ends with a message; after a
// restart it resumes instead of being failed.
type stepper struct {
	mu      sync.Mutex
	resumed int
	hold    chan struct{} // closed to let a run end; nil = end at once
}

func (s *stepper) Run(context.Context, store.Work) (string, string) {
	return agent.PhaseFailed, "RunReporting must be used"
}

func (s *stepper) RunReporting(ctx context.Context, w store.Work, env agent.Env) (string, string, string) {
	for _, step := range []string{"Check", "Pull"} {
		if err := env.Report(ctx, step, `{"action":"`+step+`"}`); err != nil {
			return agent.PhaseFailed, err.Error(), ""
		}
	}
	if s.hold != nil {
		select {
		case <-s.hold:
		case <-ctx.Done():
			return agent.PhaseFailed, "stopped", ""
		}
	}
	return agent.PhaseSucceeded, "Pull", `{"action":"Pull","success":true}`
}

func (s *stepper) Resume(ctx context.Context, w store.Work, env agent.Env) (string, string, string) {
	s.mu.Lock()
	s.resumed++
	s.mu.Unlock()
	if err := env.Connected(ctx); err != nil {
		return agent.PhaseFailed, err.Error(), ""
	}
	return agent.PhaseSucceeded, "resumed", `{"action":"Upgrade","success":true}`
}

// TestProgressReportsAndResume: a ReportingRunner's progress reaches the
// hub's sink in order before its end, with the end's message; an item
// Running when its agent stopped is given to the runner's Resume, which can
// wait for the stream, instead of being reported Failed.
func TestProgressReportsAndResume(t *testing.T) {
	f := newFixture(t, "hub-progress")
	snk := &sink{}
	ws := &works{} // as in production, what is dispatched is also in the node's snapshot
	h := f.startHub(Options{Name: "hub-progress", Features: feature(ws, snk)})
	st := &stepper{}
	const node = "progress-node"
	opts := f.agentOpts(node, h, nil)
	opts.Runners = map[string]agent.Runner{"step": st}
	a := f.startAgent(opts)
	waitConnected(t, h, node)

	ws.add(node, item("w-steps", "step", `{}`))
	if err := h.Dispatch(node, item("w-steps", "step", `{}`)); err != nil {
		t.Fatal(err)
	}
	got := snk.waitStatus(t, node, "w-steps", agent.PhaseSucceeded)
	var seq []string
	for _, s := range got {
		seq = append(seq, s.GetPhase()+":"+s.GetReason())
	}
	if len(got) != 3 || seq[0] != "Running:Check" || seq[1] != "Running:Pull" || got[2].GetMessage() != `{"action":"Pull","success":true}` {
		t.Fatalf("statuses = %v (last message %q); want Running:Check, Running:Pull, Succeeded with the final message", seq, got[len(got)-1].GetMessage())
	}

	// Stop the agent while an item runs, then start it again on the same state.
	st.hold = make(chan struct{})
	ws.add(node, item("w-held", "step", `{}`))
	if err := h.Dispatch(node, item("w-held", "step", `{}`)); err != nil {
		t.Fatal(err)
	}
	snk.waitStatus(t, node, "w-held", agent.PhaseRunning)
	a.stop(t)
	// The held run was interrupted by the stop and said so; a fresh
	// agent on a DB where the item is still Running must resume it. Put
	// it back to Running as a crash (kill -9 mid-run) would leave it.
	db, err := store.Open(context.Background(), opts.StateDir+"/agent.db", store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.SetWorkPhase(context.Background(), "w-held", agent.PhaseRunning, ""); err != nil {
		t.Fatal(err)
	}
	db.Close()
	opts.BootstrapToken = ""
	f.startAgent(opts)
	testkit.Eventually(t, waitTimeout, func() string {
		st.mu.Lock()
		defer st.mu.Unlock()
		if st.resumed != 1 {
			return fmt.Sprintf("Resume called %d times, want 1", st.resumed)
		}
		return ""
	})
	last := snk.waitStatus(t, node, "w-held", agent.PhaseSucceeded)
	if m := last[len(last)-1].GetMessage(); m != `{"action":"Upgrade","success":true}` {
		t.Errorf("resumed item's message = %q", m)
	}
}
