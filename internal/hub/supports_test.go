package hub

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// supportsProbe is a WorkSource that records what its feature's link says
// of the node's feature while the node's snapshot is built.
type supportsProbe struct {
	f       *testFeature
	feature string

	mu   sync.Mutex
	seen []bool
}

func (p *supportsProbe) WorkFor(_ context.Context, node string) ([]*agentv1.WorkItem, error) {
	ok := p.f.attached().Supports(node, p.feature)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen = append(p.seen, ok)
	return nil, nil
}

func (p *supportsProbe) last() (bool, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.seen) == 0 {
		return false, 0
	}
	return p.seen[len(p.seen)-1], len(p.seen)
}

// TestLinkSupports: a feature's link tells which protocol features the
// node's current stream named, already while that stream's snapshot is
// built, and nothing for a node without a stream.
func TestLinkSupports(t *testing.T) {
	f := newFixture(t, "hub-supports")
	feat := &testFeature{name: "probe", prefix: "probe-"}
	probe := &supportsProbe{f: feat, feature: "task-run-as"}
	feat.works = probe
	h := f.startHub(Options{Name: "hub-supports", Features: []Feature{feat}})
	l := feat.attached()
	const node = "supports-node"
	f.registerRaw(h, node)
	if l.Supports(node, "task-run-as") {
		t.Fatal("Supports is true for a node without a stream")
	}

	// serve opens a stream naming features and returns once its snapshot
	// was sent; stop ends it.
	serve := func(features []string) (stop func()) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		snap := make(chan struct{})
		var once sync.Once
		done := make(chan error, 1)
		go func() {
			done <- h.ServeSession(ctx, Peer{Node: node}, &agentv1.GetMessageRequest{Features: features}, func(env *agentv1.Envelope) error {
				if env.GetKind() == agentv1.Kind_KIND_SNAPSHOT {
					once.Do(func() { close(snap) })
				}
				return nil
			})
		}()
		select {
		case <-snap:
		case err := <-done:
			cancel()
			t.Fatalf("session ended before its snapshot: %v", err)
		case <-time.After(waitTimeout):
			cancel()
			t.Fatalf("no snapshot within %s", waitTimeout)
		}
		return func() {
			cancel()
			// ServeSession drops the stream before it returns.
			<-done
		}
	}

	stop := serve([]string{"something-else", "task-run-as"})
	if got, n := probe.last(); n != 1 || !got {
		t.Errorf("Supports during the snapshot of a stream naming the feature = %v (%d snapshots), want true", got, n)
	}
	if !l.Supports(node, "task-run-as") {
		t.Error("Supports = false for a feature the stream named")
	}
	if l.Supports(node, "task-other") || l.Supports("other-node", "task-run-as") {
		t.Error("Supports = true for a feature the stream did not name, or for another node")
	}
	stop()
	if l.Supports(node, "task-run-as") {
		t.Error("Supports = true after the stream ended")
	}

	// The same node back with an older agent: the answer is the new
	// stream's, from its first snapshot on.
	stop = serve(nil)
	defer stop()
	if got, n := probe.last(); n != 2 || got {
		t.Errorf("Supports during the snapshot of a stream naming nothing = %v (%d snapshots), want false", got, n)
	}
	if l.Supports(node, "task-run-as") {
		t.Error("Supports = true for a stream that named nothing")
	}
}
