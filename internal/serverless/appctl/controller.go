package appctl

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	serverlessv1 "github.com/drover-fleet/drover/api/serverless/v1alpha1"
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/kname"
	"github.com/drover-fleet/drover/internal/scheduler"
)

// IndexSessionApplication indexes ApplicationSessions by spec.application.
const IndexSessionApplication = "serverless.spec.application"

// AnnotationBoundTime is when the manager bound a session, written with
// the binding (one update): the open timeout runs from it until the hub
// writes status.boundTime.
const AnnotationBoundTime = "serverless.drover.io/bound-time"

// Reasons of the Application's conditions and Events.
const (
	ReasonInstancesReady   = "InstancesReady"
	ReasonScaling          = "Scaling"
	ReasonPlaced           = "Placed"
	ReasonUnschedulable    = "Unschedulable"
	ReasonNotGranted       = "NotGranted"
	ReasonInstancesCreated = "InstancesCreated"
	ReasonFailedScheduling = "FailedScheduling"
	ReasonSessionsClosed   = "SessionsClosed"
	ReasonGrantsNothing    = "GrantsNothing"
)

// Errors of Open.
var (
	ErrApplicationNotFound = errors.New(serverlessv1.ReasonApplicationNotFound)
	ErrApplicationIsDaemon = errors.New(serverlessv1.ReasonApplicationIsDaemon)
	ErrNoCapacity          = errors.New(serverlessv1.ReasonNoCapacity)
)

// Options configure the Application controller.
type Options struct {
	// Clock of timeouts; nil = the real one.
	Clock clock.Clock
	// RecorderName names the Events' source. Default drover-manager.
	RecorderName string
	// SessionGrace is added to a session's open timeout before the manager
	// closes it (OpenTimeout): the hub closes it first when it can.
	// Default 30s.
	SessionGrace time.Duration
	// InstanceGoneGrace is how long a bound session's instance may be
	// missing from its slice (spec and status) before the manager
	// terminates the session (InstanceGone). Default 30s.
	InstanceGoneGrace time.Duration
}

// Controller keeps each Application's instances (InstanceSlices) and binds
// its sessions. It is one reconcile per Application, and one at a time
// (mu): an instance's room is counted once, whether a session is bound by
// the reconcile of unbound sessions or by Open.
type Controller struct {
	client client.Client
	rec    events.EventRecorder
	clock  clock.Clock
	opts   Options

	mu sync.Mutex
	// written holds the slices this manager wrote that its cache does not
	// show yet (by generation), or deleted (nil object).
	written map[types.NamespacedName]writtenSlice
	// notes holds what this manager did to sessions that its cache does
	// not show yet: bound them (or created them bound), or ended them.
	notes map[types.NamespacedName]sessionNote
	// goneSince: when a bound session's instance was first seen missing.
	goneSince map[types.UID]time.Time
	badGrants map[types.UID]int64
}

type writtenSlice struct {
	obj *serverlessv1.InstanceSlice // nil: deleted
	uid types.UID
	at  time.Time
}

type sessionNote struct {
	uid            types.UID
	instance, node string
	// created: by Open, bound; it may not be in the cache yet.
	created bool
	ended   bool
	at      time.Time
}

// noteTTL bounds how long a note waits for the cache.
const noteTTL = 2 * time.Minute

// +kubebuilder:rbac:groups=serverless.drover.io,resources=applications,verbs=get;list;watch
// +kubebuilder:rbac:groups=serverless.drover.io,resources=applications/status,verbs=update
// +kubebuilder:rbac:groups=serverless.drover.io,resources=instanceslices,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=serverless.drover.io,resources=applicationsessions,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=serverless.drover.io,resources=applicationsessions/status,verbs=update

// Setup registers the Application controller with mgr and returns it (its
// Open binds sessions in-process).
func Setup(mgr ctrl.Manager, opts Options) (*Controller, error) {
	if opts.RecorderName == "" {
		opts.RecorderName = "drover-manager"
	}
	if opts.SessionGrace <= 0 {
		opts.SessionGrace = 30 * time.Second
	}
	if opts.InstanceGoneGrace <= 0 {
		opts.InstanceGoneGrace = 30 * time.Second
	}
	registerMetrics()
	c := &Controller{client: mgr.GetClient(), rec: mgr.GetEventRecorder(opts.RecorderName), clock: clock.Or(opts.Clock), opts: opts,
		written: map[types.NamespacedName]writtenSlice{}, notes: map[types.NamespacedName]sessionNote{},
		goneSince: map[types.UID]time.Time{}, badGrants: map[types.UID]int64{}}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &serverlessv1.ApplicationSession{}, IndexSessionApplication,
		func(o client.Object) []string { return []string{o.(*serverlessv1.ApplicationSession).Spec.Application} }); err != nil {
		return nil, fmt.Errorf("index ApplicationSessions by application: %w", err)
	}
	sessionApp := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		s := o.(*serverlessv1.ApplicationSession)
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: s.Namespace, Name: s.Spec.Application}}}
	})
	allApps := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		var apps serverlessv1.ApplicationList
		if err := c.client.List(ctx, &apps, client.UnsafeDisableDeepCopy); err != nil {
			log.FromContext(ctx).Error(err, "list Applications")
			return nil
		}
		out := make([]reconcile.Request, len(apps.Items))
		for i := range apps.Items {
			out[i] = reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&apps.Items[i])}
		}
		return out
	})
	err := ctrl.NewControllerManagedBy(mgr).
		Named("application").
		For(&serverlessv1.Application{}).
		Owns(&serverlessv1.InstanceSlice{}).
		Watches(&serverlessv1.ApplicationSession{}, sessionApp).
		Watches(&fleetv1.FleetNode{}, allApps, builder.WithPredicates(predicate.Funcs{UpdateFunc: nodeMatters})).
		Watches(&fleetv1.NodeGrant{}, allApps, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Complete(c)
	if err != nil {
		return nil, fmt.Errorf("set up Application controller: %w", err)
	}
	return c, nil
}

// nodeMatters: heartbeats do not; phase, readiness, labels, capacity and
// cordoning do.
func nodeMatters(e event.UpdateEvent) bool {
	o, n := e.ObjectOld.(*fleetv1.FleetNode), e.ObjectNew.(*fleetv1.FleetNode)
	return o.Status.Phase != n.Status.Phase || o.Spec.Unschedulable != n.Spec.Unschedulable ||
		scheduler.NodeFrom(o).Disconnected != scheduler.NodeFrom(n).Disconnected ||
		!equality.Semantic.DeepEqual(o.Labels, n.Labels) || !equality.Semantic.DeepEqual(o.Status.Capacity, n.Status.Capacity)
}

// view is one Application as the caches and this manager's own writes show
// it.
type view struct {
	app      *serverlessv1.Application // nil: not found or being deleted
	key      types.NamespacedName
	slices   map[string]*serverlessv1.InstanceSlice // by node
	nodes    map[string]*fleetv1.FleetNode
	sessions []*serverlessv1.ApplicationSession
	// bound: each bound, not ended session's instance (from specs and notes).
	bound map[string]string // session name -> instance
	// pending: unbound sessions waiting for an instance.
	pending []*serverlessv1.ApplicationSession
	// where: the node of each instance in a slice spec.
	where map[string]string
}

// load reads one Application's objects. Caller holds c.mu.
func (c *Controller) load(ctx context.Context, key types.NamespacedName, now time.Time) (*view, error) {
	v := &view{key: key, slices: map[string]*serverlessv1.InstanceSlice{}, nodes: map[string]*fleetv1.FleetNode{},
		bound: map[string]string{}, where: map[string]string{}}
	var app serverlessv1.Application
	switch err := c.client.Get(ctx, key, &app); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return nil, fmt.Errorf("get Application %s: %w", key, err)
	case app.DeletionTimestamp == nil:
		v.app = &app
	}
	var nodes fleetv1.FleetNodeList
	if err := c.client.List(ctx, &nodes); err != nil {
		return nil, fmt.Errorf("list FleetNodes: %w", err)
	}
	for i := range nodes.Items {
		v.nodes[nodes.Items[i].Name] = &nodes.Items[i]
	}
	var slices serverlessv1.InstanceSliceList
	if err := c.client.List(ctx, &slices, client.InNamespace(key.Namespace),
		client.MatchingLabels{serverlessv1.LabelApplication: kname.LabelValue(key.Name)}); err != nil {
		return nil, fmt.Errorf("list InstanceSlices of %s: %w", key, err)
	}
	seen := map[types.NamespacedName]bool{}
	for i := range slices.Items {
		s := &slices.Items[i]
		sk := client.ObjectKeyFromObject(s)
		seen[sk] = true
		if w, ok := c.written[sk]; ok {
			switch {
			case w.obj == nil && w.uid == s.UID:
				continue // deleted
			case w.obj != nil && w.uid == s.UID && s.Generation < w.obj.Generation:
				s = w.obj.DeepCopy()
			default:
				delete(c.written, sk)
			}
		}
		if s.Spec.Application != key.Name {
			continue
		}
		v.slices[s.Spec.NodeName] = s
	}
	for sk, w := range c.written {
		if sk.Namespace != key.Namespace || seen[sk] {
			continue
		}
		if w.obj == nil || now.Sub(w.at) > noteTTL {
			delete(c.written, sk)
			continue
		}
		if w.obj.Spec.Application == key.Name {
			v.slices[w.obj.Spec.NodeName] = w.obj.DeepCopy() // created, not in the cache yet
		}
	}
	for node, s := range v.slices {
		for _, in := range s.Spec.Instances {
			v.where[in.Name] = node
		}
	}

	var sessions serverlessv1.ApplicationSessionList
	if err := c.client.List(ctx, &sessions, client.InNamespace(key.Namespace), client.MatchingFields{IndexSessionApplication: key.Name}); err != nil {
		return nil, fmt.Errorf("list ApplicationSessions of %s: %w", key, err)
	}
	names := map[string]bool{}
	for i := range sessions.Items {
		s := &sessions.Items[i]
		names[s.Name] = true
		sk := client.ObjectKeyFromObject(s)
		if n, ok := c.notes[sk]; ok {
			switch {
			case n.uid != "" && n.uid != s.UID:
				delete(c.notes, sk)
			case n.ended && !s.Status.Phase.Final():
				s.Status.Phase = serverlessv1.SessionTerminated
			case !n.ended && s.Spec.InstanceName == "":
				s.Spec.InstanceName, s.Spec.NodeName = n.instance, n.node
			default:
				delete(c.notes, sk)
			}
		}
		v.sessions = append(v.sessions, s)
		switch {
		case s.Status.Phase.Final():
		case s.Spec.InstanceName != "":
			v.bound[s.Name] = s.Spec.InstanceName
		case s.DeletionTimestamp == nil:
			v.pending = append(v.pending, s)
		}
	}
	for sk, n := range c.notes {
		if sk.Namespace != key.Namespace || names[sk.Name] {
			continue
		}
		if !n.created || now.Sub(n.at) > noteTTL {
			delete(c.notes, sk) // deleted, or never seen
			continue
		}
		if !n.ended && v.where[n.instance] != "" {
			v.bound[sk.Name] = n.instance // created by Open, not in the cache yet
		}
	}
	sort.SliceStable(v.pending, func(i, j int) bool {
		a, b := v.pending[i], v.pending[j]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Name < b.Name
	})
	return v, nil
}

// input is v as decide reads it.
func (c *Controller) input(v *view, now time.Time, pending []Pending) Input {
	perInstance := map[string]int{}
	for _, inst := range v.bound {
		perInstance[inst]++
	}
	in := Input{Now: now, Mode: v.app.Spec.Mode, Scaling: v.app.Spec.Scaling, Pending: pending}
	for node, s := range v.slices {
		st := statusByName(s)
		n := v.nodes[node]
		lost := nodeLost(n)
		ready := n != nil && !lost && n.Status.Phase == fleetv1.FleetNodeOnline && !scheduler.NodeFrom(n).Disconnected
		for _, si := range s.Spec.Instances {
			inst := Instance{Name: si.Name, Node: node, Standby: si.Standby, Created: si.Created.Time, State: serverlessv1.InstancePending,
				Sessions: perInstance[si.Name], NodeLost: lost, NodeReady: ready}
			if r, ok := st[si.Name]; ok && r.State != "" {
				inst.State = r.State
				if r.Since != nil {
					inst.Since = r.Since.Time
				}
				// A serving instance still holding a session whose object
				// is gone (closing) has no room for another yet.
				if r.State == serverlessv1.InstanceRunning || r.State == serverlessv1.InstanceActivating {
					inst.Sessions = max(inst.Sessions, len(r.Sessions))
				}
			}
			in.Instances = append(in.Instances, inst)
		}
	}
	sort.Slice(in.Instances, func(i, j int) bool { return in.Instances[i].Name < in.Instances[j].Name })
	return in
}

func statusByName(s *serverlessv1.InstanceSlice) map[string]*serverlessv1.InstanceStatus {
	out := make(map[string]*serverlessv1.InstanceStatus, len(s.Status.Instances))
	for i := range s.Status.Instances {
		out[s.Status.Instances[i].Name] = &s.Status.Instances[i]
	}
	return out
}

// nodeLost: the node is deleted, Offline or Revoked: no hub will report
// for its instances and sessions again (as taskctl decides NodeLost).
func nodeLost(n *fleetv1.FleetNode) bool {
	return n == nil || n.Status.Phase == fleetv1.FleetNodeOffline || n.Status.Phase == fleetv1.FleetNodeRevoked
}

// Reconcile keeps one Application's instances and binds its sessions.
func (c *Controller) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock.Now()
	v, err := c.load(ctx, req.NamespacedName, now)
	if err != nil {
		return ctrl.Result{}, err
	}
	var wake time.Duration
	soon := func(d time.Duration) {
		if d > 0 && (wake == 0 || d < wake) {
			wake = d
		}
	}
	soon(c.closeLost(ctx, v, now))
	if v.app == nil {
		// Gone or going: its slices go by owner reference; its sessions
		// are closed.
		if err := c.closeAll(ctx, v, now); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{RequeueAfter: wake}, nil
	}
	app := v.app
	var pending []Pending
	for _, s := range v.pending {
		if app.Spec.Mode == serverlessv1.ModeDaemon {
			c.endSession(ctx, s, serverlessv1.ReasonApplicationIsDaemon,
				fmt.Sprintf("application %s runs as a daemon and serves no sessions", app.Name), now)
			continue
		}
		pending = append(pending, Pending{Key: s.Name, Created: s.CreationTimestamp.Time})
	}
	in := c.input(v, now, pending)
	d := decide(in)
	log.FromContext(ctx).V(1).Info("decided", "instances", len(in.Instances), "pending", len(pending), "remove", d.Remove, "add", len(d.Add), "bind", len(d.Bind), "now", now)
	soon(d.Requeue)
	res, err := c.apply(ctx, v, d, now)
	if err != nil {
		return ctrl.Result{}, err
	}
	for _, s := range v.pending {
		if b, ok := res.bound[s.Name]; ok {
			if err := c.bind(ctx, s, b, now); err != nil {
				return ctrl.Result{}, err
			}
		}
		if msg, ok := res.noCapacity[s.Name]; ok {
			c.endSession(ctx, s, serverlessv1.ReasonNoCapacity, msg, now)
		}
	}
	if err := c.writeStatus(ctx, v, d, res, now); err != nil {
		return ctrl.Result{}, err
	}
	if res.retry {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	return ctrl.Result{RequeueAfter: wake}, nil
}
