package mqttbridge_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/agent"
	"github.com/drover-fleet/drover/internal/agent/mqttclient"
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/store"
	"github.com/drover-fleet/drover/internal/testenv"
)

// TestFrozenAgentRejoinsOverMQTT: an agent that stalls (as under kill -STOP:
// its TCP connection stays up, nothing flows either way) for longer than the
// hub's offline timeout loses its session; the bridge ends it ("agent silent
// for longer than the offline timeout") and the hub marks the node Offline
// (HeartbeatTimeout). When the agent resumes it must notice, say hello
// again, go Online and get a snapshot, which cancels the work deleted
// meanwhile, as a gRPC agent does when its stream breaks.
//
// The freeze is a TCP proxy between the agent and the broker that stops
// passing bytes. The hub's clock is held 2s back during the freeze, so that
// of the two equal timeouts that end a silent session (the bridge's and the
// hub's liveness tracker's, which race otherwise) the bridge's always fires
// first, as it did in the field.
func TestFrozenAgentRejoinsOverMQTT(t *testing.T) {
	for _, kind := range brokers {
		t.Run(kind, func(t *testing.T) {
			lagged := &laggingClock{Clock: clock.Real()}
			s := startStackOpts(t, kind, "mqtt-rejoin-"+kind, stackOptions{offline: 4 * time.Second, hubClock: lagged})
			p := startProxy(t, s.url)
			node := kind + "-frozen"
			started := make(chan struct{}, 1)
			opts := s.agentOpts(node, 0, map[string]agent.Runner{"wait": agent.RunnerFunc(func(ctx context.Context, _ store.Work) (string, string) {
				started <- struct{}{}
				return waitForCancel(ctx)
			})})
			opts.Connect = mqttclient.Connector(mqttclient.Options{Broker: p.url, Logger: opts.Logger})
			run(t, "agent "+node, func(ctx context.Context) error { return agent.Run(ctx, opts) })
			s.waitOnline(node)

			it := &agentv1.WorkItem{Uid: "w-deleted", Type: "wait", Spec: []byte(`{}`)}
			s.dispatch(node, it)
			select {
			case <-started:
			case <-time.After(waitTimeout):
				t.Fatalf("%s did not start within %v", it.GetUid(), waitTimeout)
			}
			s.waitSettled(node)

			// Freeze.
			lagged.lag.Store(int64(2 * time.Second))
			p.pause()
			waitFor(t, "the bridge to end the silent agent's session", func() bool { return !s.hub.Connected(node) })
			s.waitOffline(node, fleetv1.ReasonHeartbeatTimeout)
			// The task is deleted while the node is Offline.
			s.works.remove(node, it.GetUid())
			if !strings.Contains(s.logs.String(), "agent silent for longer than the offline timeout; ending its mqtt session") {
				t.Fatalf("the bridge did not end the session for silence: the test proves nothing")
			}

			// Resume: the agent says hello again and gets a snapshot.
			p.resume()
			s.waitOnline(node)
			s.sink.waitPhase(t, node, it.GetUid(), agent.PhaseCancelled)
		})
	}
}

// laggingClock is the wall clock held lag behind: its timers run at the
// wall clock's pace, but the times it tells are late.
type laggingClock struct {
	clock.Clock
	lag atomic.Int64
}

func (c *laggingClock) Now() time.Time { return c.Clock.Now().Add(-time.Duration(c.lag.Load())) }

func (c *laggingClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// waitForCancel is a runner that runs until its item is cancelled.
func waitForCancel(ctx context.Context) (string, string) {
	select {
	case <-ctx.Done():
		return agent.PhaseCancelled, "cancelled"
	case <-time.After(3 * waitTimeout):
		return agent.PhaseFailed, "never cancelled"
	}
}

// waitOffline waits until node's FleetNode is Offline for reason.
func (s *stack) waitOffline(node, reason string) {
	s.t.Helper()
	testenv.Eventually(s.t, waitTimeout, "node "+node+" Offline ("+reason+")", func(ctx context.Context) (bool, error) {
		var n fleetv1.FleetNode
		if err := s.c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
			return false, nil
		}
		c := meta.FindStatusCondition(n.Status.Conditions, fleetv1.ReadyCondition)
		if n.Status.Phase != fleetv1.FleetNodeOffline || c == nil || c.Reason != reason {
			return false, fmt.Errorf("phase %q, ready %v", n.Status.Phase, c)
		}
		return true, nil
	})
}

func (w *works) remove(node, uid string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.items[node] = slices.DeleteFunc(w.items[node], func(it *agentv1.WorkItem) bool { return it.GetUid() == uid })
}

// proxy passes TCP connections through to a broker until paused: then it
// holds every byte, in both directions, without closing anything, as a
// stopped process would.
type proxy struct {
	url string // the broker's URL, through the proxy

	l      net.Listener
	mu     sync.Mutex
	cond   *sync.Cond
	paused bool
	conns  []net.Conn
}

func startProxy(t *testing.T, broker string) *proxy {
	t.Helper()
	u, err := url.Parse(broker)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l, url: u.Scheme + "://" + l.Addr().String()}
	p.cond = sync.NewCond(&p.mu)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.DialTimeout("tcp", u.Host, waitTimeout)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go p.pipe(up, c)
			go p.pipe(c, up)
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		p.resume()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			c.Close()
		}
	})
	return p
}

func (p *proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.paused {
				p.cond.Wait()
			}
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				src.Close()
				return
			}
		}
		if err != nil { // the other side went away
			dst.Close()
			return
		}
	}
}

func (p *proxy) pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = true
}

func (p *proxy) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = false
	p.cond.Broadcast()
}
