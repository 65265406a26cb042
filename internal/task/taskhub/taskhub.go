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

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
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

// ErrSpecTooLarge is wrapped by Item for a task over MaxSpecBytes.
var ErrSpecTooLarge = errors.New("work item too large")

// Item is the work item of a task's current attempt.
func Item(t *batchv1.Task) (*agentv1.WorkItem, error) {
	s := taskwire.Spec{
		Namespace: t.Namespace, Name: t.Name, Attempt: t.Status.Attempt,
		Command: t.Spec.Command, WorkingDir: t.Spec.WorkingDir,
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
	return &agentv1.WorkItem{Uid: taskwire.WorkID(string(t.UID), t.Status.Attempt), Type: taskwire.TypeExec, Spec: b}, nil
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
// written Dispatching, as this snapshot sends them.
func (d *Dispatcher) WorkFor(ctx context.Context, node string) ([]*agentv1.WorkItem, error) {
	if !d.synced.Load() {
		// An empty list would make the agent cancel the tasks it runs.
		return nil, errors.New("tasks are still loading; reconnect shortly")
	}
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

// Reconcile implements reconcile.Reconciler for Tasks: it dispatches a
// Scheduled attempt to its node if the node is connected here, cancels a
// superseded attempt, and stops a deleted task's process.
func (d *Dispatcher) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var t batchv1.Task
	if err := d.opts.Client.Get(ctx, req.NamespacedName, &t); err != nil {
		if apierrors.IsNotFound(err) {
			d.forget(req.NamespacedName)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	if t.DeletionTimestamp != nil {
		return d.cleanup(ctx, &t)
	}
	h := d.getHub()
	if h == nil || !d.synced.Load() {
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	work := ""
	if t.Status.Attempt >= 1 {
		work = taskwire.WorkID(string(t.UID), t.Status.Attempt)
	}
	d.mu.Lock()
	prev, had := d.sent[t.UID]
	d.mu.Unlock()
	if had && prev.work != work && h.Connected(prev.node) {
		// The manager moved on (a restart, a reschedule): the old attempt
		// leaves the node's list, and the node stops it now, not on its
		// next snapshot.
		if err := h.Cancel(prev.node, prev.work); err == nil {
			d.m.cancels.Inc()
			d.log.Info("cancelled a superseded attempt", "task", req.NamespacedName, "node", prev.node, "work", prev.work)
		}
		d.mu.Lock()
		delete(d.sent, t.UID)
		d.mu.Unlock()
	}
	if t.Status.State.Final() && had && prev.work == work {
		d.mu.Lock()
		delete(d.sent, t.UID)
		delete(d.ended, t.UID)
		d.mu.Unlock()
	}
	if t.Status.State != batchv1.TaskScheduled || !active(&t) || !h.Connected(t.Status.NodeName) {
		return reconcile.Result{}, nil
	}
	if had && prev.work == work {
		return reconcile.Result{}, nil // sent; its Dispatching write is queued
	}
	it, err := Item(&t)
	if err != nil {
		d.cannotSend(&t, err)
		return reconcile.Result{}, nil
	}
	// Sent first, the finalizer after (the task's writer adds it
	// FlushInterval later if the attempt still runs): a round trip to the
	// apiserver less between Scheduled and the process starting, and none
	// at all for a short task. A Task deleted before its
	// finalizer lands is cancelled by forget, and in any case the node's
	// next snapshot no longer holds it.
	if err := h.Dispatch(t.Status.NodeName, it); err != nil {
		// The stream just closed: the node's next snapshot carries it.
		d.log.Warn("dispatch failed; the node's next connect carries it", "task", req.NamespacedName, "node", t.Status.NodeName, "err", err)
		return reconcile.Result{}, nil
	}
	d.m.dispatched.Inc()
	d.recordSent(&t, t.Status.NodeName, it.GetUid())
	d.enqueue(t.UID, t.Status.NodeName, t.Status.Attempt, d.markDispatched)
	return reconcile.Result{}, nil
}

// cannotSend fails the current attempt of a task whose work item cannot
// be built.
func (d *Dispatcher) cannotSend(t *batchv1.Task, err error) {
	d.log.Error("task cannot be sent", "task", client.ObjectKeyFromObject(t), "err", err)
	reason := taskwire.ReasonStartError
	if errors.Is(err, ErrSpecTooLarge) {
		reason = ReasonSpecTooLarge
	}
	d.enqueue(t.UID, t.Status.NodeName, t.Status.Attempt, func(p *pending) {
		p.reports = append(p.reports, report{phase: taskwire.PhaseFailed, reason: reason, r: taskwire.Report{Message: err.Error()}, full: true})
	})
}

// forget drops what is known of a task that is gone.
func (d *Dispatcher) forget(key types.NamespacedName) {
	var stop []sent
	d.mu.Lock()
	for uid, s := range d.sent {
		if s.key == key {
			// Gone without our finalizer (deleted between the send and
			// the finalizer's write): stop what it started.
			if w, ok := d.ended[uid]; !ok || w != s.work {
				stop = append(stop, s)
			}
			d.rememberGoneLocked(s.work, s.node)
			delete(d.sent, uid)
			delete(d.cancelled, uid)
			delete(d.ended, uid)
			delete(d.queue, uid)
			delete(d.latest, uid)
		}
	}
	d.mu.Unlock()
	h := d.getHub()
	for _, s := range stop {
		if h != nil && h.Connected(s.node) {
			if err := h.Cancel(s.node, s.work); err == nil {
				d.m.cancels.Inc()
				d.log.Info("cancelled the attempt of a task that is gone", "task", key, "node", s.node, "work", s.work)
			}
		}
	}
}

// cleanup stops a deleted task's attempt and then lets it go.
func (d *Dispatcher) cleanup(ctx context.Context, t *batchv1.Task) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(t, FinalizerCleanup) {
		return reconcile.Result{}, nil
	}
	node := t.Status.NodeName
	work := taskwire.WorkID(string(t.UID), max(t.Status.Attempt, 1))
	h := d.getHub()
	d.mu.Lock()
	cancelledAt, cancelled := d.cancelled[t.UID]
	ended := d.ended[t.UID] == work
	d.mu.Unlock()
	now := d.opts.Clock.Now()
	deadline := t.DeletionTimestamp.Add(d.opts.CleanupTimeout)

	switch {
	case t.Status.State.Final() || node == "" || t.Status.Attempt < 1:
		return d.release(ctx, t, "the attempt had ended")
	case ended:
		return d.release(ctx, t, fmt.Sprintf("node %s confirmed attempt %d stopped", node, t.Status.Attempt))
	case h != nil && h.Connected(node):
		if !cancelled {
			if err := h.Cancel(node, work); err != nil {
				d.log.Warn("cancel failed; retrying", "task", client.ObjectKeyFromObject(t), "node", node, "err", err)
				return reconcile.Result{RequeueAfter: time.Second}, nil
			}
			d.m.cancels.Inc()
			d.mu.Lock()
			d.cancelled[t.UID] = now
			if _, ok := d.sent[t.UID]; !ok {
				d.sent[t.UID] = sent{key: client.ObjectKeyFromObject(t), node: node, work: work}
			}
			d.mu.Unlock()
			cancelledAt = now
			d.event(t, corev1.EventTypeNormal, batchv1.ReasonCancelled, "Cancel", "task deleted: asked node %s to stop attempt %d", node, t.Status.Attempt)
		}
	default:
		var fn fleetv1.FleetNode
		err := d.opts.APIReader.Get(ctx, client.ObjectKey{Name: node}, &fn)
		switch {
		case apierrors.IsNotFound(err):
			return d.release(ctx, t, fmt.Sprintf("node %s no longer exists", node))
		case err != nil:
			return reconcile.Result{}, err
		case fn.Status.Phase != fleetv1.FleetNodeOnline || fn.Status.Hub == "" || (h != nil && fn.Status.Hub == h.HubName()):
			// Its agent cancels the attempt when its next snapshot (on
			// reconnect, to whichever hub) leaves it out. (Online on this
			// hub without a stream: it left, and is not Offline yet.)
			return d.release(ctx, t, fmt.Sprintf("node %s is not connected to any hub (its FleetNode is %s); it stops the attempt when it reconnects", node, fn.Status.Phase))
		}
		// Another hub serves the node and cancels it; wait for it, up to
		// the timeout.
	}
	if !now.Before(deadline) {
		d.event(t, corev1.EventTypeWarning, ReasonCleanup, "Cleanup", "node %s did not confirm attempt %d stopped within %s (cancel sent %s); letting the task go",
			node, t.Status.Attempt, d.opts.CleanupTimeout, sinceOr(cancelledAt, now))
		return d.release(ctx, t, "cleanup timed out")
	}
	wait := min(deadline.Sub(now), 5*time.Second)
	return reconcile.Result{RequeueAfter: wait}, nil
}

func sinceOr(t, now time.Time) string {
	if t.IsZero() {
		return "by another hub"
	}
	return now.Sub(t).Round(time.Second).String() + " ago"
}

// release removes the finalizer.
func (d *Dispatcher) release(ctx context.Context, t *batchv1.Task, why string) (reconcile.Result, error) {
	patch := client.MergeFromWithOptions(t.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(t, FinalizerCleanup)
	if err := d.opts.Client.Patch(ctx, t, patch); err != nil {
		if apierrors.IsConflict(err) {
			d.m.conflicts.Inc()
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	d.log.Info("deleted task released", "task", client.ObjectKeyFromObject(t), "why", why)
	d.event(t, corev1.EventTypeNormal, ReasonCleanedUp, "Cleanup", "%s", why)
	d.forget(client.ObjectKeyFromObject(t))
	return reconcile.Result{}, nil
}

func (d *Dispatcher) event(t *batchv1.Task, typ, reason, action, note string, args ...any) {
	if d.opts.Recorder != nil {
		d.opts.Recorder.Eventf(t, nil, typ, reason, action, note, args...)
	}
}

// writeParallelism bounds the task writes in flight at once. Tasks are
// independent objects: a burst of short tasks is written side by side, not
// one at a time behind the apiserver's latency.
const writeParallelism = 16

// latestTTL is how long a write's result is preferred to an older cache
// copy; the cache catches up well within it.
const latestTTL = 10 * time.Second

// runWriters starts the writers of what was queued before the cache
// loaded, then serves deleted tasks waiting for their end and forgets old
// write results, until ctx ends.
func (d *Dispatcher) runWriters(ctx context.Context) error {
	d.mu.Lock()
	d.run = ctx
	for uid := range d.queue {
		d.wakeLocked(uid)
	}
	d.mu.Unlock()
	sweep := d.opts.Clock.NewTicker(latestTTL)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case key := <-d.requeue:
			var t batchv1.Task
			if err := d.opts.APIReader.Get(ctx, key, &t); err == nil && t.DeletionTimestamp != nil {
				if _, err := d.cleanup(ctx, &t); err != nil {
					d.log.Warn("clean up deleted task", "task", key, "err", err)
				}
			}
		case now := <-sweep.Chan():
			d.mu.Lock()
			for uid, w := range d.latest {
				if now.Sub(w.at) > latestTTL {
					delete(d.latest, uid)
				}
			}
			d.mu.Unlock()
		}
	}
}

// writeTask writes what is queued for task uid until nothing is: an
// agent's report at once (what arrives while a write is in flight goes
// into the next one); a dispatch alone after FlushInterval, since the
// agent's Running report usually comes within it and one write then
// carries both; and then the finalizer of an attempt still running, beside
// the status writes.
func (d *Dispatcher) writeTask(ctx context.Context, uid types.UID, wake chan struct{}) {
	for {
		d.mu.Lock()
		p := d.queue[uid]
		if p == nil || ctx.Err() != nil {
			delete(d.writers, uid)
			d.mu.Unlock()
			return
		}
		statusDue := len(p.reports) > 0 || (p.dispatched && d.opts.Clock.Since(p.since) >= d.opts.FlushInterval)
		d.mu.Unlock()
		held := false
		if statusDue {
			// A slot first, then what is due: what arrives while all slots
			// are busy goes into this task's next write, so that under load
			// (a burst, the apiserver's pace) its reports share writes.
			select {
			case d.slots <- struct{}{}:
				held = true
			case <-ctx.Done():
				continue
			}
		}
		d.mu.Lock()
		take, wait := d.takeDue(uid)
		d.mu.Unlock()
		if take.finalizer {
			// Beside the status writes: the Running write must not wait
			// for it, and does not conflict with it (see writeStatus).
			go d.finalize(ctx, uid, take.node, take.attempt)
			take.finalizer = false
		}
		if take.empty() {
			if held {
				<-d.slots
			}
			select {
			case <-ctx.Done():
			case <-wake:
			case <-d.opts.Clock.After(wait):
			}
			continue
		}
		if !held {
			d.slots <- struct{}{} // a report came after the check
		}
		err := d.writeStatus(ctx, uid, take)
		<-d.slots
		if err == nil {
			continue
		}
		d.log.Error("write task status", "uid", uid, "node", take.node, "attempt", take.attempt, "err", err)
		// Keep it for the next try, unless a newer attempt came.
		d.mu.Lock()
		switch q := d.queue[uid]; {
		case q == nil:
			d.queue[uid] = take
		case q.attempt == take.attempt:
			take.merge(q)
			d.queue[uid] = take
		}
		d.mu.Unlock()
		// Try again after a pause, not at once.
		select {
		case <-ctx.Done():
		case <-d.opts.Clock.After(time.Second):
		}
	}
}

// takeDue takes from uid's queue what is due to be written now, and says
// how long until the rest is. d.mu is held.
func (d *Dispatcher) takeDue(uid types.UID) (take *pending, wait time.Duration) {
	p := d.queue[uid]
	if p == nil {
		return &pending{}, 0
	}
	take = &pending{node: p.node, attempt: p.attempt}
	elapsed := d.opts.Clock.Since(p.since)
	ready := elapsed >= d.opts.FlushInterval
	if len(p.reports) > 0 || (p.dispatched && ready) {
		take.dispatched, take.since, take.reports = p.dispatched, p.since, p.reports
		p.dispatched, p.reports = false, nil
	}
	if p.finalizer && ready {
		take.finalizer, p.finalizer = true, false
	}
	if (p.dispatched || p.finalizer) && !ready {
		wait = d.opts.FlushInterval - elapsed
	}
	if p.empty() {
		delete(d.queue, uid)
	}
	return take, wait
}

// current is the newest copy of task uid this hub knows: the cache's, or
// its own last write's while the cache has not caught up with it. It is
// nil when the cache does not hold the task.
func (d *Dispatcher) current(ctx context.Context, uid types.UID) (*batchv1.Task, error) {
	var l batchv1.TaskList
	if err := d.opts.Client.List(ctx, &l, client.MatchingFields{IndexUID: string(uid)}); err != nil {
		return nil, err
	}
	if len(l.Items) == 0 {
		return nil, nil // gone, or not in the cache yet (it was just created: the agent cannot report on it yet)
	}
	t := &l.Items[0]
	d.mu.Lock()
	w, ok := d.latest[uid]
	d.mu.Unlock()
	if ok && newer(w.task.ResourceVersion, t.ResourceVersion) {
		return w.task.DeepCopy(), nil
	}
	return t.DeepCopy(), nil
}

// newer reports whether resource version a is after b. Versions are
// opaque to clients; etcd's are numbers, and anything else is not newer
// (the cache's copy is used, and a conflict reads afresh).
func newer(a, b string) bool {
	x, errA := strconv.ParseUint(a, 10, 64)
	y, errB := strconv.ParseUint(b, 10, 64)
	return errA == nil && errB == nil && x > y
}

// remember keeps what a write to t returned.
func (d *Dispatcher) remember(t *batchv1.Task) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.sent[t.UID]; ok || d.queue[t.UID] != nil || d.writers[t.UID] != nil {
		d.latest[t.UID] = written{task: t.DeepCopy(), at: d.opts.Clock.Now()}
	}
}

// writeStatus applies p to the status of the task with uid. The patch
// tests the state, attempt and node it was made from instead of the
// resource version: a write to the task's metadata in between (its
// finalizer) does not make it fail. A failed test or any other error is
// tried again on a fresh read, with the resource version.
func (d *Dispatcher) writeStatus(ctx context.Context, uid types.UID, p *pending) error {
	t, err := d.current(ctx, uid)
	if err != nil || t == nil {
		return err
	}
	key := client.ObjectKeyFromObject(t)
	hub := ""
	if h := d.getHub(); h != nil {
		hub = h.HubName()
	}
	orig := t.DeepCopy()
	if !applyReports(t, p, hub, d.opts.Clock.Now()) {
		return nil
	}
	patch, err := statusPatch(&orig.Status, &t.Status)
	if err == nil {
		if err = d.opts.Client.Status().Patch(ctx, t, client.RawPatch(types.JSONPatchType, patch)); err == nil {
			d.m.writes.Inc()
			d.remember(t)
			d.failedEvent(orig, t)
			return nil
		}
	}
	if apierrors.IsNotFound(err) || ctx.Err() != nil {
		return nil
	}
	d.m.conflicts.Inc()
	return client.IgnoreNotFound(retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		t = &batchv1.Task{}
		if err := d.opts.APIReader.Get(ctx, key, t); err != nil || t.UID != uid {
			return err
		}
		orig := t.DeepCopy()
		if !applyReports(t, p, hub, d.opts.Clock.Now()) {
			return nil
		}
		if err := d.opts.Client.Status().Patch(ctx, t, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
			if apierrors.IsConflict(err) {
				d.m.conflicts.Inc()
			}
			return err
		}
		d.m.writes.Inc()
		d.remember(t)
		d.failedEvent(orig, t)
		return nil
	}))
}

// failedEvent records a Warning Event on a task whose attempt this write
// ended Failed, so that `kubectl describe task` says why even when no
// restart follows (the manager records restarts and the final give-up).
// Completions get none: they are the common case, and each Event is one
// more apiserver write.
func (d *Dispatcher) failedEvent(before, after *batchv1.Task) {
	if before.Status.State == batchv1.TaskFailed || after.Status.State != batchv1.TaskFailed {
		return
	}
	st := &after.Status
	note := fmt.Sprintf("attempt %d on node %s failed: %s", st.Attempt, st.NodeName, st.Reason)
	if st.ExitCode != nil {
		note += fmt.Sprintf(", exit code %d", *st.ExitCode)
	}
	if st.Message != "" {
		note += " (" + clipNote(st.Message) + ")"
	}
	d.event(after, corev1.EventTypeWarning, "Failed", "Run", "%s", note)
}

// clipNote keeps an Event's note short: the full message is in the status.
func clipNote(s string) string {
	const max = 256
	if len(s) <= max {
		return s
	}
	return strings.ToValidUTF8(s[:max], "") + "…"
}

// statusPatch is a JSON patch from status a to b that applies only while
// the state, attempt and node are still a's: what apply decided from.
func statusPatch(a, b *batchv1.TaskStatus) ([]byte, error) {
	var am, bm map[string]json.RawMessage
	for _, x := range []struct {
		st  *batchv1.TaskStatus
		out *map[string]json.RawMessage
	}{{a, &am}, {b, &bm}} {
		raw, err := json.Marshal(x.st)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(raw, x.out); err != nil {
			return nil, err
		}
	}
	type op struct {
		Op    string          `json:"op"`
		Path  string          `json:"path"`
		Value json.RawMessage `json:"value,omitempty"`
	}
	null := json.RawMessage("null")
	var ops []op
	for _, k := range []string{"state", "attempt", "nodeName"} {
		v, ok := am[k]
		if !ok {
			v = null // absent: a test of null passes only while it is absent
		}
		ops = append(ops, op{Op: "test", Path: "/status/" + k, Value: v})
	}
	keys := make([]string, 0, len(bm))
	for k := range bm {
		keys = append(keys, k)
	}
	slices.Sort(keys) // one patch for one change
	for _, k := range keys {
		if !bytes.Equal(am[k], bm[k]) {
			ops = append(ops, op{Op: "add", Path: "/status/" + k, Value: bm[k]})
		}
	}
	for k := range am {
		if _, ok := bm[k]; !ok {
			ops = append(ops, op{Op: "remove", Path: "/status/" + k})
		}
	}
	return json.Marshal(ops)
}

// finalize adds FinalizerCleanup to a task whose attempt was sent, so that
// deleting it stops the process first. It tries again until it is written
// or the attempt is over.
func (d *Dispatcher) finalize(ctx context.Context, uid types.UID, node string, attempt int32) {
	d.slots <- struct{}{}
	err := d.addFinalizer(ctx, uid, node, attempt)
	<-d.slots
	if err == nil || ctx.Err() != nil {
		return
	}
	d.log.Error("add the task's finalizer", "uid", uid, "node", node, "attempt", attempt, "err", err)
	select {
	case <-ctx.Done():
	case <-d.opts.Clock.After(time.Second):
		d.enqueue(uid, node, attempt, func(p *pending) { p.finalizer = true })
	}
}

func (d *Dispatcher) addFinalizer(ctx context.Context, uid types.UID, node string, attempt int32) error {
	t, err := d.current(ctx, uid)
	if err != nil || t == nil {
		return err
	}
	key := client.ObjectKeyFromObject(t)
	first := true
	return client.IgnoreNotFound(retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		if !first {
			d.m.conflicts.Inc()
			t = &batchv1.Task{}
			if err := d.opts.APIReader.Get(ctx, key, t); err != nil {
				return err
			}
		}
		first = false
		if t.UID != uid || t.DeletionTimestamp != nil || controllerutil.ContainsFinalizer(t, FinalizerCleanup) {
			return nil
		}
		if t.Status.Attempt != attempt || t.Status.NodeName != node || !active(t) {
			return nil // the attempt is over: nothing of it to stop
		}
		patch := client.MergeFromWithOptions(t.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.AddFinalizer(t, FinalizerCleanup)
		if err := d.opts.Client.Patch(ctx, t, patch); err != nil {
			return err
		}
		d.remember(t)
		return nil
	}))
}

// applyReports is apply on t's status, with the Complete and Failed
// conditions set to match an end it wrote (in the same write).
func applyReports(t *batchv1.Task, p *pending, hub string, now time.Time) bool {
	if !apply(&t.Status, p, hub, now) {
		return false
	}
	batchv1.SetEndConditions(t, false, now)
	return true
}

// apply moves st along by what p says of attempt p.attempt on p.node, and
// reports whether it changed. Anything about another attempt or node is
// ignored; a task never moves back.
func apply(st *batchv1.TaskStatus, p *pending, hub string, now time.Time) bool {
	if st.Attempt != p.attempt || st.NodeName != p.node {
		return false
	}
	changed := false
	set := func(s batchv1.TaskState, reason, msg string) {
		st.State, st.Reason, st.Message = s, reason, msg
		changed = true
	}
	if p.dispatched && st.State == batchv1.TaskScheduled {
		set(batchv1.TaskDispatching, ReasonDispatched, fmt.Sprintf("sent to node %s by hub %s", p.node, hub))
	}
	for _, rp := range p.reports {
		switch rp.phase {
		case agentPending:
			if st.State == batchv1.TaskScheduled {
				set(batchv1.TaskDispatching, ReasonDispatched, fmt.Sprintf("node %s has it", p.node))
			}
		case taskwire.PhaseRunning:
			if st.State == batchv1.TaskScheduled || st.State == batchv1.TaskDispatching {
				set(batchv1.TaskRunning, ReasonStarted, rp.r.Message)
			}
			changed = setTime(&st.StartTime, rp.r.StartTime) || changed
		case taskwire.PhaseSucceeded, taskwire.PhaseFailed, taskwire.PhaseCancelled:
			s, reason := batchv1.TaskFailed, rp.reason
			if rp.phase == taskwire.PhaseSucceeded {
				s, reason = batchv1.TaskCompleted, ReasonCompleted
			}
			msg := rp.r.Message
			if reason == "" {
				reason = rp.phase
			} else if strings.ContainsAny(reason, " :") {
				// A sentence (the agent's own, e.g. after a restart): the
				// reason stays a word, the sentence goes into the message.
				if msg == "" {
					msg = reason
				}
				reason = rp.phase
			}
			switch {
			case !st.State.Final():
				set(s, reason, msg)
				if st.FinishTime == nil && rp.r.FinishTime == "" {
					t := metav1.NewTime(now)
					st.FinishTime = &t
				}
			case st.State != s || !rp.full:
				continue
			}
			// A report after a NodeState's bare phase fills in the details.
			changed = setTime(&st.StartTime, rp.r.StartTime) || changed
			changed = setTime(&st.FinishTime, rp.r.FinishTime) || changed
			if rp.r.ExitCode != nil && (st.ExitCode == nil || *st.ExitCode != *rp.r.ExitCode) {
				st.ExitCode = rp.r.ExitCode
				changed = true
			} else if rp.phase == taskwire.PhaseSucceeded && st.ExitCode == nil {
				zero := int32(0)
				st.ExitCode = &zero
				changed = true
			}
			if rp.r.OutputTail != "" && st.OutputTail != rp.r.OutputTail {
				st.OutputTail = rp.r.OutputTail
				changed = true
			}
			if rp.r.Message != "" && st.Message != rp.r.Message {
				st.Message = rp.r.Message
				changed = true
			}
		}
	}
	return changed
}

// agentPending is the phase of an item the agent holds but has not started.
const agentPending = "Pending"

// setTime sets *dst from an RFC 3339 string if it differs; it reports
// whether it changed.
func setTime(dst **metav1.Time, s string) bool {
	if s == "" {
		return false
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return false
	}
	// The API keeps seconds.
	if *dst != nil && (*dst).Time.Truncate(time.Second).Equal(t.Truncate(time.Second)) {
		return false
	}
	mt := metav1.NewTime(t)
	*dst = &mt
	return true
}

// LogTarget implements hub.LogFinder: it finds the node and work id of
// attempt (0: the current one) of the task namespace/name, for the hub's
// TaskLogs.
func (d *Dispatcher) LogTarget(ctx context.Context, namespace, name string, attempt int32) (node, uid string, err error) {
	var t batchv1.Task
	if err := d.opts.APIReader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &t); err != nil {
		return "", "", err
	}
	node, err = batchv1.AttemptNode(&t, attempt)
	if err != nil {
		return "", "", status.Error(codes.FailedPrecondition, err.Error())
	}
	if attempt == 0 {
		attempt = t.Status.Attempt
	}
	return node, taskwire.WorkID(string(t.UID), attempt), nil
}
