package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

type simOptions struct {
	hub, caFile, token, prefix string
	agents, first              int
	srcFirst, srcCount         int
	concurrency, workers       int
	heartbeat, report          time.Duration

	// nodeJobs makes each agent answer node-job upgrade items at once
	// (nodejob.go); version is the agent version it reports; labels go into
	// NodeInfo (the hub copies them onto the FleetNode).
	nodeJobs bool
	version  string
	labels   map[string]string
}

// Timeouts as in internal/agent: one Register call, one SendMessage call.
const (
	registerTimeout = 20 * time.Second
	callTimeout     = 15 * time.Second
)

// counters are the process's totals, printed on each stat line.
type counters struct {
	registered, connected, regErrors, streamErrors        atomic.Int64
	heartbeats, hbErrors, hbSkipped, acks, configMismatch atomic.Int64
	hbLatSum, hbLatMax, hbLatN                            atomic.Int64 // since the last stat line
	jobItems, jobStatuses, jobErrors                      atomic.Int64 // -nodejobs
}

type sim struct {
	opts  simOptions
	roots *x509.CertPool
	host  string
	info  *agentv1.NodeInfo
	st    counters
	wheel *wheel
}

// simAgent is one simulated node. Only its stream goroutine touches hubRev
// and agentRev; connected and beating are shared with the heartbeat wheel.
type simAgent struct {
	s      *sim
	name   string
	src    net.IP
	client agentv1.AgentHubClient

	connected atomic.Bool
	beating   atomic.Bool // a heartbeat is in flight
	inWheel   bool

	hubRev, agentRev uint64
	// jobs holds the last status sent for each node-job item (-nodejobs):
	// an item is answered once, and its end goes into NodeState on reconnect.
	jobs map[string]*agentv1.WorkStatus
}

func runSim(ctx context.Context, o simOptions) error {
	if o.hub == "" || o.caFile == "" || o.token == "" {
		return errors.New("-hub, -ca and -token are required")
	}
	if o.srcFirst < 1 || o.srcFirst+o.srcCount-1 > 254 || o.srcCount < 1 {
		return fmt.Errorf("source addresses 127.0.0.%d..%d are out of range", o.srcFirst, o.srcFirst+o.srcCount-1)
	}
	caPEM, err := os.ReadFile(o.caFile)
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("%s holds no PEM certificate", o.caFile)
	}
	host, _, err := net.SplitHostPort(o.hub)
	if err != nil {
		return fmt.Errorf("-hub %q: %w", o.hub, err)
	}
	s := &sim{
		opts:  o,
		roots: roots,
		host:  host,
		// What a small machine reports; the hub validates and stores it.
		info: &agentv1.NodeInfo{
			Capacity:     map[string]string{"cpu": "2", "memory": "1Gi"},
			AgentVersion: o.version,
			Os:           runtime.GOOS,
			Arch:         runtime.GOARCH,
			Labels:       o.labels,
		},
	}
	s.wheel = newWheel(o.heartbeat, 100*time.Millisecond, o.workers, s.beat)
	go s.wheel.run(ctx)

	began := time.Now()
	allUp := make(chan struct{})
	var pending sync.WaitGroup
	pending.Add(o.agents)
	go func() { pending.Wait(); close(allUp) }()
	go s.printStats(ctx, began, allUp)

	sem := make(chan struct{}, o.concurrency)
	for i := range o.agents {
		idx := o.first + i
		a := &simAgent{
			s:    s,
			name: fmt.Sprintf("%s-%05d", o.prefix, idx),
			src:  net.IPv4(127, 0, 0, byte(o.srcFirst+i%o.srcCount)),
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		var once sync.Once
		release := func() { once.Do(func() { <-sem; pending.Done() }) }
		go a.run(ctx, release)
	}
	<-ctx.Done()
	return nil
}

func (s *sim) printStats(ctx context.Context, began time.Time, allUp <-chan struct{}) {
	t := time.NewTicker(s.opts.report)
	defer t.Stop()
	upAfter := -1.0
	for {
		select {
		case <-ctx.Done():
			return
		case <-allUp:
			upAfter = time.Since(began).Seconds()
			allUp = nil
			continue
		case <-t.C:
		}
		n := s.st.hbLatN.Swap(0)
		sum := s.st.hbLatSum.Swap(0)
		mx := s.st.hbLatMax.Swap(0)
		mean := 0.0
		if n > 0 {
			mean = float64(sum) / float64(n) / 1e6
		}
		fmt.Printf("stat t=%.0f registered=%d connected=%d reg_errors=%d stream_errors=%d heartbeats=%d hb_errors=%d hb_skipped=%d acks=%d hb_mean_ms=%.2f hb_max_ms=%.2f config_mismatch=%d all_connected_s=%.1f job_items=%d job_statuses=%d job_errors=%d\n",
			time.Since(began).Seconds(), s.st.registered.Load(), s.st.connected.Load(), s.st.regErrors.Load(), s.st.streamErrors.Load(),
			s.st.heartbeats.Load(), s.st.hbErrors.Load(), s.st.hbSkipped.Load(), s.st.acks.Load(), mean, float64(mx)/1e6,
			s.st.configMismatch.Load(), upAfter, s.st.jobItems.Load(), s.st.jobStatuses.Load(), s.st.jobErrors.Load())
	}
}

// dialOptions are the agent's (internal/agent dial) plus a source address.
// The read/write buffers are smaller than gRPC's 32 KiB defaults so one
// process can hold thousands of connections; that changes nothing the hub sees.
func (a *simAgent) dialOptions(cfg *tls.Config) []grpc.DialOption {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: a.src}}
	return []grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(cfg)),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", addr)
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(protocol.MaxEnvelopeBytes), grpc.MaxCallSendMsgSize(protocol.MaxEnvelopeBytes)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 60 * time.Second, Timeout: 20 * time.Second, PermitWithoutStream: true}),
		grpc.WithReadBufferSize(8 << 10),
		grpc.WithWriteBufferSize(8 << 10),
	}
}

// run registers, then keeps one stream open until ctx ends. release is
// called once the first stream is up (or the agent gives up), which admits
// the next agent of the ramp.
func (a *simAgent) run(ctx context.Context, release func()) {
	defer release()
	s := a.s
	keyPEM, csr, err := pki.NewKeyAndCSR(a.name)
	if err != nil {
		fmt.Fprintln(os.Stderr, "agentsim:", err)
		return
	}
	resp, err := a.register(ctx, csr)
	if err != nil {
		return // ctx ended
	}
	s.st.registered.Add(1)
	cert, err := tls.X509KeyPair(pki.EncodeCert(resp.GetCertificate()), keyPEM)
	if err != nil {
		fmt.Fprintf(os.Stderr, "agentsim: %s: certificate: %v\n", a.name, err)
		return
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pki.EncodeCert(resp.GetCa()))
	conn, err := grpc.NewClient("passthrough:///"+s.opts.hub, a.dialOptions(&tls.Config{
		Certificates: []tls.Certificate{cert}, RootCAs: roots, ServerName: s.host, MinVersion: tls.VersionTLS13,
	})...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "agentsim:", err)
		return
	}
	defer conn.Close()
	a.client = agentv1.NewAgentHubClient(conn)

	backoff := 500 * time.Millisecond
	for {
		began := time.Now()
		err := a.session(ctx, release)
		if ctx.Err() != nil {
			return
		}
		if s.st.streamErrors.Add(1) <= 5 {
			fmt.Fprintf(os.Stderr, "agentsim: %s: stream: %v\n", a.name, err)
		}
		if status.Code(err) == codes.Unauthenticated || status.Code(err) == codes.PermissionDenied {
			fmt.Fprintf(os.Stderr, "agentsim: %s: refused: %v\n", a.name, err)
			return
		}
		if time.Since(began) > 30*time.Second {
			backoff = 500 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff + rand.N(backoff/2+1)):
		}
		backoff = min(backoff*2, 30*time.Second)
	}
}

// register calls Register (one TLS connection without a client certificate,
// as the real agent does) until the node is approved or ctx ends.
func (a *simAgent) register(ctx context.Context, csr []byte) (*agentv1.RegisterResponse, error) {
	s := a.s
	req := &agentv1.RegisterRequest{Node: a.name, BootstrapToken: s.opts.token, Csr: csr, Info: a.nodeInfo()}
	backoff := time.Second
	for {
		resp, err := a.registerOnce(ctx, req)
		if err == nil && resp.GetResult() == agentv1.RegisterResponse_RESULT_APPROVED {
			return resp, nil
		}
		wait := backoff
		if err == nil {
			wait = time.Duration(max(resp.GetRetryAfterSeconds(), 1)) * time.Second
		} else {
			s.st.regErrors.Add(1)
			if s.st.regErrors.Load() <= 5 {
				fmt.Fprintf(os.Stderr, "agentsim: %s: register: %v\n", a.name, err)
			}
			backoff = min(backoff*2, 30*time.Second)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
}

func (a *simAgent) registerOnce(ctx context.Context, req *agentv1.RegisterRequest) (*agentv1.RegisterResponse, error) {
	conn, err := grpc.NewClient("passthrough:///"+a.s.opts.hub, a.dialOptions(&tls.Config{
		RootCAs: a.s.roots, ServerName: a.s.host, MinVersion: tls.VersionTLS13,
	})...)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, registerTimeout)
	defer cancel()
	return agentv1.NewAgentHubClient(conn).Register(ctx, req)
}

func (a *simAgent) nodeInfo() *agentv1.NodeInfo {
	i := a.s.info
	return &agentv1.NodeInfo{Capacity: i.Capacity, AgentVersion: i.AgentVersion, Os: i.Os, Arch: i.Arch, Hostname: a.name, Labels: i.Labels}
}

// session opens GetMessage, reports the node's state (as the real agent
// does on every connect) and handles what the hub sends until the stream
// fails or ctx ends.
func (a *simAgent) session(ctx context.Context, release func()) error {
	s := a.s
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := a.client.GetMessage(ctx, &agentv1.GetMessageRequest{LastRevision: a.hubRev, AgentRevision: a.agentRev, Info: a.nodeInfo()})
	if err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	a.agentRev++
	if _, err := a.call(ctx, protocol.NewNodeState(a.name, a.agentRev, a.nodeInfo(), a.jobStatuses())); err != nil {
		return err
	}
	a.connected.Store(true)
	s.st.connected.Add(1)
	defer func() {
		a.connected.Store(false)
		s.st.connected.Add(-1)
	}()
	if !a.inWheel {
		a.inWheel = true
		s.wheel.add(a)
	}
	release()
	env := first
	for {
		if err := a.handle(ctx, env); err != nil {
			return err
		}
		env, err = stream.Recv()
		if err != nil {
			return err
		}
	}
}

func (a *simAgent) handle(ctx context.Context, env *agentv1.Envelope) error {
	if err := protocol.Validate(env); err != nil {
		return fmt.Errorf("malformed message from hub: %w", err)
	}
	switch p := env.GetPayload().(type) {
	case *agentv1.Envelope_NodeConfiguration:
		if hb := time.Duration(p.NodeConfiguration.GetHeartbeatSeconds()) * time.Second; hb > 0 && hb != a.s.opts.heartbeat {
			if a.s.st.configMismatch.Add(1) == 1 {
				fmt.Fprintf(os.Stderr, "agentsim: hub asks for %v heartbeats; simulating %v (-heartbeat)\n", hb, a.s.opts.heartbeat)
			}
		}
		return nil
	case *agentv1.Envelope_Snapshot:
		a.hubRev = env.GetRevision()
	default:
		a.hubRev = max(a.hubRev, env.GetRevision())
	}
	if _, err := a.call(ctx, protocol.NewAck(a.name, env.GetId())); err != nil {
		return err
	}
	a.s.st.acks.Add(1)
	if a.s.opts.nodeJobs {
		return a.answerJobs(ctx, env)
	}
	return nil
}

func (a *simAgent) call(ctx context.Context, env *agentv1.Envelope) (*agentv1.SendResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	return a.client.SendMessage(ctx, env)
}

// beat sends one heartbeat; the wheel calls it from a worker.
func (s *sim) beat(ctx context.Context, a *simAgent) {
	defer a.beating.Store(false)
	began := time.Now()
	_, err := a.call(ctx, protocol.NewHeartbeat(a.name))
	if err != nil {
		if ctx.Err() == nil {
			s.st.hbErrors.Add(1)
		}
		return
	}
	d := int64(time.Since(began))
	s.st.heartbeats.Add(1)
	s.st.hbLatSum.Add(d)
	s.st.hbLatN.Add(1)
	for {
		m := s.st.hbLatMax.Load()
		if d <= m || s.st.hbLatMax.CompareAndSwap(m, d) {
			break
		}
	}
}

// wheel fires each agent's heartbeat once per interval at the agent's own
// random phase: one ticker and a fixed pool of workers for the whole
// process instead of a timer and a goroutine per agent.
type wheel struct {
	tick    time.Duration
	workers int
	beat    func(context.Context, *simAgent)

	mu    sync.Mutex
	slots [][]*simAgent
	work  chan *simAgent
}

func newWheel(interval, tick time.Duration, workers int, beat func(context.Context, *simAgent)) *wheel {
	n := max(int(interval/tick), 1)
	return &wheel{tick: tick, workers: workers, beat: beat, slots: make([][]*simAgent, n), work: make(chan *simAgent, 8192)}
}

// add places a at a random phase; it stays there for good and beats whenever
// it is connected.
func (w *wheel) add(a *simAgent) {
	i := rand.IntN(len(w.slots))
	w.mu.Lock()
	w.slots[i] = append(w.slots[i], a)
	w.mu.Unlock()
}

func (w *wheel) run(ctx context.Context) {
	for range w.workers {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case a := <-w.work:
					w.beat(ctx, a)
				}
			}
		}()
	}
	t := time.NewTicker(w.tick)
	defer t.Stop()
	for pos := 0; ; pos = (pos + 1) % len(w.slots) {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.mu.Lock()
		slot := w.slots[pos] // agents are only appended: this prefix is stable
		w.mu.Unlock()
		for _, a := range slot {
			if !a.connected.Load() || !a.beating.CompareAndSwap(false, true) {
				continue
			}
			select {
			case w.work <- a:
			default:
				a.beating.Store(false)
				a.s.st.hbSkipped.Add(1)
			}
		}
	}
}
