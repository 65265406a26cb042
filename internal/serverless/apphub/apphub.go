// Package apphub is a hub's part of serverless applications
// (serverless.drover.io, issue 16): it routes the instances and sessions
// the manager decided on to the agents connected to this hub, and writes
// what they report back into the API.
//
// Every hub runs one; none needs to be the leader. The manager
// (internal/serverless/appctl) writes InstanceSlice spec (which instances
// exist on a node) and binds ApplicationSessions (spec.instanceName and
// spec.nodeName). The hub serving the node then:
//
//	slice instance added      → an app-instance item (appwire.InstanceSpec)
//	slice instance removed    → Cancel of its uid
//	session bound             → an app-session item (appwire.SessionSpec)
//	session deleted           → Cancel of its uid; Terminated → finalizer off
//	instance reports          → InstanceSlice status, coalesced (one write
//	                            per slice per SliceWriteInterval at most)
//	session reports           → ApplicationSession status, only on the
//	                            phases a user sees (Ready with its endpoint,
//	                            Live, Evacuating, Terminated) and flag changes
//
// Items go only to agents that name protocol.FeatureApps: an older agent
// has no runner for them. A session flagged (its heartbeats stopped) for
// longer than its open timeout is closed when the Application's
// session.onHeartbeatLost is Close (the default).
//
// What this hub remembers (what it sent to which node, the instances'
// last reports) is rebuilt from the caches and the agents' snapshots and
// NodeStates after a restart: the API stays the source of truth.
package apphub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"

	serverlessv1 "github.com/drover-fleet/drover/api/serverless/v1alpha1"
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/serverless/appwire"
)

// Field indexes this feature adds to the manager's cache. Prefixed, so
// they never meet the manager's own indexes on the same kinds when a hub
// and the manager share a process (drover server).
const (
	// IndexSliceNode indexes InstanceSlices by spec.nodeName.
	IndexSliceNode = "apphub.spec.nodeName"
	// IndexSliceInstance indexes InstanceSlices by spec.instances[].uid.
	IndexSliceInstance = "apphub.spec.instances.uid"
	// IndexSessionNode indexes ApplicationSessions by spec.nodeName.
	IndexSessionNode = "apphub.spec.nodeName"
	// IndexSessionUID indexes ApplicationSessions by metadata.uid.
	IndexSessionUID = "apphub.metadata.uid"
)

// Reasons this package writes into session status and Events.
const (
	// ReasonHeartbeatLost (serverlessv1.ReasonHeartbeatLost) closes a
	// session flagged longer than its open timeout.
	ReasonHeartbeatLost = serverlessv1.ReasonHeartbeatLost
)

// Options configure a Feature.
type Options struct {
	// Client reads Applications, InstanceSlices and ApplicationSessions
	// from the manager's cache (with the indexes SetupWithManager adds)
	// and writes their status.
	Client client.Client
	// APIReader reads afresh after a write conflict.
	APIReader client.Reader
	// SliceWriteInterval is the least time between two status writes of
	// one InstanceSlice: reports in between are coalesced. Default 1s.
	SliceWriteInterval time.Duration
	// CleanupTimeout bounds how long a deleted session waits for its
	// agent to confirm the close after the cancel: then it is written
	// Terminated (InstanceGone) and released. Default 2m.
	CleanupTimeout time.Duration
	// Workers write statuses in parallel. Default 4.
	Workers int
	// Recorder records Events on ApplicationSessions. Default: the
	// manager's.
	Recorder   events.EventRecorder
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Clock times coalescing and the heartbeat policy. Default: the wall
	// clock.
	Clock clock.Clock
}

// Owns reports whether a work uid is an instance's or a session's.
func Owns(uid string) bool {
	kind, _ := appwire.ParseWorkID(uid)
	return kind != ""
}

// instRec is what this hub knows of one instance (slice entry uid).
type instRec struct {
	node  string
	slice types.NamespacedName
	name  string
	// sent: the item went to node (a dispatch or a snapshot).
	sent bool
	// status is its last report; nil: none yet.
	status *serverlessv1.InstanceStatus
	// reportedAt is when the oldest report not yet written arrived.
	reportedAt time.Time
}

// sliceRec is what waits to be written into one InstanceSlice.
type sliceRec struct {
	node string
	// insts are the instance ids (slice entry uids) this hub knows on it.
	insts map[string]struct{}
	// dirty: a report came since the last write.
	dirty     bool
	lastWrite time.Time
}

// sessRec is what this hub knows of one ApplicationSession.
type sessRec struct {
	key  types.NamespacedName
	uid  string
	node string
	work string
	// sent: the item went to node; cancelled: its Cancel did, at
	// cancelledAt.
	sent, cancelled bool
	cancelledAt     time.Time
	// want is the status the reports ask for; dirty: not written yet.
	want       sessWant
	dirty      bool
	reportedAt time.Time
	// written is the last status this hub wrote (phase, flagged).
	written sessWant
	// flaggedSince: when its instance first reported it flagged (zero:
	// not flagged).
	flaggedSince time.Time
	hbCancelled  bool
}

// sessWant is a session's status as the reports make it.
type sessWant struct {
	phase     serverlessv1.SessionPhase
	reason    string
	message   string
	port      int
	flagged   bool
	clients   []string
	readyTime time.Time
}

// Feature is the hub feature of serverless applications.
type Feature struct {
	opts Options
	log  *slog.Logger
	hub  atomic.Pointer[hub.Link]

	synced atomic.Bool

	sliceQ workqueue.TypedRateLimitingInterface[types.NamespacedName]
	sessQ  workqueue.TypedRateLimitingInterface[types.NamespacedName]

	mu sync.Mutex
	// insts: instance id → record.
	insts map[string]*instRec
	// slices: InstanceSlice → record.
	slices map[types.NamespacedName]*sliceRec
	// sessions by key and by uid.
	sessions map[types.NamespacedName]*sessRec
	sessUID  map[string]*sessRec
	// gone: work uid → node, of items this hub sent whose objects (or
	// slice entries) are gone, so that their last reports are still their
	// node's own; the oldest are forgotten first.
	gone      map[string]string
	goneOrder []string

	m metrics
}

type metrics struct {
	dispatched, cancels, reports, sliceWrites, sessionWrites, conflicts prometheus.Counter
	opened                                                              prometheus.Counter
	closed                                                              *prometheus.CounterVec
	lag                                                                 *prometheus.HistogramVec
}

var (
	_ hub.Feature = (*Feature)(nil)
	_ hub.Readier = (*Feature)(nil)
)

// New returns the feature; hub.New attaches it to its hub.
func New(opts Options) *Feature {
	if opts.SliceWriteInterval <= 0 {
		opts.SliceWriteInterval = time.Second
	}
	if opts.CleanupTimeout <= 0 {
		opts.CleanupTimeout = 2 * time.Minute
	}
	if opts.Workers <= 0 {
		opts.Workers = 4
	}
	if opts.APIReader == nil {
		opts.APIReader = opts.Client
	}
	opts.Clock = clock.Or(opts.Clock)
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "drover_hub_apps_" + name, Help: help})
	}
	rl := func() workqueue.TypedRateLimiter[types.NamespacedName] {
		return workqueue.NewTypedItemExponentialFailureRateLimiter[types.NamespacedName](100*time.Millisecond, 30*time.Second)
	}
	f := &Feature{
		opts: opts, log: opts.Logger,
		sliceQ:   workqueue.NewTypedRateLimitingQueueWithConfig(rl(), workqueue.TypedRateLimitingQueueConfig[types.NamespacedName]{Name: "apphub-slices"}),
		sessQ:    workqueue.NewTypedRateLimitingQueueWithConfig(rl(), workqueue.TypedRateLimitingQueueConfig[types.NamespacedName]{Name: "apphub-sessions"}),
		insts:    map[string]*instRec{},
		slices:   map[types.NamespacedName]*sliceRec{},
		sessions: map[types.NamespacedName]*sessRec{},
		sessUID:  map[string]*sessRec{},
		gone:     map[string]string{},
		m: metrics{
			dispatched:    c("dispatched_total", "Instance and session items this hub sent to agents (dispatches and snapshot items)."),
			cancels:       c("cancels_total", "Cancels sent for removed instances and deleted or abandoned sessions."),
			reports:       c("reports_total", "Instance and session reports received from agents."),
			sliceWrites:   c("slice_status_writes_total", "InstanceSlice status writes by this hub (coalesced reports)."),
			sessionWrites: c("session_status_writes_total", "ApplicationSession status writes by this hub."),
			conflicts:     c("write_conflicts_total", "Writes that met a conflict and were retried."),
			opened:        c("sessions_opened_total", "Sessions this hub wrote Ready (their first time)."),
			closed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "drover_hub_apps_sessions_closed_total",
				Help: "Sessions this hub wrote Terminated, by reason."}, []string{"reason"}),
			lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "drover_hub_apps_report_lag_seconds",
				Help:    "Time from an agent's report reaching the hub to the status write that carries it, by kind (instance, session).",
				Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2, 5, 10, 30}}, []string{"kind"}),
		},
	}
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(f.m.dispatched, f.m.cancels, f.m.reports, f.m.sliceWrites, f.m.sessionWrites,
			f.m.conflicts, f.m.opened, f.m.closed, f.m.lag)
	}
	return f
}

// Name implements hub.Feature.
func (f *Feature) Name() string { return "apps" }

// Owns implements hub.Feature: instances' and sessions' work uids.
func (f *Feature) Owns(uid string) bool { return Owns(uid) }

// Attach implements hub.Feature.
func (f *Feature) Attach(l hub.Link) { f.hub.Store(&l) }

func (f *Feature) getHub() hub.Link {
	if h := f.hub.Load(); h != nil {
		return *h
	}
	return nil
}

// Ready implements hub.Readier: the caches have loaded.
func (f *Feature) Ready() bool { return f.synced.Load() }

// Assigned implements hub.Feature. An instance's uid is node's when this
// hub sent it there, or its InstanceSlice is node's; a session's when
// this hub sent it there, or it is bound to node. What this hub sent
// answers first (its caches may lag), then items whose objects are gone.
func (f *Feature) Assigned(ctx context.Context, node, uid string) bool {
	kind, id := appwire.ParseWorkID(uid)
	f.mu.Lock()
	var known, mine bool
	switch kind {
	case appwire.TypeInstance:
		if r, ok := f.insts[id]; ok {
			known, mine = true, r.node == node
		}
	case appwire.TypeSession:
		if r, ok := f.sessUID[id]; ok && r.node != "" {
			known, mine = true, r.node == node
		}
	default:
		f.mu.Unlock()
		return false
	}
	if !known {
		if to, ok := f.gone[uid]; ok {
			known, mine = true, to == node
		}
	}
	f.mu.Unlock()
	if known {
		return mine
	}
	switch kind {
	case appwire.TypeInstance:
		s, _ := f.sliceOfInstance(ctx, id)
		return s != nil && s.Spec.NodeName == node
	default:
		s := f.sessionByUID(ctx, id)
		return s != nil && s.Spec.NodeName == node
	}
}

// sliceOfInstance finds the cached slice holding instance id and the
// entry's name (read only: no copy).
func (f *Feature) sliceOfInstance(ctx context.Context, id string) (*serverlessv1.InstanceSlice, string) {
	var l serverlessv1.InstanceSliceList
	if err := f.opts.Client.List(ctx, &l, client.MatchingFields{IndexSliceInstance: id}, client.UnsafeDisableDeepCopy); err != nil || len(l.Items) == 0 {
		return nil, ""
	}
	s := &l.Items[0]
	for _, in := range s.Spec.Instances {
		if in.UID == id {
			return s, in.Name
		}
	}
	return nil, ""
}

// sessionByUID finds the cached session with uid (read only).
func (f *Feature) sessionByUID(ctx context.Context, uid string) *serverlessv1.ApplicationSession {
	var l serverlessv1.ApplicationSessionList
	if err := f.opts.Client.List(ctx, &l, client.MatchingFields{IndexSessionUID: uid}, client.UnsafeDisableDeepCopy); err != nil || len(l.Items) == 0 {
		return nil
	}
	return &l.Items[0]
}

// goneMax bounds the work uids of gone objects the feature remembers.
const goneMax = 8192

// rememberGoneLocked records that work was sent to node and its object is
// gone. f.mu is held.
func (f *Feature) rememberGoneLocked(work, node string) {
	if _, ok := f.gone[work]; !ok {
		if len(f.goneOrder) >= goneMax {
			delete(f.gone, f.goneOrder[0])
			f.goneOrder = f.goneOrder[1:]
		}
		f.goneOrder = append(f.goneOrder, work)
	}
	f.gone[work] = node
}

// canSend says why node must get no app item now: nil when it is
// connected here and its agent names protocol.FeatureApps.
func canSend(h hub.Link, node string) error {
	if !h.Connected(node) {
		return fmt.Errorf("node %s is not connected to hub %s", node, h.HubName())
	}
	if !h.Supports(node, protocol.FeatureApps) {
		return fmt.Errorf("the agent of node %s does not run applications (it does not name the %s feature): upgrade it", node, protocol.FeatureApps)
	}
	return nil
}

// IndexObjects adds the field indexes the feature lists by
// (SetupWithManager calls it). Indexes are per manager: a second call on
// the same manager fails.
func IndexObjects(ctx context.Context, mgr ctrl.Manager) error {
	fi := mgr.GetFieldIndexer()
	idx := []struct {
		obj  client.Object
		name string
		f    func(client.Object) []string
	}{
		{&serverlessv1.InstanceSlice{}, IndexSliceNode, func(o client.Object) []string {
			if n := o.(*serverlessv1.InstanceSlice).Spec.NodeName; n != "" {
				return []string{n}
			}
			return nil
		}},
		{&serverlessv1.InstanceSlice{}, IndexSliceInstance, func(o client.Object) []string {
			s := o.(*serverlessv1.InstanceSlice)
			out := make([]string, 0, len(s.Spec.Instances))
			for _, in := range s.Spec.Instances {
				out = append(out, in.UID)
			}
			return out
		}},
		{&serverlessv1.ApplicationSession{}, IndexSessionNode, func(o client.Object) []string {
			if n := o.(*serverlessv1.ApplicationSession).Spec.NodeName; n != "" {
				return []string{n}
			}
			return nil
		}},
		{&serverlessv1.ApplicationSession{}, IndexSessionUID, func(o client.Object) []string {
			return []string{string(o.GetUID())}
		}},
	}
	for _, x := range idx {
		if err := fi.IndexField(ctx, x.obj, x.name, x.f); err != nil {
			return fmt.Errorf("index %T by %s: %w", x.obj, x.name, err)
		}
	}
	return nil
}

// SetupWithManager adds the field indexes, the InstanceSlice and
// ApplicationSession controllers (on every hub, without leader election)
// and the status writers.
func (f *Feature) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if err := IndexObjects(ctx, mgr); err != nil {
		return err
	}
	if f.opts.Recorder == nil {
		f.opts.Recorder = mgr.GetEventRecorder("drover-hub")
	}
	noLeader := false
	if err := ctrl.NewControllerManagedBy(mgr).Named("apphub-slices").
		For(&serverlessv1.InstanceSlice{}).
		WithOptions(controller.Options{NeedLeaderElection: &noLeader, MaxConcurrentReconciles: 4}).
		Complete(sliceReconciler{f}); err != nil {
		return fmt.Errorf("set up the hub's InstanceSlice controller: %w", err)
	}
	if err := ctrl.NewControllerManagedBy(mgr).Named("apphub-sessions").
		For(&serverlessv1.ApplicationSession{}).
		WithOptions(controller.Options{NeedLeaderElection: &noLeader, MaxConcurrentReconciles: 8}).
		Complete(sessionReconciler{f}); err != nil {
		return fmt.Errorf("set up the hub's ApplicationSession controller: %w", err)
	}
	return mgr.Add(&writers{f: f, mgr: mgr})
}

// writers waits for the cache, then writes statuses until ctx ends.
type writers struct {
	f   *Feature
	mgr ctrl.Manager
}

func (w *writers) NeedLeaderElection() bool { return false }

func (w *writers) Start(ctx context.Context) error {
	f := w.f
	defer f.sliceQ.ShutDown()
	defer f.sessQ.ShutDown()
	if !w.mgr.GetCache().WaitForCacheSync(ctx) {
		return ctx.Err()
	}
	f.synced.Store(true)
	f.log.Info("application feature ready")
	var wg sync.WaitGroup
	for range f.opts.Workers {
		wg.Add(2)
		go func() { defer wg.Done(); f.runQueue(ctx, f.sliceQ, f.writeSlice) }()
		go func() { defer wg.Done(); f.runQueue(ctx, f.sessQ, f.syncSession) }()
	}
	<-ctx.Done()
	f.sliceQ.ShutDown()
	f.sessQ.ShutDown()
	wg.Wait()
	return nil
}

// runQueue processes q's keys with do until q shuts down. do returns
// after: >0 to come back then, and an error to retry with backoff.
func (f *Feature) runQueue(ctx context.Context, q workqueue.TypedRateLimitingInterface[types.NamespacedName],
	do func(context.Context, types.NamespacedName) (time.Duration, error)) {
	for {
		key, shutdown := q.Get()
		if shutdown {
			return
		}
		after, err := do(ctx, key)
		switch {
		case err != nil && ctx.Err() == nil:
			f.log.Warn("status write failed; retrying", "object", key, "err", err)
			q.AddRateLimited(key)
		case after > 0:
			q.Forget(key)
			q.AddAfter(key, after)
		default:
			q.Forget(key)
		}
		q.Done(key)
	}
}

// errNotReady is the error of a snapshot asked for before the caches loaded.
var errNotReady = errors.New("applications are still loading; reconnect shortly")
