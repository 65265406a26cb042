package runner

import (
	"context"
	"fmt"
)

// Lane lets one action at a time run across the flows that share it: a
// node's node jobs change the same machine (an upgrade re-execs the agent;
// a pre-pull cut short by it would fail), so their actions take turns. A
// flow holds the lane only while one of its actions runs, and an action
// that waits for an operator (Step.Wait, e.g. Confirm for up to a day)
// gives it up: the node's other node jobs go on meanwhile.
type Lane struct{ slot chan struct{} }

// NewLane returns a free lane.
func NewLane() *Lane { return &Lane{slot: make(chan struct{}, 1)} }

func (l *Lane) acquire(ctx context.Context) error {
	if l == nil {
		return nil
	}
	select {
	case l.slot <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for the node-job lane: %w", context.Cause(ctx))
	}
}

func (l *Lane) release() {
	if l != nil {
		<-l.slot
	}
}
