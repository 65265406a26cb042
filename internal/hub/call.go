package hub

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// calls are the Calls waiting for an agent's report, by node and uid.
type calls struct {
	mu      sync.Mutex
	waiting map[callKey][]*waiter
}

type callKey struct{ node, uid string }

// waiter is one Call. ch has room for the one report that ends it, so that
// offering never blocks a report's delivery.
type waiter struct {
	done func(*agentv1.WorkStatus) bool
	ch   chan *agentv1.WorkStatus
}

func (c *calls) add(k callKey, w *waiter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.waiting == nil {
		c.waiting = map[callKey][]*waiter{}
	}
	c.waiting[k] = append(c.waiting[k], w)
}

// remove forgets w; it reports whether w was still waiting.
func (c *calls) remove(k callKey, w *waiter) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	ws := c.waiting[k]
	i := slices.Index(ws, w)
	if i < 0 {
		return false
	}
	if ws = slices.Delete(ws, i, i+1); len(ws) == 0 {
		delete(c.waiting, k)
	} else {
		c.waiting[k] = ws
	}
	return true
}

// offer ends the Calls waiting for st's uid from node that accept it. done
// runs outside the lock: it is the caller's code.
func (c *calls) offer(node string, st *agentv1.WorkStatus) {
	k := callKey{node, st.GetUid()}
	c.mu.Lock()
	ws := slices.Clone(c.waiting[k])
	c.mu.Unlock()
	for _, w := range ws {
		if w.done != nil && !w.done(st) {
			continue
		}
		// Whoever removes w ends it: this report, or the Call giving up.
		if c.remove(k, w) {
			w.ch <- proto.Clone(st).(*agentv1.WorkStatus)
		}
	}
}

// Call dispatches item to node and waits for the first report of its uid
// from that node that done accepts (nil accepts any). It is for requests
// an agent answers within milliseconds (a session open), where waiting for
// the feature's own bookkeeping would be too slow. It fails at once with
// ErrNotConnected when node has no stream on this hub, and when ctx ends
// (give it a deadline). The report goes to its feature as every report
// does, before Call returns a copy of it. A node that disconnects meanwhile
// ends the Call only at ctx's end: the item may still run after a
// reconnect, if its feature's WorkFor lists it.
func (h *Hub) Call(ctx context.Context, node string, item *agentv1.WorkItem, done func(*agentv1.WorkStatus) bool) (*agentv1.WorkStatus, error) {
	uid := item.GetUid()
	if !h.Connected(node) {
		return nil, fmt.Errorf("call %s on node %s: %w (hub %s)", uid, node, ErrNotConnected, h.opts.Name)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("call %s on node %s: %w", uid, node, err)
	}
	// Waiting before dispatching: the answer may come before Dispatch returns.
	k := callKey{node, uid}
	w := &waiter{done: done, ch: make(chan *agentv1.WorkStatus, 1)}
	h.calls.add(k, w)
	if err := h.Dispatch(node, item); err != nil {
		h.calls.remove(k, w)
		return nil, fmt.Errorf("call %s on node %s: %w", uid, node, err)
	}
	select {
	case st := <-w.ch:
		return st, nil
	case <-ctx.Done():
		if !h.calls.remove(k, w) {
			// The answer came as ctx ended: it is there, take it.
			return <-w.ch, nil
		}
		return nil, fmt.Errorf("call %s on node %s: no answer from the agent before the call's deadline: %w", uid, node, ctx.Err())
	}
}
