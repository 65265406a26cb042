// Package nodejobhub is a hub's part of node jobs: it dispatches the nodes
// the manager admitted (InProgress in a NodeTaskSlice) to the agents
// connected to this hub, and writes the agents' reports back into the
// slices in coalesced batches.
//
// A report that changes a node's phase, or puts it at Confirm (waiting),
// is written at the next flush (FlushInterval). Other action reports (an
// action ended, the flow goes on) wait up to HoldInterval, or until half
// the job's timeoutSeconds after the entry's last update if that is sooner,
// and ride along with the node's next write: a node whose actions end
// within a few seconds of each other costs one slice write, not one per
// action. An entry's updateTime is when the hub received the report that
// last changed it, so the manager's timeout counts from the node's last
// report, however late it was written.
//
// Every hub runs one; none needs to be the leader. A node's work is the
// job's uid, so whichever hub the node is connected to sends it, and a node
// that moves hubs gets it again in the new hub's snapshot (WorkFor); the
// agent applies a uid once.
//
// Concurrency is decided by the manager, which admits at most
// spec.concurrency nodes across all hubs; timeouts too (a hub that dies
// must not leave nodes InProgress forever).
package nodejobhub

//go:generate go run github.com/drover-fleet/drover/cmd/ctrlkit gen -o zz_generated.ctrlkit.go nodejobhub.ctrlkit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/pkg/ctrlkit"
)

// Options configure an Executor.
type Options struct {
	// Client reads jobs and slices (cached) and writes slices.
	Client client.Client
	// APIReader reads slices afresh on a write conflict, and Secrets.
	APIReader client.Reader
	// FlushInterval is how long reports are gathered before a write. Default 250ms.
	FlushInterval time.Duration
	// HoldInterval is how long a report that changes neither the node's
	// phase nor puts it at Confirm may wait for the node's next
	// write. Default 5s.
	HoldInterval time.Duration
	Logger       *slog.Logger
	Registerer   prometheus.Registerer
	// Clock stamps reports and times flushes. Default: the wall clock.
	Clock clock.Clock
}

type jobRef struct {
	kind, name string
	uid        types.UID
	// timeout is the job's timeoutSeconds: the manager marks Unknown a
	// node whose entry has not changed for that long.
	timeout time.Duration
}

// nodeRef is where a node's entry is and when it last changed.
type nodeRef struct {
	slice string
	// since is the entry's updateTime as this executor last saw or wrote it.
	since time.Time
}

type report struct {
	phase string
	r     nodejobwire.Report
	at    time.Time // when the hub received it
}

// urgent reports whether a node's reports must be written at the next
// flush: they change its phase, or it waits for an operator.
func urgent(rs []report) bool {
	for _, rp := range rs {
		if rp.phase != nodejobwire.PhaseRunning || nodejobwire.Waits(rp.r.Action) {
			return true
		}
	}
	return false
}

// Executor is the hub feature of node jobs.
type Executor struct {
	opts Options
	log  *slog.Logger
	hub  atomic.Pointer[hub.Link]

	mu sync.Mutex
	// want: node → uid → the item the node should hold (InProgress entries).
	want map[string]map[string]*agentv1.WorkItem
	// jobs: uid → the job, for reports and deletions.
	jobs map[string]jobRef
	// where: uid → node → its slice, to batch writes.
	where map[string]map[string]nodeRef
	// queue: uid → node → reports not written yet, in arrival order.
	queue map[string]map[string][]report
	// written: slice name → the slice as this executor last wrote it.
	written map[string]*opsv1.NodeTaskSlice
	synced  atomic.Bool
	kick    chan struct{}

	writes, reports prometheus.Counter
}

var (
	_ hub.Feature = (*Executor)(nil)
	_ hub.Readier = (*Executor)(nil)
)

// New returns an executor; hub.New attaches it to its hub.
func New(opts Options) *Executor {
	if opts.FlushInterval <= 0 {
		opts.FlushInterval = 250 * time.Millisecond
	}
	if opts.HoldInterval <= 0 {
		opts.HoldInterval = 5 * time.Second
	}
	if opts.APIReader == nil {
		opts.APIReader = opts.Client
	}
	opts.Clock = clock.Or(opts.Clock)
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	e := &Executor{
		opts: opts, log: opts.Logger,
		want: map[string]map[string]*agentv1.WorkItem{}, jobs: map[string]jobRef{},
		where: map[string]map[string]nodeRef{}, queue: map[string]map[string][]report{}, written: map[string]*opsv1.NodeTaskSlice{},
		kick:    make(chan struct{}, 1),
		writes:  prometheus.NewCounter(prometheus.CounterOpts{Name: "drover_hub_nodejob_slice_writes_total", Help: "NodeTaskSlice writes by this hub's node job executor."}),
		reports: prometheus.NewCounter(prometheus.CounterOpts{Name: "drover_hub_nodejob_reports_total", Help: "Node job action reports received from agents."}),
	}
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(e.writes, e.reports)
	}
	return e
}

// Name implements hub.Feature.
func (e *Executor) Name() string { return "nodejob" }

// Owns implements hub.Feature: the uids of the node jobs this executor
// indexed, and their confirmations. A job's work uid is the job's uid.
func (e *Executor) Owns(uid string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.jobs[uid]; ok {
		return true
	}
	job, ok := strings.CutSuffix(uid, nodejobwire.ConfirmUID(""))
	_, known := e.jobs[job]
	return ok && known
}

// Assigned implements hub.Feature: a node job's uid, or its confirmation's,
// is node's when the job's slices hold an entry for node (the entry is
// indexed before the item is sent). Only that node reports on it: another
// node's report would be queued for an entry it has not, or written into
// one that is not its own.
func (e *Executor) Assigned(_ context.Context, node, uid string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.inJobLocked(node, uid)
}

// inJobLocked reports whether uid is a node job's (or its confirmation's)
// whose slices hold node. e.mu is held.
func (e *Executor) inJobLocked(node, uid string) bool {
	job := uid
	if _, ok := e.jobs[uid]; !ok {
		var confirm bool
		if job, confirm = strings.CutSuffix(uid, nodejobwire.ConfirmUID("")); !confirm {
			return false
		}
		if _, ok := e.jobs[job]; !ok {
			return false
		}
	}
	_, ok := e.where[job][node]
	return ok
}

// Attach implements hub.Feature: the executor sends work through l.
func (e *Executor) Attach(l hub.Link) { e.hub.Store(&l) }

// SetupWithManager registers the slice controller (on every hub, without
// leader election) and the report writer.
func (e *Executor) SetupWithManager(mgr ctrl.Manager) error {
	noLeader := false
	mapJob := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, obj client.Object) []reconcile.Request {
		var l opsv1.NodeTaskSliceList
		// Only the names are read: no deep copy of every slice.
		if err := e.opts.Client.List(ctx, &l, client.MatchingLabels{opsv1.LabelJobUID: string(obj.GetUID())}, client.UnsafeDisableDeepCopy); err != nil {
			return nil
		}
		out := make([]reconcile.Request, 0, len(l.Items))
		for _, s := range l.Items {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: s.Name}})
		}
		// A deleted job: forget its work.
		if obj.GetDeletionTimestamp() != nil || len(out) == 0 {
			e.forgetJob(string(obj.GetUID()))
		}
		return out
	})
	// What a node gets depends on the job's spec (confirmations, abort),
	// never on its status: the manager's status writes (one per slice
	// write) would re-index every slice of the job each time.
	specOnly := builder.WithPredicates(predicate.GenerationChangedPredicate{})
	err := ctrl.NewControllerManagedBy(mgr).Named("nodejob-executor").
		For(&opsv1.NodeTaskSlice{}).
		Watches(&opsv1.NodeUpgradeJob{}, mapJob, specOnly).
		Watches(&opsv1.ImagePrePullJob{}, mapJob, specOnly).
		WithOptions(controller.Options{NeedLeaderElection: &noLeader, MaxConcurrentReconciles: 2}).
		Complete(e.reconciler())
	if err != nil {
		return err
	}
	return mgr.Add(&runner{e: e, mgr: mgr})
}

// runner loads the index once the cache is ready, then writes reports.
type runner struct {
	e   *Executor
	mgr ctrl.Manager
}

func (r *runner) NeedLeaderElection() bool { return false }

func (r *runner) Start(ctx context.Context) error {
	if !r.mgr.GetCache().WaitForCacheSync(ctx) {
		return ctx.Err()
	}
	var l opsv1.NodeTaskSliceList
	if err := r.e.opts.Client.List(ctx, &l); err != nil {
		return fmt.Errorf("node job executor: list slices: %w", err)
	}
	for i := range l.Items {
		if _, err := r.e.index(ctx, &l.Items[i]); err != nil {
			return fmt.Errorf("node job executor: %w", err)
		}
	}
	r.e.synced.Store(true)
	r.e.resend()
	r.e.log.Info("node job executor ready", "slices", len(l.Items))
	return r.e.writeLoop(ctx)
}

// Reconcile implements reconcile.Reconciler for NodeTaskSlices, through
// the reconciler generated from nodejobhub.ctrlkit (Workflow).
func (e *Executor) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	return e.reconciler().Reconcile(ctx, req)
}

func (e *Executor) reconciler() *NodeJobExecutorReconciler {
	return &NodeJobExecutorReconciler{
		Client: e.opts.Client,
		NewImpl: func(_ client.Client, s *opsv1.NodeTaskSlice) NodeJobExecutorImpl {
			return &sliceRun{e: e, slice: s}
		},
		Workflow: func(m *NodeJobExecutor, _ *opsv1.NodeTaskSlice) ctrlkit.Action {
			return Workflow(m, e.synced.Load())
		},
	}
}

// Workflow is the executor's workflow for one slice: index what its
// InProgress nodes should hold, then, once the executor has loaded every
// slice (synced), send what changed to the nodes connected here. Before
// that, agents cannot connect (WorkFor refuses them) and the loader sends
// everything at once (resend). Sequential: a slice of a job that is gone
// exits after IndexSlice, with nothing to send.
func Workflow(m *NodeJobExecutor, synced bool) ctrlkit.Action {
	return ctrlkit.Sequential(m.IndexSlice(), ctrlkit.If(synced, m.SendWork()))
}

// sliceRun implements NodeJobExecutorImpl for one reconcile of slice.
type sliceRun struct {
	e     *Executor
	slice *opsv1.NodeTaskSlice
	plan  *plan
}

var _ NodeJobExecutorImpl = (*sliceRun)(nil)

// IndexSlice implements NodeJobExecutorImpl.
func (r *sliceRun) IndexSlice(ctx context.Context, _ logr.Logger) (reconcile.Result, error) {
	p, err := r.e.index(ctx, r.slice)
	if err != nil {
		return ctrlkit.RequeueIfErrorAndWrap("index NodeTaskSlice "+r.slice.Name, err)
	}
	if p == nil {
		return ctrlkit.Exit() // the job is gone; its work was forgotten
	}
	r.plan = p
	return ctrlkit.NoRequeue()
}

// SendWork implements NodeJobExecutorImpl.
func (r *sliceRun) SendWork(context.Context, logr.Logger) (reconcile.Result, error) {
	r.e.send(r.plan)
	return ctrlkit.NoRequeue()
}

// plan is what indexing a slice found to do at the nodes connected here.
type plan struct {
	uid   string
	sends []sendItem
	// failed are InProgress nodes the job's Secret fails, for unusable.
	failed   []string
	unusable *secretError
}

type sendItem struct {
	node string
	item *agentv1.WorkItem
}

// index records what the slice's InProgress nodes should hold and returns
// what changed, to send to the nodes connected here. A nil plan and no
// error: the slice's job is gone, and its work was forgotten.
func (e *Executor) index(ctx context.Context, s *opsv1.NodeTaskSlice) (*plan, error) {
	job, err := e.getJob(ctx, s.Job)
	if err != nil {
		return nil, err
	}
	uid := string(s.Job.UID)
	if job == nil {
		e.forgetJob(uid)
		return nil, nil
	}
	p := &plan{uid: uid}
	var base *agentv1.WorkItem
	timeout := time.Duration(max(job.Execution().TimeoutSeconds, 1)) * time.Second
	e.mu.Lock()
	e.jobs[uid] = jobRef{kind: s.Job.Kind, name: s.Job.Name, uid: s.Job.UID, timeout: timeout}
	if e.where[uid] == nil {
		e.where[uid] = map[string]nodeRef{}
	}
	e.mu.Unlock()
	for _, n := range s.Nodes {
		e.mu.Lock()
		e.where[uid][n.NodeName] = nodeRef{slice: s.Name, since: updateTime(n)}
		had := e.want[n.NodeName][uid]
		e.mu.Unlock()
		if n.Phase != opsv1.NodeTaskPhaseInProgress {
			if had != nil {
				e.drop(n.NodeName, uid)
			}
			continue
		}
		if base == nil && p.unusable == nil {
			// Once per slice, not per node: it may read the job's Secret.
			base, err = e.jobItem(ctx, job)
			if p.unusable, _ = errors.AsType[*secretError](err); p.unusable == nil && err != nil {
				return nil, err
			}
		}
		if p.unusable != nil {
			// The Secret will not become readable by retrying: the node
			// fails now, saying which Secret, instead of going Unknown.
			p.failed = append(p.failed, n.NodeName)
			continue
		}
		items := itemsFor(job, base, n.NodeName)
		e.mu.Lock()
		if e.want[n.NodeName] == nil {
			e.want[n.NodeName] = map[string]*agentv1.WorkItem{}
		}
		for _, it := range items {
			old := e.want[n.NodeName][it.GetUid()]
			if old == nil || string(old.GetSpec()) != string(it.GetSpec()) {
				e.want[n.NodeName][it.GetUid()] = it
				p.sends = append(p.sends, sendItem{n.NodeName, it})
			}
		}
		e.mu.Unlock()
	}
	e.log.Debug("indexed slice", "slice", s.Name, "job", s.Job.Name, "nodes", len(s.Nodes), "changed", len(p.sends))
	return p, nil
}

// send fails and dispatches what p found, at the nodes connected here.
func (e *Executor) send(p *plan) {
	h := e.hub.Load()
	if p == nil || h == nil {
		return
	}
	for _, node := range p.failed {
		// Only the nodes connected here: another hub fails its own.
		if (*h).Connected(node) {
			e.failNode(p.uid, node, nodejobwire.Dispatch, p.unusable.Error())
		}
	}
	for _, o := range p.sends {
		if (*h).Connected(o.node) {
			e.dispatch(*h, p.uid, o.node, o.item)
		}
	}
}

// resend dispatches every wanted item to the nodes connected here. Agents
// cannot have connected while the index loaded (WorkFor refused them), so
// this only matters to a node whose stream opened in between; an agent
// applies a uid once, so a repeat is harmless.
func (e *Executor) resend() {
	h := e.hub.Load()
	if h == nil {
		return
	}
	e.mu.Lock()
	type out struct {
		node string
		item *agentv1.WorkItem
	}
	var sends []out
	for node, items := range e.want {
		for _, it := range items {
			sends = append(sends, out{node, it})
		}
	}
	e.mu.Unlock()
	for _, o := range sends {
		if (*h).Connected(o.node) {
			e.dispatch(*h, jobOf(o.item.GetUid()), o.node, o.item)
		}
	}
}

// jobOf is the job uid of a node-job item uid (its own, or a confirmation's).
func jobOf(uid string) string {
	job, _ := strings.CutSuffix(uid, nodejobwire.ConfirmUID(""))
	return job
}

// dispatch sends item to node; a send that fails fails the node at once,
// which frees its concurrency slot, instead of leaving it to time out.
func (e *Executor) dispatch(h hub.Link, job, node string, item *agentv1.WorkItem) {
	if err := h.Dispatch(node, item); err != nil {
		e.log.Warn("dispatch failed; failing the node", "node", node, "uid", item.GetUid(), "err", err)
		e.failNode(job, node, nodejobwire.Dispatch, fmt.Sprintf("failed to send the work to the node: %v", err))
	}
}

// failNode queues a Failed report, made by this hub, for node's entry in
// job uid, unless one is queued already (a slice indexed again before the
// write).
func (e *Executor) failNode(uid, node, action, reason string) {
	e.mu.Lock()
	for _, rp := range e.queue[uid][node] {
		if rp.phase == nodejobwire.PhaseFailed && rp.r.Action == action {
			e.mu.Unlock()
			return
		}
	}
	now := e.opts.Clock.Now()
	e.queueLocked(uid, node, report{phase: nodejobwire.PhaseFailed, r: nodejobwire.Report{Action: action, Reason: reason, Time: now}, at: now})
	e.mu.Unlock()
	e.wakeWriter()
}

// queueLocked appends rp to node's queued reports. e.mu is held.
func (e *Executor) queueLocked(uid, node string, rp ...report) {
	if e.queue[uid] == nil {
		e.queue[uid] = map[string][]report{}
	}
	e.queue[uid][node] = append(e.queue[uid][node], rp...)
}

func (e *Executor) wakeWriter() {
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

func (e *Executor) drop(node, uid string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k := range e.want[node] {
		if k == uid || k == nodejobwire.ConfirmUID(uid) {
			delete(e.want[node], k)
		}
	}
	if len(e.want[node]) == 0 {
		delete(e.want, node)
	}
}

// forgetJob stops a deleted job's work: its items leave every node's list,
// and nodes connected here are told to cancel them.
func (e *Executor) forgetJob(uid string) {
	e.mu.Lock()
	var nodes []string
	for node, items := range e.want {
		if _, ok := items[uid]; ok {
			nodes = append(nodes, node)
		}
	}
	delete(e.jobs, uid)
	for _, ref := range e.where[uid] {
		delete(e.written, ref.slice)
	}
	delete(e.where, uid)
	delete(e.queue, uid)
	e.mu.Unlock()
	h := e.hub.Load()
	for _, n := range nodes {
		e.drop(n, uid)
		if h != nil && (*h).Connected(n) {
			_ = (*h).Cancel(n, uid)
		}
	}
	if len(nodes) > 0 {
		e.log.Info("node job gone; cancelled its work", "uid", uid, "nodes", len(nodes))
	}
}

func (e *Executor) getJob(ctx context.Context, ref opsv1.JobReference) (opsv1.NodeJob, error) {
	var j opsv1.NodeJob
	switch ref.Kind {
	case "NodeUpgradeJob":
		j = &opsv1.NodeUpgradeJob{}
	case "ImagePrePullJob":
		j = &opsv1.ImagePrePullJob{}
	default:
		return nil, nil
	}
	if err := e.opts.Client.Get(ctx, client.ObjectKey{Name: ref.Name}, j); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, err
	}
	if j.GetUID() != ref.UID {
		return nil, nil // a newer job with the same name; this slice is stale
	}
	return j, nil
}

// Ready implements hub.Readier: the node jobs have loaded.
func (e *Executor) Ready() bool { return e.synced.Load() }

// WorkFor implements hub.Feature: the node's node-job items.
func (e *Executor) WorkFor(_ context.Context, node string) ([]*agentv1.WorkItem, error) {
	if !e.synced.Load() {
		// An empty list would make the agent cancel work it runs.
		return nil, errors.New("node jobs are still loading; reconnect shortly")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]*agentv1.WorkItem, 0, len(e.want[node]))
	for _, it := range e.want[node] {
		out = append(out, it)
	}
	return out, nil
}

// WorkStatus implements hub.Feature.
func (e *Executor) WorkStatus(_ context.Context, node string, st *agentv1.WorkStatus) {
	e.enqueue(node, st)
}

// NodeState implements hub.Feature.
func (e *Executor) NodeState(_ context.Context, node string, work []*agentv1.WorkStatus) {
	for _, st := range work {
		if st.GetMessage() != "" {
			e.enqueue(node, st)
		}
	}
}

func (e *Executor) enqueue(node string, st *agentv1.WorkStatus) {
	e.mu.Lock()
	// A job's own uid (confirmations carry no report), and only from a
	// node in the job: the hub drops other nodes' reports before they get
	// here, and a report kept for an entry no slice holds would wait for
	// ever.
	job, ours := e.jobs[st.GetUid()]
	ours = ours && e.inJobLocked(node, st.GetUid())
	e.mu.Unlock()
	if !ours {
		return
	}
	var r nodejobwire.Report
	var err error
	at := e.opts.Clock.Now()
	switch {
	case st.GetMessage() == "" && (st.GetPhase() == nodejobwire.PhaseFailed || st.GetPhase() == "Cancelled"):
		// The agent ended the item without a runner's report (no runner for
		// the type, or it restarted mid-run): the node failed, and why.
		r = nodejobwire.Report{Action: nodejobwire.Agent, Reason: st.GetPhase() + ": " + st.GetReason(), Time: e.opts.Clock.Now()}
		st = &agentv1.WorkStatus{Uid: st.GetUid(), Phase: nodejobwire.PhaseFailed, Reason: st.GetReason()}
	default:
		r, err = nodejobwire.DecodeReport(st.GetMessage())
		if err == nil && !nodejobwire.AgentActions(itemType(job.kind), r.Action) {
			// Never written into the action flow: only the flow's actions
			// are, and the hub's own (Dispatch, Agent).
			err = fmt.Errorf("action %q is not an action of a %s", r.Action, job.kind)
		}
	}
	if err != nil {
		e.log.Warn("refusing a node job report", "node", node, "uid", st.GetUid(), "err", err)
		return
	}
	e.reports.Inc()
	e.mu.Lock()
	e.queueLocked(st.GetUid(), node, report{phase: st.GetPhase(), r: r, at: at})
	e.mu.Unlock()
	e.wakeWriter()
}

// itemType is the work item type of a job kind.
func itemType(kind string) string {
	if kind == "ImagePrePullJob" {
		return nodejobwire.TypePrePull
	}
	return nodejobwire.TypeUpgrade
}
