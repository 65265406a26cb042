package hub

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// uids lists the work items of a Dispatch envelope, item then more.
func uids(env *agentv1.Envelope) []string {
	var out []string
	for _, it := range protocol.DispatchItems(env.GetDispatch()) {
		out = append(out, it.GetUid())
	}
	return out
}

// How the stream joins queued Dispatches (gather), and what the ack of a
// batch or of a snapshot after it settles, is tested in package
// internal/hub/session (testdata/batch.txt, TestBatchesKeepTheProtocol).

func dispatch(t *testing.T, h *Hub, node string, items ...*agentv1.WorkItem) {
	t.Helper()
	for _, it := range items {
		if err := h.Dispatch(node, it); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStreamBatchesOnlyForAgentsThatNameTheFeature runs ServeSession with a
// send that holds the stream while dispatches queue behind it: an agent
// that named FeatureDispatchBatch gets them in one envelope, one that did
// not (an older agent, which would drop Dispatch.more) gets one each.
func TestStreamBatchesOnlyForAgentsThatNameTheFeature(t *testing.T) {
	f := newFixture(t, "hub-dispatch-batch")
	h := f.startHub(Options{Name: "hub-dispatch-batch"})
	cases := []struct {
		name     string
		features []string
		want     []string // per envelope after the snapshot: its kind and items
	}{
		{"the agent names the feature", []string{"something-newer", protocol.FeatureDispatchBatch},
			[]string{"DISPATCH a b c", "CANCEL", "DISPATCH d"}},
		{"the agent does not", nil,
			[]string{"DISPATCH a", "DISPATCH b", "DISPATCH c", "CANCEL", "DISPATCH d"}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			node := fmt.Sprint("batch-node-", i)
			f.registerRaw(h, node)
			ctx, cancel := context.WithCancel(context.Background())
			sent := make(chan *agentv1.Envelope)
			gate := make(chan struct{})
			done := make(chan error, 1)
			go func() {
				done <- h.ServeSession(ctx, Peer{Node: node}, &agentv1.GetMessageRequest{Features: tc.features}, func(env *agentv1.Envelope) error {
					select {
					case sent <- env:
					case <-ctx.Done():
						return ctx.Err()
					}
					select {
					case <-gate:
						return nil
					case <-ctx.Done():
						return ctx.Err()
					}
				})
			}()
			t.Cleanup(func() { cancel(); <-done })
			recv := func() *agentv1.Envelope {
				t.Helper()
				select {
				case env := <-sent:
					return env
				case err := <-done:
					t.Fatalf("session ended: %v", err)
				case <-time.After(waitTimeout):
					t.Fatal("nothing sent")
				}
				return nil
			}
			if env := recv(); env.GetKind() != agentv1.Kind_KIND_NODE_CONFIGURATION {
				t.Fatalf("first envelope %v, want the node configuration", env.GetKind())
			}
			gate <- struct{}{}
			snap := recv()
			if snap.GetKind() != agentv1.Kind_KIND_SNAPSHOT {
				t.Fatalf("second envelope %v, want the snapshot", snap.GetKind())
			}
			// The stream is held in send: these queue behind the snapshot.
			dispatch(t, h.Hub, node, item("a", "noop", ""), item("b", "noop", ""), item("c", "noop", ""))
			if err := h.Cancel(node, "a"); err != nil {
				t.Fatal(err)
			}
			dispatch(t, h.Hub, node, item("d", "noop", ""))
			gate <- struct{}{}
			var got []string
			var envs []*agentv1.Envelope
			for len(got) < len(tc.want) {
				env := recv()
				gate <- struct{}{}
				desc := strings.TrimPrefix(env.GetKind().String(), "KIND_")
				if env.GetDispatch() != nil {
					desc += " " + strings.Join(uids(env), " ")
				}
				got = append(got, desc)
				envs = append(envs, env)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("sent %q, want %q", got, tc.want)
			}
			for j := 1; j < len(envs); j++ {
				if want := envs[j-1].GetRevision() + uint64(max(1, len(uids(envs[j-1])))); envs[j].GetRevision() != want {
					t.Errorf("envelope %d at revision %d, want %d", j, envs[j].GetRevision(), want)
				}
			}
			// The agent's acks of what was sent settle everything.
			for _, env := range append(envs, snap) {
				if _, err := h.HandleMessage(ctx, Peer{Node: node}, protocol.NewAck(node, env.GetId())); err != nil {
					t.Fatal(err)
				}
			}
			if n := h.Pending(node); n != 0 {
				t.Errorf("%d pending after every envelope sent was acked", n)
			}
		})
	}
}
