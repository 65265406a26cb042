// Package taskhub is a hub's part of tasks (batch.drover.io): it sends the
// current attempt of every Task the manager scheduled onto a node connected
// to this hub, and writes what the node's agent reports back into the
// Task's status.
//
// Every hub runs one; none needs to be the leader. The manager decides
// where and when (status.nodeName, status.attempt, state Scheduled); the hub
// serving that node owns the current attempt's next transitions:
//
//	Scheduled → Dispatching   the work item was sent
//	          → Running       the agent started the process
//	          → Completed     it exited 0
//	          | Failed        it did not (exit code, reason, output tail)
//
// Reports of other attempts are ignored: the manager moved on (a restart,
// a reschedule) and the old attempt is out of the node's work list, so its
// agent cancels it at the latest on its next snapshot.
//
// A dispatched Task whose attempt still runs FlushInterval after the send
// carries the finalizer FinalizerCleanup, so deleting it stops its process
// first: the hub cancels the attempt and removes the finalizer when the
// agent confirms, when the node is on no hub, or after CleanupTimeout.
// Every wait ends. (A task deleted before its finalizer is written has its
// attempt cancelled by the hub that sent it, or by the node's next
// snapshot, which no longer lists it.)
package taskhub

//go:generate go run github.com/drover-fleet/drover/cmd/ctrlkit gen -o zz_generated.ctrlkit.go taskhub.ctrlkit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/task/taskwire"
)

// FinalizerCleanup holds a dispatched Task until its process is stopped.
const FinalizerCleanup = "batch.drover.io/agent-cleanup"

// Field indexes on Tasks in the manager's cache.
const (
	IndexNodeName = "dispatch.status.nodeName"
	IndexUID      = "dispatch.metadata.uid"
)

// Reasons this package writes into Task status and Events.
const (
	ReasonDispatched = "Dispatched"
	ReasonStarted    = "Started"
	ReasonCompleted  = "Completed"
	ReasonCleanedUp  = "CleanedUp"
	ReasonCleanup    = "CleanupTimeout"
)

// Options configure a Dispatcher.
type Options struct {
	// Client reads Tasks from the manager's cache (with the field indexes
	// SetupWithManager adds) and writes them.
	Client client.Client
	// APIReader reads afresh after a write conflict, and FleetNodes.
	APIReader client.Reader
	// FlushInterval is how long a dispatched task waits for its agent's
	// first report before it is written Dispatching on its own, and how
	// long after the send an attempt still running gets its finalizer.
	// Default 100ms: an agent that starts the task at once reports Running
	// within it, and one write then says so (a Dispatching write in flight
	// would hold the Running one back), and a short task needs no
	// finalizer. Reports are written at once.
	FlushInterval time.Duration
	// CleanupTimeout bounds how long a deleted Task waits for its agent to
	// confirm the process stopped. Default 2m.
	CleanupTimeout time.Duration
	// Recorder records Events on Tasks. Default: the manager's.
	Recorder   events.EventRecorder
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Clock stamps reports and times flushes and retries. Default: the
	// wall clock.
	Clock clock.Clock
}

// Owns reports whether a work uid is a task attempt's.
func Owns(uid string) bool {
	_, _, ok := taskwire.ParseWorkID(uid)
	return ok
}

// sent is what this hub dispatched for one task.
type sent struct {
	key  types.NamespacedName
	node string
	work string // work id
}

// report is one agent report waiting to be written.
type report struct {
	phase, reason string
	r             taskwire.Report
	full          bool // from a WorkStatus (with the runner's report), not a NodeState
}

// pending is what waits to be written into one Task.
type pending struct {
	node    string
	attempt int32
	// dispatched: the attempt was sent; it is written Dispatching once
	// FlushInterval has passed since then without a report.
	dispatched bool
	since      time.Time
	// finalizer: the attempt was sent, so the task needs FinalizerCleanup
	// while it runs. It is written FlushInterval after the send, if the
	// attempt has not ended by then: a short task needs none (deleted
	// before, its attempt is cancelled by forget).
	finalizer bool
	reports   []report
}

// merge adds what q holds to p, both of one attempt; q's reports are the
// later ones.
func (p *pending) merge(q *pending) {
	if q.dispatched && (!p.dispatched || q.since.Before(p.since)) {
		p.since = q.since
	}
	p.dispatched = p.dispatched || q.dispatched
	p.finalizer = p.finalizer || q.finalizer
	p.reports = append(p.reports, q.reports...)
}

func (p *pending) empty() bool { return !p.dispatched && !p.finalizer && len(p.reports) == 0 }

// written is the Task as this hub's last write to it returned it, kept a
// short while: the cache lags behind it, and a write from the cache's copy
// would meet a conflict and need another read.
type written struct {
	task *batchv1.Task
	at   time.Time
}

// Dispatcher is the hub feature of tasks.
type Dispatcher struct {
	opts Options
	log  *slog.Logger
	hub  atomic.Pointer[hub.Link]

	synced atomic.Bool
	// slots bounds the task writes in flight at once.
	slots chan struct{}

	mu sync.Mutex
	// run is the writer's context, nil until it starts (what is queued
	// before waits for it).
	run context.Context
	// sent: task uid → the attempt this hub dispatched last.
	sent map[types.UID]sent
	// queue: task uid → what to write.
	queue map[types.UID]*pending
	// writers: task uid → the wake-up of the goroutine writing its queue.
	// Each task has its own, so a report waits for no other task's write.
	writers map[types.UID]chan struct{}
	// latest: task uid → what this hub's last write to it returned.
	latest map[types.UID]written
	// cancelled: task uid → when its cancel was sent (deleted tasks).
	cancelled map[types.UID]time.Time
	// ended: task uid → the work id whose end the agent reported.
	ended map[types.UID]string
	// gone: work id → node, of attempts this hub sent whose tasks are gone
	// (forget), so that their node's last reports are still its own; the
	// oldest are forgotten first (goneOrder).
	gone      map[string]string
	goneOrder []string

	// requeue asks the controller to look at a task again (an end
	// reported for a deleted task).
	requeue chan types.NamespacedName

	m metrics
}

type metrics struct {
	dispatched, reports, writes, conflicts, cancels prometheus.Counter
}

var (
	_ hub.Feature   = (*Dispatcher)(nil)
	_ hub.Readier   = (*Dispatcher)(nil)
	_ hub.LogFinder = (*Dispatcher)(nil)
)

// New returns a dispatcher; hub.New attaches it to its hub.
func New(opts Options) *Dispatcher {
	if opts.FlushInterval <= 0 {
		opts.FlushInterval = 100 * time.Millisecond
	}
	if opts.CleanupTimeout <= 0 {
		opts.CleanupTimeout = 2 * time.Minute
	}
	if opts.APIReader == nil {
		opts.APIReader = opts.Client
	}
	opts.Clock = clock.Or(opts.Clock)
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "drover_hub_task_" + name, Help: help})
	}
	d := &Dispatcher{
		opts: opts, log: opts.Logger,
		slots:     make(chan struct{}, writeParallelism),
		sent:      map[types.UID]sent{},
		queue:     map[types.UID]*pending{},
		writers:   map[types.UID]chan struct{}{},
		latest:    map[types.UID]written{},
		cancelled: map[types.UID]time.Time{},
		ended:     map[types.UID]string{},
		gone:      map[string]string{},
		requeue:   make(chan types.NamespacedName, 1024),
		m: metrics{
			dispatched: c("dispatched_total", "Task attempts this hub sent to agents (Dispatch messages and snapshot items)."),
			reports:    c("reports_total", "Task attempt reports received from agents."),
			writes:     c("status_writes_total", "Task status writes by this hub."),
			conflicts:  c("write_conflicts_total", "Task writes that met a conflict and were retried."),
			cancels:    c("cancels_total", "Cancels sent for deleted or superseded task attempts."),
		},
	}
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(d.m.dispatched, d.m.reports, d.m.writes, d.m.conflicts, d.m.cancels)
	}
	return d
}

// Name implements hub.Feature.
func (d *Dispatcher) Name() string { return "task" }

// Owns implements hub.Feature: task attempts' work uids (Owns).
func (d *Dispatcher) Owns(uid string) bool { return Owns(uid) }

// Assigned implements hub.Feature: a task attempt's work id is node's when
// this hub sent that attempt to node, or the Task says the attempt runs
// (or ran) there (status.nodeName, or status.history for an earlier
// attempt). What this hub sent answers first: it is recorded when the
// dispatch goes out, before the cache shows it; and the cache shows a
// Task's nodeName before this hub sends it anything. A Task this hub
// does not know (not in the cache, not recently sent) has no node.
func (d *Dispatcher) Assigned(ctx context.Context, node, uid string) bool {
	tuid, attempt, ok := taskwire.ParseWorkID(uid)
	if !ok {
		return false
	}
	d.mu.Lock()
	s, sent := d.sent[types.UID(tuid)]
	goneTo, gone := d.gone[uid]
	d.mu.Unlock()
	switch {
	case sent && s.work == uid:
		return s.node == node
	case gone:
		return goneTo == node
	}
	var l batchv1.TaskList
	// Read only: no copy of the cached object.
	if err := d.opts.Client.List(ctx, &l, client.MatchingFields{IndexUID: tuid}, client.UnsafeDisableDeepCopy); err != nil || len(l.Items) == 0 {
		return false
	}
	ran, err := batchv1.AttemptNode(&l.Items[0], attempt)
	return err == nil && ran == node
}

// goneMax bounds the attempts of gone tasks the dispatcher remembers.
const goneMax = 4096

// rememberGoneLocked records that attempt work was sent to node and its
// task is gone. d.mu is held.
func (d *Dispatcher) rememberGoneLocked(work, node string) {
	if _, ok := d.gone[work]; !ok {
		if len(d.goneOrder) >= goneMax {
			delete(d.gone, d.goneOrder[0])
			d.goneOrder = d.goneOrder[1:]
		}
		d.goneOrder = append(d.goneOrder, work)
	}
	d.gone[work] = node
}

// Attach implements hub.Feature: the dispatcher sends work through l.
func (d *Dispatcher) Attach(l hub.Link) { d.hub.Store(&l) }

func (d *Dispatcher) getHub() hub.Link {
	if h := d.hub.Load(); h != nil {
		return *h
	}
	return nil
}

// IndexTasks adds the field indexes the dispatcher lists Tasks by
// (SetupWithManager calls it). Indexes are per manager: a second call on
// the same manager fails.
func IndexTasks(ctx context.Context, mgr ctrl.Manager) error {
	fi := mgr.GetFieldIndexer()
	if err := fi.IndexField(ctx, &batchv1.Task{}, IndexNodeName, func(o client.Object) []string {
		if n := o.(*batchv1.Task).Status.NodeName; n != "" {
			return []string{n}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("index tasks by %s: %w", IndexNodeName, err)
	}
	if err := fi.IndexField(ctx, &batchv1.Task{}, IndexUID, func(o client.Object) []string {
		return []string{string(o.GetUID())}
	}); err != nil {
		return fmt.Errorf("index tasks by %s: %w", IndexUID, err)
	}
	return nil
}

// SetupWithManager adds the field indexes, the Task controller (on every
// hub, without leader election) and the status writer.
func (d *Dispatcher) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if err := IndexTasks(ctx, mgr); err != nil {
		return err
	}
	if d.opts.Recorder == nil {
		d.opts.Recorder = mgr.GetEventRecorder("drover-hub")
	}
	noLeader := false
	err := ctrl.NewControllerManagedBy(mgr).Named("task-dispatch").
		For(&batchv1.Task{}).
		WithOptions(controller.Options{NeedLeaderElection: &noLeader, MaxConcurrentReconciles: 8}).
		Complete(d)
	if err != nil {
		return err
	}
	return mgr.Add(&writer{d: d, mgr: mgr})
}

// writer waits for the cache, then writes queued reports until ctx ends.
type writer struct {
	d   *Dispatcher
	mgr ctrl.Manager
}

func (w *writer) NeedLeaderElection() bool { return false }

func (w *writer) Start(ctx context.Context) error {
	if !w.mgr.GetCache().WaitForCacheSync(ctx) {
		return ctx.Err()
	}
	w.d.synced.Store(true)
	w.d.log.Info("task dispatcher ready")
	return w.d.runWriters(ctx)
}

// MaxSpecBytes bounds a task's work item. The API allows more (256
// arguments of 4 KiB), but every item of a node travels in one snapshot of
// at most protocol.MaxEnvelopeBytes: a few huge tasks must not keep their
// node from connecting. A task over it fails with ReasonSpecTooLarge.
const MaxSpecBytes = 64 << 10

// ReasonSpecTooLarge is the reason of a task whose work item is too large.
const ReasonSpecTooLarge = "SpecTooLarge"

// ReasonAgentTooOld is the reason of an attempt that was not sent because
// its node's agent does not name taskwire.FeatureRunAs: such an agent
// ignores the task's securityContext and runs every task as its own user,
// usually root, whatever the NodeGrants allow.
const ReasonAgentTooOld = "AgentTooOld"

// ErrAgentTooOld is wrapped by the error of an attempt whose node's agent
// is too old to run it (ReasonAgentTooOld).
var ErrAgentTooOld = errors.New("agent too old")

// canRun says why node's agent, connected through h, must get no task
// item: nil when it names taskwire.FeatureRunAs. Only tasks are gated;
// node jobs still reach an old agent, so that it can be upgraded.
func canRun(h hub.Link, node string) error {
	if h.Supports(node, taskwire.FeatureRunAs) {
		return nil
	}
	return fmt.Errorf("%w: the agent of node %s is older than this hub and would run the task as its own user (it does not name the %s feature); upgrade it with a NodeUpgradeJob",
		ErrAgentTooOld, node, taskwire.FeatureRunAs)
}

// ErrSpecTooLarge is wrapped by Item for a task over MaxSpecBytes.
var ErrSpecTooLarge = errors.New("work item too large")

// Item is the work item of a task's current attempt.
func Item(t *batchv1.Task) (*agentv1.WorkItem, error) {
	s := taskwire.Spec{
		Namespace: t.Namespace, Name: t.Name, Attempt: t.Status.Attempt,
		Command: t.Spec.Command, WorkingDir: t.Spec.WorkingDir,
	}
	if t.Spec.Driver == taskwire.DriverContainerd {
		s.Driver, s.Image = t.Spec.Driver, t.Spec.Image
	}
	if sc := t.Spec.SecurityContext; sc != nil {
		s.RunAsUser, s.RunAsGroup = sc.RunAsUser, sc.RunAsGroup
	}
	for _, e := range t.Spec.Env {
		s.Env = append(s.Env, e.Name+"="+e.Value)
	}
	for _, a := range t.Spec.Artifacts {
		s.Artifacts = append(s.Artifacts, taskwire.Artifact{URL: a.URL, SHA256: a.SHA256, Path: a.Path, Executable: a.Executable})
	}
	if t.Spec.Timeout != nil {
		// Up, not to the nearest: a timeout under half a second must not
		// become 0, which means none.
		s.TimeoutSeconds = int64((t.Spec.Timeout.Duration + time.Second - 1) / time.Second)
	}
	if q, ok := t.Spec.Resources[corev1.ResourceMemory]; ok {
		s.MemoryBytes = q.Value()
	}
	if q, ok := t.Spec.Resources[corev1.ResourceCPU]; ok {
		s.CPUMillis = q.MilliValue()
	}
	if t.Spec.KillTimeout != nil {
		s.KillTimeoutSeconds = int64((t.Spec.KillTimeout.Duration + time.Second - 1) / time.Second)
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	b, err := s.Encode()
	if err != nil {
		return nil, err
	}
	if len(b) > MaxSpecBytes {
		return nil, fmt.Errorf("%w: the task's command, env and artifacts make %d bytes, more than %d", ErrSpecTooLarge, len(b), MaxSpecBytes)
	}
	return &agentv1.WorkItem{Uid: taskwire.WorkID(string(t.UID), t.Status.Attempt), Type: s.Type(), Spec: b}, nil
}

// active reports whether t's current attempt belongs on its node.
func active(t *batchv1.Task) bool {
	return t.DeletionTimestamp == nil && t.Status.NodeName != "" && t.Status.Attempt >= 1 &&
		(t.Status.State == batchv1.TaskScheduled || t.Status.State == batchv1.TaskDispatching || t.Status.State == batchv1.TaskRunning)
}

// Ready implements hub.Readier: the tasks have loaded.
func (d *Dispatcher) Ready() bool { return d.synced.Load() }

// WorkFor implements hub.Feature: the current attempt of every task on
// node that is Scheduled, Dispatching or Running. The Scheduled ones are
// written Dispatching, as this snapshot sends them. An agent too old to
// run tasks safely (canRun) gets none: their attempts fail instead.
func (d *Dispatcher) WorkFor(ctx context.Context, node string) ([]*agentv1.WorkItem, error) {
	if !d.synced.Load() {
		// An empty list would make the agent cancel the tasks it runs.
		return nil, errors.New("tasks are still loading; reconnect shortly")
	}
	h := d.getHub()
	if h == nil {
		return nil, errors.New("the task dispatcher is not attached to a hub yet; reconnect shortly")
	}
	tooOld := canRun(h, node)
	var l batchv1.TaskList
	if err := d.opts.Client.List(ctx, &l, client.MatchingFields{IndexNodeName: node}); err != nil {
		return nil, fmt.Errorf("list tasks on node %s: %w", node, err)
	}
	out := make([]*agentv1.WorkItem, 0, len(l.Items))
	for i := range l.Items {
		t := &l.Items[i]
		if !active(t) {
			continue
		}
		if tooOld != nil {
			// Also one that runs already (sent before the agent was
			// replaced by an older one): the snapshot leaves it out, so
			// the agent cancels it, and its attempt ends here.
			d.cannotSend(t, tooOld)
			continue
		}
		it, err := Item(t)
		if err != nil {
			// Keep the node's other work going and say why this one does
			// not run.
			d.cannotSend(t, err)
			continue
		}
		out = append(out, it)
		d.recordSent(t, node, it.GetUid())
		if t.Status.State == batchv1.TaskScheduled {
			d.enqueue(t.UID, node, t.Status.Attempt, d.markDispatched)
		}
	}
	d.m.dispatched.Add(float64(len(out)))
	return out, nil
}

func (d *Dispatcher) recordSent(t *batchv1.Task, node, work string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sent[t.UID] = sent{key: client.ObjectKeyFromObject(t), node: node, work: work}
}

// WorkStatus implements hub.Feature.
func (d *Dispatcher) WorkStatus(_ context.Context, node string, st *agentv1.WorkStatus) {
	d.report(node, st, true)
}

// NodeState implements hub.Feature. A NodeState carries phases without
// the runner's report: it moves a task along (and ends it) when the
// statuses that carried the reports were lost.
func (d *Dispatcher) NodeState(_ context.Context, node string, work []*agentv1.WorkStatus) {
	for _, st := range work {
		d.report(node, st, false)
	}
}

func (d *Dispatcher) report(node string, st *agentv1.WorkStatus, full bool) {
	uid, attempt, ok := taskwire.ParseWorkID(st.GetUid())
	if !ok {
		return
	}
	var r taskwire.Report
	if full {
		var err error
		if r, err = taskwire.DecodeReport(st.GetMessage()); err != nil {
			// The phase still counts; the details are lost.
			d.log.Warn("task report is not a taskwire.Report", "node", node, "work", st.GetUid(), "err", err)
			r = taskwire.Report{Message: st.GetMessage()}
		}
	}
	d.m.reports.Inc()
	rp := report{phase: st.GetPhase(), reason: st.GetReason(), r: r, full: full}
	tuid := types.UID(uid)
	if final(rp.phase) {
		d.mu.Lock()
		_, deleting := d.cancelled[tuid]
		s, ours := d.sent[tuid]
		// Only the node the attempt was sent to ends it (the hub drops
		// other nodes' reports before they get here).
		if ours && s.node == node && s.work == st.GetUid() {
			d.ended[tuid] = st.GetUid()
		}
		key := s.key
		d.mu.Unlock()
		if deleting && key.Name != "" {
			select {
			case d.requeue <- key:
			default:
			}
		}
	}
	d.enqueue(tuid, node, attempt, func(p *pending) { p.reports = append(p.reports, rp) })
}

func final(phase string) bool {
	return phase == taskwire.PhaseSucceeded || phase == taskwire.PhaseFailed || phase == taskwire.PhaseCancelled
}

// markDispatched records in p that its attempt was sent now.
func (d *Dispatcher) markDispatched(p *pending) {
	if !p.dispatched {
		p.dispatched, p.since = true, d.opts.Clock.Now()
	}
	p.finalizer = true
}

// enqueue records a write for the task's attempt and wakes the task's
// writer. Writes for an older attempt than one already queued are dropped.
func (d *Dispatcher) enqueue(uid types.UID, node string, attempt int32, add func(*pending)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.queue[uid]
	switch {
	case p == nil || p.attempt < attempt:
		p = &pending{node: node, attempt: attempt}
		d.queue[uid] = p
	case p.attempt > attempt:
		return
	}
	add(p)
	d.wakeLocked(uid)
}

// wakeLocked wakes uid's writer, starting one if there is none. d.mu is held.
func (d *Dispatcher) wakeLocked(uid types.UID) {
	if d.run == nil {
		return // runWriters starts it
	}
	if wake, ok := d.writers[uid]; ok {
		select {
		case wake <- struct{}{}:
		default:
		}
		return
	}
	wake := make(chan struct{}, 1)
	d.writers[uid] = wake
	go d.writeTask(d.run, uid, wake)
}
