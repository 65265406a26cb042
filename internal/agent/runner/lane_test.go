package runner

import (
	"context"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
)

// Two flows on one lane: an action that runs keeps the other flow out; an
// action that waits for an operator (Step.Wait) lets it through.
func TestALaneRunsOneActionAtATimeButNotAWait(t *testing.T) {
	ctx := testCtx(t)
	m := newMachine(t)
	lane := NewLane()
	newOn := func() *Runner {
		r, err := New(Options{Store: m.db, Lane: lane})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	one := &nodejobwire.Flow{First: &nodejobwire.Action{Name: "Only"}}
	noReports := func(context.Context, Report) error { return nil }

	for _, tc := range []struct {
		name   string
		waits  bool
		passes bool
	}{
		{"a running action holds the lane", false, false},
		{"a waiting action gives it up", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			started, release := make(chan struct{}), make(chan struct{})
			first := Actions{"Only": ActionFunc(func(ctx context.Context, s *Step) (Outcome, error) {
				if tc.waits {
					if err := s.Wait(ctx, "waiting for confirmation"); err != nil {
						return Outcome{}, err
					}
				}
				close(started)
				<-release
				return OK("done", nil), nil
			})}
			other := make(chan End, 1)
			firstDone := make(chan End, 1)
			go func() {
				end, _ := newOn().Run(ctx, tc.name+"-first", one, first, noReports)
				firstDone <- end
			}()
			<-started
			go func() {
				end, _ := newOn().Run(ctx, tc.name+"-other", one, Actions{"Only": ActionFunc(func(context.Context, *Step) (Outcome, error) {
					return OK("done", nil), nil
				})}, noReports)
				other <- end
			}()
			if tc.passes {
				select {
				case end := <-other:
					if end.Result != nodejobwire.Succeeded {
						t.Errorf("other flow = %+v", end)
					}
				case <-time.After(testTimeout):
					t.Fatal("the other flow waited for an action that waits for an operator")
				}
				close(release)
				<-firstDone
				return
			}
			select {
			case <-other:
				t.Fatal("the other flow ran while an action held the lane")
			case <-time.After(200 * time.Millisecond):
			}
			close(release)
			<-firstDone
			if end := <-other; end.Result != nodejobwire.Succeeded {
				t.Errorf("other flow after the lane was free = %+v", end)
			}
		})
	}
}
