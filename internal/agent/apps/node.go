package apps

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/drover-fleet/drover/internal/agent/instance"
	"github.com/drover-fleet/drover/internal/agent/sessionsvc"
	"github.com/drover-fleet/drover/internal/agent/taskexec"
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/serverless/actor"
	"github.com/drover-fleet/drover/internal/serverless/appwire"
)

// Work phases, as the agent's (internal/agent cannot be imported here: it
// imports this package).
const (
	PhaseRunning   = "Running"
	PhaseSucceeded = "Succeeded"
	PhaseFailed    = "Failed"
)

// ReasonAgentRestarted ends an instance found running after an agent
// restart: it is stopped, not re-attached (see the package doc).
const ReasonAgentRestarted = "AgentRestarted"

// Store is what the node keeps in the agent's DB besides the work items.
type Store interface {
	// SetRecord stores what a restart needs to find instance uid's process
	// again (running: the instance may still run).
	SetRecord(ctx context.Context, uid string, running bool, data []byte) error
	// Record is what SetRecord stored for uid.
	Record(ctx context.Context, uid string) (data []byte, found bool, err error)
	// WorkPhase is the phase of work item uid in the agent's DB.
	WorkPhase(ctx context.Context, uid string) (phase string, found bool, err error)
}

// ReportFunc sends a progress report of a running item (reason: the
// actor's state; message: the appwire report's JSON).
type ReportFunc func(ctx context.Context, reason, message string) error

// Options configure a Node.
type Options struct {
	Runtime Runtime
	// SocketDir holds the instances' session sockets (sessionsvc.Options.Dir).
	SocketDir string
	Store     Store
	// Cancelled reports whether an item's context ended because the hub
	// cancelled the item (not because the agent is stopping).
	Cancelled func(ctx context.Context) bool
	// DefaultUID and DefaultGID are the user an instance runs as when its
	// spec names none (the agent's task user); -1: the agent's own.
	DefaultUID, DefaultGID int
	// StopGrace is the time between SIGTERM and SIGKILL when an instance
	// stops. Default 5s.
	StopGrace time.Duration
	// ProbePeriod is how often liveness and readiness are probed.
	// Default 100ms.
	ProbePeriod time.Duration
	Clock       clock.Clock
	Logger      *slog.Logger

	// newSessions replaces the session service (tests).
	newSessions func(sessionsvc.Handler) (Sessions, error)
}

// Node is the node actor: it owns the Pod and Session actors of every
// instance and session on the node, under one lock.
type Node struct {
	opts Options
	log  *slog.Logger
	clk  clock.Clock
	svc  Sessions

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	kick   chan struct{} // wakes the timer loop

	mu       sync.Mutex
	pods     map[string]*pod
	sessions map[string]*session
	pending  map[string][]string // pod uid → sessions waiting for it to be created
	// ended: pods that ended in this process (or were found after a
	// restart and stopped), and when: a session for one is InstanceGone at
	// once, though the DB may still say its item runs (its end is
	// recorded after the runner returns).
	ended  map[string]time.Time
	closed bool
}

// item is a work item's side of the node: the reports its runner sends,
// in order, and its end.
type item struct {
	uid     string
	wake    chan struct{} // cap 1
	reports []report
	end     *ending
}

type report struct{ reason, message string }

type ending struct{ phase, reason, message string }

func newItem(uid string) item { return item{uid: uid, wake: make(chan struct{}, 1)} }

func (it *item) push(r report) {
	it.reports = append(it.reports, r)
	it.signal()
}

func (it *item) finish(e ending) {
	if it.end == nil {
		it.end = &e
	}
	it.signal()
}

func (it *item) signal() {
	select {
	case it.wake <- struct{}{}:
	default:
	}
}

// pod is an instance: its actor, its process, and the serial queue of its
// runtime operations.
type pod struct {
	item
	spec   *appwire.InstanceSpec
	a      *actor.Pod
	inst   atomic.Pointer[instanceBox]
	ops    *serial
	ctx    context.Context // ends when it is stopped: its start and probes end
	cancel context.CancelFunc
	state  actor.PodState
	since  time.Time
	// written: the sessions its session file was last written with (nil:
	// never written).
	written []string
	last    appwire.InstanceReport
}

type instanceBox struct{ Instance }

func (p *pod) instance() Instance {
	if b := p.inst.Load(); b != nil {
		return b.Instance
	}
	return nil
}

type session struct {
	item
	spec  *appwire.SessionSpec
	a     *actor.Session
	ready time.Time
	last  appwire.SessionReport
	// awaitPod: its pod's work item was known and not over when the
	// session came: it waits for the pod to be created.
	awaitPod bool
}

// New returns a Node; Close stops it (the instances' processes go on).
func New(opts Options) (*Node, error) {
	if opts.Runtime == nil || opts.Store == nil || opts.Cancelled == nil {
		return nil, errors.New("apps: Runtime, Store and Cancelled are required")
	}
	if opts.StopGrace <= 0 {
		opts.StopGrace = 5 * time.Second
	}
	if opts.ProbePeriod <= 0 {
		opts.ProbePeriod = 100 * time.Millisecond
	}
	opts.Clock = clock.Or(opts.Clock)
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	n := &Node{opts: opts, log: opts.Logger, clk: opts.Clock, kick: make(chan struct{}, 1),
		pods: map[string]*pod{}, sessions: map[string]*session{}, pending: map[string][]string{}, ended: map[string]time.Time{}}
	var err error
	if opts.newSessions != nil {
		n.svc, err = opts.newSessions(n.callback)
	} else {
		if opts.SocketDir == "" {
			return nil, errors.New("apps: SocketDir is required")
		}
		var s *sessionsvc.Service
		s, err = sessionsvc.New(sessionsvc.Options{Dir: opts.SocketDir, Handler: n.callback, Logger: opts.Logger})
		n.svc = s
	}
	if err != nil {
		return nil, fmt.Errorf("apps: %w", err)
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.wg.Add(1)
	go n.timers()
	return n, nil
}

// Close stops the node's goroutines and session service. The instances'
// processes go on: after the agent's next start, Resume stops them.
func (n *Node) Close() {
	n.mu.Lock()
	n.closed = true
	n.mu.Unlock()
	n.cancel()
	n.wg.Wait()
	n.svc.Close()
}

// callback is the session service's Handler: an instance's callback for
// one of its sessions, as a Session actor message.
func (n *Node) callback(inst, sess string, msg actor.Message) {
	n.mu.Lock()
	defer n.mu.Unlock()
	s, ok := n.sessions[sess]
	if !ok || s.spec.Instance != inst {
		return
	}
	n.run([]target{{session: sess, msg: msg}})
}

// target is a message for one actor.
type target struct {
	pod, session string
	msg          actor.Message
}

// deliver steps the pod's actor with msg (from the runtime's goroutines).
func (n *Node) deliverPod(uid string, msg actor.Message) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.run([]target{{pod: uid, msg: msg}})
}

// run steps actors with the queued messages and carries out their effects
// until nothing is left; n.mu is held. Messages between actors are
// queued, not stepped recursively, so each actor sees them in order.
func (n *Node) run(queue []target) {
	now := n.clk.Now()
	for len(queue) > 0 {
		t := queue[0]
		queue = queue[1:]
		var effects []actor.Effect
		switch {
		case t.pod != "":
			p, ok := n.pods[t.pod]
			if !ok {
				if a, isAdd := t.msg.(actor.AddSession); isAdd {
					queue = append(queue, n.noPod(t.pod, a.Session)...)
				}
				continue
			}
			effects = p.a.Step(now, t.msg)
		default:
			s, ok := n.sessions[t.session]
			if !ok {
				continue
			}
			effects = s.a.Step(now, t.msg)
		}
		queue = append(queue, n.effects(now, effects)...)
	}
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// noPod: session s was routed to a pod this node does not run. A pod whose
// work item is known and not over yet is about to be created (its item
// and the session's run on goroutines of their own): s waits for it.
func (n *Node) noPod(podUID, s string) []target {
	if _, ok := n.sessions[s]; !ok {
		return nil
	}
	for _, w := range n.pending[podUID] {
		if w == s {
			return nil
		}
	}
	if n.sessions[s].awaitPod {
		n.pending[podUID] = append(n.pending[podUID], s)
		return nil
	}
	return []target{{session: s, msg: actor.InstanceGone{Reason: actor.ReasonInstanceGone}}}
}

// effects carries out one step's effects and returns the messages they
// make for other actors. n.mu is held: nothing here blocks (runtime
// operations go to the pod's serial queue).
func (n *Node) effects(now time.Time, effects []actor.Effect) []target {
	var out []target
	for _, e := range effects {
		switch e := e.(type) {
		case actor.ToPod:
			out = append(out, target{pod: e.Pod, msg: e.Msg})
		case actor.ToSession:
			out = append(out, target{session: e.Session, msg: e.Msg})
		case actor.PodReport:
			if p, ok := n.pods[e.Pod]; ok {
				n.podReport(now, p, e)
			}
		case actor.SessionReport:
			if s, ok := n.sessions[e.Session]; ok {
				n.sessionReport(now, s, e)
			}
		case actor.StartInstance:
			if p, ok := n.pods[e.Pod]; ok {
				p.ops.do(func() { n.start(p) })
			}
		case actor.FreezeInstance:
			if p, ok := n.pods[e.Pod]; ok {
				p.ops.do(func() { n.freeze(p, true) })
			}
		case actor.ThawInstance:
			if p, ok := n.pods[e.Pod]; ok {
				p.ops.do(func() { n.freeze(p, false) })
			}
		case actor.StopInstance:
			if p, ok := n.pods[e.Pod]; ok {
				p.cancel() // a start or a liveness wait in progress ends
				p.ops.do(func() { n.stop(p) })
			}
		case actor.SendSessionStart:
			n.sendStart(e.Pod, e.Session)
		case actor.SendSessionClose:
			if err := n.svc.CloseSession(e.Pod, e.Session); err != nil {
				n.log.Info("cannot send SessionClose (best effort)", "instance", e.Pod, "session", e.Session, "err", err)
			}
		case actor.Forget:
			if e.Session != "" {
				out = append(out, n.forgetSession(e.Session)...)
			}
			if e.Pod != "" {
				out = append(out, n.forgetPod(e.Pod)...)
			}
		}
	}
	return out
}

func (n *Node) podReport(now time.Time, p *pod, e actor.PodReport) {
	if e.State != p.state || p.since.IsZero() {
		p.state, p.since = e.State, now
	}
	r := appwire.InstanceReport{State: string(e.State), Reason: e.Reason, Message: e.Message, Sessions: e.Sessions,
		Since: p.since.UTC().Format(time.RFC3339)}
	if i := p.instance(); i != nil {
		r.Port = i.Port()
		// The cgroup's counters: a few small reads, on state changes only.
		st := i.Status().Stats
		r.CPUUsageNanos, r.MemoryBytes = uint64(max(st.CPU, 0)), uint64(max(st.MemoryBytes, 0))
	}
	p.last = r
	p.push(report{reason: r.State, message: encodeInstance(r)})
	n.writeSessionFile(p) // when its sessions changed
}

func (n *Node) sessionReport(now time.Time, s *session, e actor.SessionReport) {
	if e.State == actor.SessionReady && s.ready.IsZero() {
		s.ready = now
	}
	r := appwire.SessionReport{State: string(e.State), Reason: e.Reason, Instance: s.spec.Instance, Flagged: e.Flagged, Clients: e.Clients}
	if p, ok := n.pods[s.spec.Instance]; ok {
		if i := p.instance(); i != nil {
			r.Port = i.Port()
		}
	}
	if r.Port == 0 {
		r.Port = s.last.Port
	}
	if !s.ready.IsZero() {
		r.ReadyTime = s.ready.UTC().Format(time.RFC3339Nano)
	}
	s.last = r
	s.push(report{reason: r.State, message: encodeSession(r)})
}

// maxReport bounds a report's JSON: the protocol's bound of a work
// status message, less room for the agent's envelope.
const maxReport = protocol.MaxMessageBytes - 256

// maxClientName bounds a client's name in a report: the instance names its
// clients, and nothing it says may make a report too large to send.
const maxClientName = 128

// encodeInstance is r's JSON within maxReport: a long session list is cut
// (sessionsPerInstance may be up to 1000), and the message says so.
func encodeInstance(r appwire.InstanceReport) string {
	b, total := encode(r), len(r.Sessions)
	for n := total; len(b) > maxReport && n > 0; {
		n /= 2
		r.Sessions = r.Sessions[:n]
		r.Message = fmt.Sprintf("%d sessions; the first %d listed", total, n)
		b = encode(r)
	}
	if len(b) > maxReport {
		r.Message = r.Message[:min(len(r.Message), 512)]
		b = encode(r)
	}
	return b
}

// encodeSession is r's JSON within maxReport: clients' names are cut, and
// a long client list too.
func encodeSession(r appwire.SessionReport) string {
	clients := make([]string, len(r.Clients))
	for i, c := range r.Clients {
		if len(c) > maxClientName {
			c = strings.ToValidUTF8(c[:maxClientName], "") + "…"
		}
		clients[i] = c
	}
	r.Clients = clients
	b, total := encode(r), len(r.Clients)
	for n := total; len(b) > maxReport && n > 0; {
		n /= 2
		r.Clients = r.Clients[:n]
		r.Message = fmt.Sprintf("%d clients; the first %d listed", total, n)
		b = encode(r)
	}
	return b
}

func encode(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(b)
}

// sendStart writes the pod's session file with the new session, then
// sends SessionStart: the instance reads the session's data when told.
func (n *Node) sendStart(podUID, sess string) {
	s, ok := n.sessions[sess]
	if !ok {
		return
	}
	if p, ok := n.pods[podUID]; ok {
		n.writeSessionFile(p)
	}
	if err := n.svc.Start(podUID, sess, s.spec.Data); err != nil {
		// The open timeout ends the session.
		n.log.Warn("cannot send SessionStart", "instance", podUID, "session", sess, "err", err)
	}
}

// writeSessionFile rewrites p's session metadata file when its sessions
// are not those it was last written with.
func (n *Node) writeSessionFile(p *pod) {
	i := p.instance()
	sessions := p.a.Sessions()
	if i == nil || (p.written != nil && slices.Equal(sessions, p.written)) {
		return
	}
	m := instance.SessionMetadata{Instance: p.spec.Name, Application: p.spec.Namespace + "/" + p.spec.Application,
		AppData: p.spec.Config, Sessions: []instance.SessionData{}}
	for _, uid := range sessions {
		d := instance.SessionData{Name: uid}
		if s, ok := n.sessions[uid]; ok {
			d.Data = s.spec.Data
		}
		m.Sessions = append(m.Sessions, d)
	}
	if err := i.WriteSessionFile(m); err != nil {
		n.log.Warn("cannot write the session file", "instance", p.uid, "err", err)
		return
	}
	p.written = append([]string{}, sessions...)
}

// forgetSession ends a Terminated session's item.
func (n *Node) forgetSession(uid string) []target {
	s, ok := n.sessions[uid]
	if !ok {
		return nil
	}
	delete(n.sessions, uid)
	// The pod hears SessionEnded after this (queued): its report then
	// rewrites the session file without uid.
	n.svc.Forget(s.spec.Instance, uid)
	phase := PhaseFailed
	switch s.a.Reason() {
	case actor.ReasonClosed, actor.ReasonClosedByInstance:
		phase = PhaseSucceeded
	}
	s.finish(ending{phase: phase, reason: s.a.Reason(), message: encodeSession(s.last)})
	return nil
}

// forgetPod ends a Terminated pod's item; sessions still waiting for it
// end, InstanceGone.
func (n *Node) forgetPod(uid string) []target {
	p, ok := n.pods[uid]
	if !ok {
		return nil
	}
	delete(n.pods, uid)
	p.ops.close()
	phase := PhaseFailed
	if p.a.Reason() == actor.ReasonDeleted {
		phase = PhaseSucceeded
	}
	p.finish(ending{phase: phase, reason: p.a.Reason(), message: encodeInstance(p.last)})
	return n.podGone(uid)
}

// endedKeep bounds how long the node remembers an ended pod, once it
// remembers many: a session bound to it comes within its open timeout.
const endedKeep = 10 * time.Minute

// podGone records that pod uid ended, and ends the sessions waiting for
// it, which will not come.
func (n *Node) podGone(uid string) []target {
	now := n.clk.Now()
	if len(n.ended) >= 1024 {
		for k, t := range n.ended {
			if now.Sub(t) > endedKeep {
				delete(n.ended, k)
			}
		}
	}
	n.ended[uid] = now
	var out []target
	for _, s := range n.pending[uid] {
		out = append(out, target{session: s, msg: actor.InstanceGone{Reason: actor.ReasonInstanceGone}})
	}
	delete(n.pending, uid)
	return out
}

// The runtime's side, on the pod's serial queue (never under n.mu).

// start serves the instance's session socket, starts it, records how to
// find it after a restart, watches for its end, and probes it.
func (n *Node) start(p *pod) {
	spec := p.spec
	// A connection may come between the process's start and Start's
	// return (the instance is known only then): its check waits for it,
	// rather than refusing the instance and leaving its SDK to back off.
	started := make(chan struct{})
	known := sync.OnceFunc(func() { close(started) })
	defer known() // also when the start failed
	owner := sessionsvc.Owner{UID: n.opts.DefaultUID, GID: n.opts.DefaultGID, Member: func(pid int) bool {
		select {
		case <-started:
		case <-p.ctx.Done():
		}
		i := p.instance()
		return i != nil && i.Member(pid)
	}}
	if spec.RunAsUser != nil {
		owner.UID = int(*spec.RunAsUser)
		owner.GID = owner.UID
	}
	if spec.RunAsGroup != nil {
		owner.GID = int(*spec.RunAsGroup)
	}
	sock, err := n.svc.Serve(p.uid, owner)
	if err != nil {
		n.deliverPod(p.uid, actor.StartFailed{Message: err.Error()})
		return
	}
	i, err := n.opts.Runtime.Start(p.ctx, instance.Spec{Name: p.uid, Namespace: spec.Namespace, Application: spec.Application,
		Command: spec.Command, Env: spec.Env, Artifacts: spec.Artifacts, RunAsUser: spec.RunAsUser, RunAsGroup: spec.RunAsGroup,
		MemoryBytes: spec.MemoryBytes, CPUMillis: spec.CPUMillis, SessionSocket: sock})
	if err != nil {
		n.deliverPod(p.uid, actor.StartFailed{Message: err.Error()})
		return
	}
	p.inst.Store(&instanceBox{i})
	known()
	if b, err := json.Marshal(record{Info: i.Info(), Port: i.Port()}); err == nil {
		if err := n.opts.Store.SetRecord(context.WithoutCancel(p.ctx), p.uid, true, b); err != nil {
			n.log.Error("cannot record a started instance: a restart would not find it", "instance", p.uid, "err", err)
		}
	}
	n.wg.Add(1)
	go func() { // the instance's end: TransitionCrash, unless it is being stopped
		defer n.wg.Done()
		select {
		case <-i.Done():
			res := i.Result()
			msg := res.Report.Message
			if res.Report.ExitCode != nil {
				msg = fmt.Sprintf("exit code %d: %s", *res.Report.ExitCode, msg)
			}
			n.deliverPod(p.uid, actor.Exited{Message: msg})
		case <-n.ctx.Done():
		}
	}()
	n.deliverPod(p.uid, actor.Started{})
	// The actor's Tick ends LivenessChecking; this bound only ends the
	// probing of an instance nobody waits for any more.
	timeout := cmp.Or(appwire.Duration(spec.LivenessTimeoutMillis), actor.DefaultLivenessTimeout)
	live, cancel := context.WithTimeout(p.ctx, timeout+time.Second)
	defer cancel()
	if err := i.WaitLive(live, probe(spec.Liveness), probe(spec.Readiness), n.opts.ProbePeriod); err != nil {
		// A crash is Exited (above), a timeout the actor's own Tick.
		n.log.Info("instance not live", "instance", p.uid, "err", err)
		return
	}
	n.deliverPod(p.uid, actor.Live{})
}

// record is what a restart needs of an instance.
type record struct {
	Info taskexec.Info `json:"info"`
	Port int           `json:"port"`
}

func probe(p *appwire.Probe) *instance.Probe {
	if p == nil {
		return nil
	}
	return &instance.Probe{Exec: p.Exec, TCP: p.TCP, HTTPPath: p.HTTPPath, Timeout: time.Duration(p.TimeoutSeconds) * time.Second}
}

func (n *Node) freeze(p *pod, freeze bool) {
	i := p.instance()
	if i == nil || p.ctx.Err() != nil {
		return
	}
	if freeze {
		took, err := i.Freeze(p.ctx)
		if err != nil {
			n.deliverPod(p.uid, actor.FreezeFailed{Message: err.Error()})
			return
		}
		n.log.Debug("instance frozen (standby)", "instance", p.uid, "took", took)
		return
	}
	took, err := i.Thaw(p.ctx)
	if err != nil {
		// A standby instance that cannot be thawed is as good as gone.
		n.deliverPod(p.uid, actor.Exited{Message: "cannot thaw the standby instance: " + err.Error()})
		return
	}
	n.log.Debug("instance thawed (activated)", "instance", p.uid, "took", took)
}

func (n *Node) stop(p *pod) {
	if n.ctx.Err() != nil {
		return // the agent is stopping: its next start stops the instance
	}
	if i := p.instance(); i != nil {
		ctx, cancel := context.WithTimeout(context.Background(), n.opts.StopGrace+30*time.Second)
		err := i.Stop(ctx, n.opts.StopGrace)
		cancel()
		if err != nil {
			n.log.Warn("instance not stopped in time", "instance", p.uid, "err", err)
		}
	}
	n.svc.Remove(p.uid)
	if err := n.opts.Store.SetRecord(context.Background(), p.uid, false, nil); err != nil {
		n.log.Warn("cannot record a stopped instance", "instance", p.uid, "err", err)
	}
	n.deliverPod(p.uid, actor.Stopped{})
}

// timers is the node's clock: one timer, for the nearest deadline of any
// actor; at it, every actor whose deadline has come is stepped with Tick.
func (n *Node) timers() {
	defer n.wg.Done()
	for {
		n.mu.Lock()
		var next time.Time
		for _, p := range n.pods {
			if d := p.a.Deadline(); !d.IsZero() && (next.IsZero() || d.Before(next)) {
				next = d
			}
		}
		for _, s := range n.sessions {
			if d := s.a.Deadline(); !d.IsZero() && (next.IsZero() || d.Before(next)) {
				next = d
			}
		}
		n.mu.Unlock()
		var fire <-chan time.Time
		var t clock.Timer
		if !next.IsZero() {
			t = n.clk.NewTimer(max(next.Sub(n.clk.Now()), 0))
			fire = t.Chan()
		}
		select {
		case <-n.ctx.Done():
			if t != nil {
				t.Stop()
			}
			return
		case <-n.kick:
			if t != nil {
				t.Stop()
			}
		case <-fire:
			n.tick()
		}
	}
}

// tick steps every actor whose deadline has come.
func (n *Node) tick() {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := n.clk.Now()
	var due []target
	for uid, p := range n.pods {
		if d := p.a.Deadline(); !d.IsZero() && !now.Before(d) {
			due = append(due, target{pod: uid, msg: actor.Tick{}})
		}
	}
	for uid, s := range n.sessions {
		if d := s.a.Deadline(); !d.IsZero() && !now.Before(d) {
			due = append(due, target{session: uid, msg: actor.Tick{}})
		}
	}
	n.run(due)
}
