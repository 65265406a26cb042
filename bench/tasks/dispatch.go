package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/hub/mqttbridge"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// The dispatch-message phase measures Drover's hub→agent path on its own:
// how many Dispatch envelopes per second a hub gets through its protocol
// layer (session queue, revisions, validation, the transport, the agent's
// revision check, its SQLite commit, its Ack, the hub settling the ack), to
// real drover-agent processes, with the Kubernetes API out of the way. The
// API is what bounds tasks end to end (a few writes per task), so tasks/s
// says nothing about the transport; this figure is the one to hold against
// the raw transport measured in the same run.
//
// The hub runs in this process (hub.Hub and, for MQTT, mqttbridge.Bridge:
// the same code as `drover hub`) so that the benchmark can call Dispatch
// directly. Items are "noop" work with a spec the size of a real task's;
// the agents run them too (each ends Succeeded with a report), which is
// counted separately.

// dispatchWindow bounds the unacked envelopes per node, below the hub's
// per-stream queue (a node that falls that far behind is disconnected).
const dispatchWindow = 200

type dispatchResult struct {
	messages     int
	acked        time.Duration // first Dispatch → every envelope acked
	ran          time.Duration // first Dispatch → every item reported Succeeded
	succeeded    int
	perSecAcked  float64
	perSecRunEnd float64
	// envelopes is how many Dispatch envelopes carried the timed items
	// (fewer than messages when the hub batched them); acks and reports
	// are the Ack and Status envelopes the agents sent meanwhile, until
	// every item was reported. Over MQTT each of the latter is two broker
	// messages (the envelope and the hub's answer).
	envelopes, acks, reports int
}

// doneSink is the bench's one hub feature: it owns every uid, lists no
// work (items go out by Dispatch only), and counts Succeeded reports.
type doneSink struct {
	n    atomic.Int64
	last atomic.Int64 // unix nanos of the last one
}

func (s *doneSink) WorkStatus(_ context.Context, _ string, st *agentv1.WorkStatus) {
	if st.GetPhase() == "Succeeded" {
		s.n.Add(1)
		s.last.Store(time.Now().UnixNano())
	}
}

func (s *doneSink) NodeState(context.Context, string, []*agentv1.WorkStatus) {}

var _ hub.Feature = (*doneSink)(nil)

func (*doneSink) Name() string     { return "bench" }
func (*doneSink) Owns(string) bool { return true }
func (*doneSink) Attach(hub.Link)  {}

// Assigned: the bench's nodes report only what they were sent.
func (*doneSink) Assigned(context.Context, string, string) bool { return true }

func (*doneSink) WorkFor(context.Context, string) ([]*agentv1.WorkItem, error) { return nil, nil }

// runDispatch starts an in-process hub for transport m (its own MQTT
// listener, or the mode's external broker), -agents drover-agent
// processes, and dispatches -dispatch-messages items across them.
func (r *runner) runDispatch(ctx context.Context, m mode) (dispatchResult, error) {
	res := dispatchResult{messages: r.o.dispatchN}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sink := &doneSink{}
	name := "bench-d-" + m.key
	reg := prometheus.NewRegistry()
	h, err := hub.New(hub.Options{
		Features: []hub.Feature{sink}, Name: name, Client: r.c, APIReader: r.c, Namespace: "drover-system",
		ListenAddress: "127.0.0.1:0", ServingHosts: []string{"127.0.0.1"},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registerer: reg,
	})
	if err != nil {
		return res, err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(1)
	go func() { defer wg.Done(); _ = h.Start(ctx) }()
	addr, err := h.Addr(ctx)
	if err != nil {
		return res, fmt.Errorf("in-process hub: %w", err)
	}
	hubAddr := addr.String()
	var agentArgs []string
	if m.key != "grpc" {
		o := mqttbridge.Options{Hub: h, ServingHosts: []string{"127.0.0.1"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
		if m.key == "mosquitto" {
			o.Broker = r.brokerURL
		} else {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return res, err
			}
			o.Listen = l.Addr().String()
			l.Close()
		}
		b, err := mqttbridge.New(o)
		if err != nil {
			return res, err
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = b.Start(ctx) }()
		url, err := b.BrokerURL(ctx)
		if err != nil {
			return res, fmt.Errorf("in-process MQTT bridge: %w", err)
		}
		agentArgs = []string{"--transport", "mqtt", "--mqtt-broker", url}
	}

	label := name
	nodes := make([]string, r.o.agents)
	for i := range r.o.agents {
		nodes[i] = fmt.Sprintf("%s-%d", label, i)
		args := append([]string{"--node", nodes[i], "--state-dir", filepath.Join(r.o.work, nodes[i]), "--ca-file", r.caFile,
			"--hub", hubAddr, "--token", r.token, "--labels", "bench=" + label, "--log-level", r.o.logLevel}, agentArgs...)
		p, err := r.start(nodes[i], r.agent, args...)
		if err != nil {
			return res, err
		}
		defer p.Stop(10 * time.Second)
	}
	if err := r.waitOnline(ctx, label, r.o.agents, 2*time.Minute); err != nil {
		return res, err
	}
	for _, n := range nodes {
		deadline := time.Now().Add(time.Minute)
		for !h.Connected(n) {
			if time.Now().After(deadline) {
				return res, fmt.Errorf("node %s has no session on the in-process hub", n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// A few uncounted items warm up each agent's first commits.
	if err := r.dispatchAll(ctx, h, nodes, 10*len(nodes), "warm"); err != nil {
		return res, err
	}
	if err := waitDone(ctx, sink, int64(10*len(nodes)), time.Minute); err != nil {
		return res, fmt.Errorf("warm-up: %w", err)
	}
	if r.o.cpuProfile != "" {
		f, err := os.Create(fmt.Sprintf("%s.%s", r.o.cpuProfile, m.key))
		if err != nil {
			return res, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return res, err
		}
		defer pprof.StopCPUProfile()
	}
	before := sink.n.Load()
	envsBefore, acksBefore, reportsBefore := dispatchEnvelopes(reg), received(reg, "KIND_ACK"), received(reg, "KIND_STATUS")
	began := time.Now()
	if err := r.dispatchAll(ctx, h, nodes, r.o.dispatchN, "d"); err != nil {
		return res, err
	}
	res.acked = time.Since(began)
	res.envelopes = dispatchEnvelopes(reg) - envsBefore
	err = waitDone(ctx, sink, before+int64(r.o.dispatchN), 5*time.Minute)
	res.succeeded = int(sink.n.Load() - before)
	res.ran = time.Unix(0, sink.last.Load()).Sub(began)
	res.acks, res.reports = received(reg, "KIND_ACK")-acksBefore, received(reg, "KIND_STATUS")-reportsBefore
	res.perSecAcked = float64(r.o.dispatchN) / res.acked.Seconds()
	res.perSecRunEnd = float64(res.succeeded) / res.ran.Seconds()
	return res, err
}

// dispatchAll sends n noop items round robin over nodes, keeping at most
// dispatchWindow unacked per node, and returns once all are acked.
func (r *runner) dispatchAll(ctx context.Context, h *hub.Hub, nodes []string, n int, tag string) error {
	spec := sampleDispatch(0).GetDispatch().GetItem().GetSpec()
	var wg sync.WaitGroup
	errs := make([]error, len(nodes))
	for i, node := range nodes {
		share := n / len(nodes)
		if i < n%len(nodes) {
			share++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = dispatchNode(ctx, h, node, share, spec, tag)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func dispatchNode(ctx context.Context, h *hub.Hub, node string, n int, spec []byte, tag string) error {
	deadline := time.Now().Add(5 * time.Minute)
	sent := 0
	for sent < n || h.Pending(node) > 0 {
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("node %s: %d of %d dispatched, %d unacked after 5m", node, sent, n, h.Pending(node))
		}
		room := dispatchWindow - h.Pending(node)
		if room < dispatchWindow/4 || sent == n {
			time.Sleep(200 * time.Microsecond)
			continue
		}
		for ; room > 0 && sent < n; room-- {
			it := &agentv1.WorkItem{Uid: fmt.Sprintf("%s-%s-%07d", tag, node, sent), Type: "noop", Spec: spec}
			if err := h.Dispatch(node, it); err != nil {
				return err
			}
			sent++
		}
	}
	return nil
}

// dispatchEnvelopes is how many Dispatch envelopes the hub has sent, from
// its items-per-envelope histogram.
func dispatchEnvelopes(reg *prometheus.Registry) int {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() == "drover_hub_dispatch_envelope_items" && len(mf.GetMetric()) > 0 {
			return int(mf.GetMetric()[0].GetHistogram().GetSampleCount())
		}
	}
	return 0
}

// received is how many agent envelopes of kind the hub has accepted.
func received(reg *prometheus.Registry, kind string) int {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() != "drover_hub_messages_received_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					return int(m.GetCounter().GetValue())
				}
			}
		}
	}
	return 0
}

func waitDone(ctx context.Context, s *doneSink, want int64, within time.Duration) error {
	deadline := time.Now().Add(within)
	for s.n.Load() < want {
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("%d of %d items reported Succeeded within %v", s.n.Load(), want, within)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}
