package appctl

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	serverlessv1 "github.com/drover-fleet/drover/api/serverless/v1alpha1"
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/kname"
	"github.com/drover-fleet/drover/internal/scheduler"
	"github.com/drover-fleet/drover/internal/tenancy"
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

// placement is where a new instance goes.
type placement struct {
	inst serverlessv1.SliceInstance
	node string
}

// applied is what apply wrote.
type applied struct {
	bound      map[string]placement // session name -> its instance
	noCapacity map[string]string    // session name -> why
	unplaced   int
	message    string // why the last unplaced instance fits nowhere
	denied     bool
	retry      bool // a slice write conflicted
	created    int
}

// apply places d's new instances, writes the slices and says which
// sessions are bound where. Bindings to an instance whose slice write
// failed are dropped (the next reconcile decides again).
func (c *Controller) apply(ctx context.Context, v *view, d Decision, now time.Time) (*applied, error) {
	app := v.app
	res := &applied{bound: map[string]placement{}, noCapacity: map[string]string{}}
	for _, s := range d.NoCapacity {
		res.noCapacity[s] = fmt.Sprintf("every instance of application %s is serving its %d session(s) and it holds maxInstances (%d)",
			app.Name, max(app.Spec.Scaling.SessionsPerInstance, 1), app.Spec.Scaling.MaxInstances)
	}
	removed := map[string]string{}
	for _, r := range d.Remove {
		removed[r.Name] = r.Reason
	}
	var placed []*placement
	if len(d.Add) > 0 {
		cluster, task, invalid, err := c.cluster(ctx, app)
		if err != nil {
			return nil, err
		}
		// Instances taken out now free their room for the new ones.
		for _, add := range d.Add {
			if task.Key == "" {
				placed = append(placed, nil)
				res.unplaced++
				res.message = invalid
				if add.ForSession != "" {
					res.noCapacity[add.ForSession] = "no node can take a new instance: " + res.message
				}
				continue
			}
			r := cluster.Place(task)
			if r.Node == "" {
				placed = append(placed, nil)
				res.unplaced++
				res.message, res.denied = r.Message, r.Denied != nil
				if add.ForSession != "" {
					res.noCapacity[add.ForSession] = "no node has room for a new instance: " + r.Message
				}
				continue
			}
			name := newInstanceName(app.Name, func(n string) bool {
				if _, ok := v.where[n]; ok {
					return true
				}
				for _, p := range placed {
					if p != nil && p.inst.Name == n {
						return true
					}
				}
				return false
			})
			placed = append(placed, &placement{node: r.Node, inst: serverlessv1.SliceInstance{Name: name, UID: string(uuid.NewUUID()),
				Standby: add.Standby, Generation: app.Generation, Created: metav1.NewTime(now)}})
		}
	}
	// Per node: the slice as it should be.
	byNode := map[string][]*placement{}
	for _, p := range placed {
		if p != nil {
			byNode[p.node] = append(byNode[p.node], p)
		}
	}
	nodes := map[string]bool{}
	for n := range byNode {
		nodes[n] = true
	}
	for n, s := range v.slices {
		for _, in := range s.Spec.Instances {
			if removed[in.Name] != "" {
				nodes[n] = true
			}
		}
		if len(s.Spec.Instances) == 0 && !holdsInstances(s, v.nodes[n]) {
			nodes[n] = true // empty: deleted
		}
	}
	failed := map[string]bool{}
	removedBy := map[string]int{}
	for _, n := range sortedKeys(nodes) {
		before := v.slices[n]
		ok, err := c.writeSlice(ctx, v, n, removed, byNode[n], now)
		if err != nil {
			return nil, err
		}
		if !ok {
			failed[n] = true
			res.retry = true
			continue
		}
		if before != nil {
			for _, in := range before.Spec.Instances {
				if r := removed[in.Name]; r != "" {
					removedBy[r]++
					instancesRemoved.WithLabelValues(r).Inc()
				}
			}
		}
		res.created += len(byNode[n])
		instancesAdded.Add(float64(len(byNode[n])))
	}
	for _, b := range d.Bind {
		var p *placement
		if b.Instance != "" {
			p = &placement{node: v.where[b.Instance], inst: serverlessv1.SliceInstance{Name: b.Instance}}
		} else {
			p = placed[b.NewIndex]
		}
		if p != nil && !failed[p.node] {
			res.bound[b.Session] = *p
		}
	}
	if c.rec != nil {
		if res.created > 0 {
			c.rec.Eventf(app, nil, corev1.EventTypeNormal, ReasonInstancesCreated, "Scale", "created %d instance(s)", res.created)
		}
		for _, r := range sortedKeys(removedBy) {
			typ := corev1.EventTypeNormal
			if r == RemoveNodeLost || r == RemoveTerminated {
				typ = corev1.EventTypeWarning
			}
			c.rec.Eventf(app, nil, typ, r, "Scale", "removed %d instance(s): %s", removedBy[r], removeWhy(r))
		}
	}
	return res, nil
}

func removeWhy(r string) string {
	switch r {
	case RemoveNodeLost:
		return "their node is lost (Offline, Revoked or deleted)"
	case RemoveTerminated:
		return "their hub reported them Terminated"
	case RemoveIdle:
		return "idle for idleInstanceTimeout"
	}
	return "more than the scaling asks for"
}

// holdsInstances: the hub still reports instances of the slice that have
// not ended (and can: its node is not lost).
func holdsInstances(s *serverlessv1.InstanceSlice, n *fleetv1.FleetNode) bool {
	if nodeLost(n) {
		return false
	}
	for _, in := range s.Status.Instances {
		if in.State != serverlessv1.InstanceTerminated {
			return true
		}
	}
	return false
}

// writeSlice writes the slice of node: without the removed instances,
// with the added ones; deleted when it holds nothing. false: a conflict
// (the caller retries).
func (c *Controller) writeSlice(ctx context.Context, v *view, node string, removed map[string]string, add []*placement, now time.Time) (bool, error) {
	app := v.app
	cur := v.slices[node]
	var s *serverlessv1.InstanceSlice
	if cur == nil {
		if len(add) == 0 {
			return true, nil
		}
		s = &serverlessv1.InstanceSlice{ObjectMeta: metav1.ObjectMeta{Namespace: app.Namespace, Name: SliceName(app.Name, node),
			Labels: map[string]string{serverlessv1.LabelApplication: kname.LabelValue(app.Name), serverlessv1.LabelNode: kname.LabelValue(node)}},
			Spec: serverlessv1.InstanceSliceSpec{Application: app.Name, NodeName: node}}
		if err := controllerutil.SetControllerReference(app, s, c.client.Scheme()); err != nil {
			return false, fmt.Errorf("own InstanceSlice %s: %w", s.Name, err)
		}
	} else {
		s = cur.DeepCopy()
	}
	kept := s.Spec.Instances[:0]
	for _, in := range s.Spec.Instances {
		if removed[in.Name] == "" {
			kept = append(kept, in)
		}
	}
	s.Spec.Instances = kept
	for _, p := range add {
		s.Spec.Instances = append(s.Spec.Instances, p.inst)
	}
	sk := client.ObjectKeyFromObject(s)
	var err error
	switch {
	case cur == nil:
		err = c.client.Create(ctx, s)
	case len(s.Spec.Instances) == 0 && !holdsInstances(s, v.nodes[node]):
		err = c.client.Delete(ctx, s, client.Preconditions{UID: &s.UID})
		if err == nil || apierrors.IsNotFound(err) {
			c.written[sk] = writtenSlice{uid: s.UID, at: now}
			delete(v.slices, node)
			return true, nil
		}
	case equality.Semantic.DeepEqual(cur.Spec, s.Spec):
		return true, nil
	default:
		// A merge patch of the spec, not an update: the hub writes the
		// status about once a second, and an update would conflict with
		// it. The manager is the spec's one writer, and mu orders its
		// writes; the list is replaced whole.
		err = c.client.Patch(ctx, s, client.MergeFrom(cur))
	}
	switch {
	case apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err):
		log.FromContext(ctx).V(1).Info("InstanceSlice changed meanwhile; deciding again", "InstanceSlice", sk)
		return false, nil
	case err != nil:
		return false, fmt.Errorf("write InstanceSlice %s: %w", sk, err)
	}
	c.written[sk] = writtenSlice{obj: s.DeepCopy(), uid: s.UID, at: now}
	v.slices[node] = s
	for _, in := range s.Spec.Instances {
		v.where[in.Name] = node
	}
	return true, nil
}

// cluster is the fleet as the scheduler sees it, with what every task and
// every instance holds, and the task that stands for one more instance of
// app; when the app's spec cannot be placed at all, its Key is "" and
// invalid says why.
func (c *Controller) cluster(ctx context.Context, app *serverlessv1.Application) (_ *scheduler.Cluster, _ scheduler.Task, invalid string, _ error) {
	var nodes fleetv1.FleetNodeList
	if err := c.client.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return nil, scheduler.Task{}, "", fmt.Errorf("list FleetNodes: %w", err)
	}
	views := make([]scheduler.Node, len(nodes.Items))
	for i := range nodes.Items {
		views[i] = scheduler.NodeFrom(&nodes.Items[i])
	}
	cl := scheduler.New(views)
	var tasks batchv1.TaskList
	if err := c.client.List(ctx, &tasks, client.UnsafeDisableDeepCopy); err != nil {
		return nil, scheduler.Task{}, "", fmt.Errorf("list Tasks: %w", err)
	}
	for i := range tasks.Items {
		t := &tasks.Items[i]
		if t.Status.State.Holds() && t.Status.NodeName != "" {
			cl.Hold(scheduler.Task{Key: t.Namespace + "/" + t.Name, Resources: t.Spec.Resources}, t.Status.NodeName)
		}
	}
	var slices serverlessv1.InstanceSliceList
	if err := c.client.List(ctx, &slices, client.UnsafeDisableDeepCopy); err != nil {
		return nil, scheduler.Task{}, "", fmt.Errorf("list InstanceSlices: %w", err)
	}
	seen := map[types.NamespacedName]bool{}
	resources := map[types.NamespacedName]corev1.ResourceList{}
	hold := func(s *serverlessv1.InstanceSlice) {
		ak := types.NamespacedName{Namespace: s.Namespace, Name: s.Spec.Application}
		res, ok := resources[ak]
		if !ok {
			var a serverlessv1.Application
			if err := c.client.Get(ctx, ak, &a); err == nil {
				res = a.Spec.Resources
			}
			resources[ak] = res
		}
		st := statusByName(s)
		for _, in := range s.Spec.Instances {
			cl.Hold(scheduler.Task{Key: ak.String() + "/" + in.Name, Resources: res}, s.Spec.NodeName)
			delete(st, in.Name)
		}
		// Taken out, but still stopping: their room is not free yet.
		for name, in := range st {
			if in.State != serverlessv1.InstanceTerminated {
				cl.Hold(scheduler.Task{Key: ak.String() + "/" + name, Resources: res}, s.Spec.NodeName)
			}
		}
	}
	for i := range slices.Items {
		s := &slices.Items[i]
		sk := client.ObjectKeyFromObject(s)
		seen[sk] = true
		if w, ok := c.written[sk]; ok && w.uid == s.UID {
			if w.obj == nil {
				continue
			}
			if s.Generation < w.obj.Generation {
				s = w.obj
			}
		}
		hold(s)
	}
	for sk, w := range c.written {
		if !seen[sk] && w.obj != nil {
			hold(w.obj)
		}
	}

	task := scheduler.Task{Key: app.Namespace + "/" + app.Name, Created: app.CreationTimestamp.Time, Resources: app.Spec.Resources}
	if sc := app.Spec.SecurityContext; sc != nil {
		task.Work = tenancy.Work{RunAsUser: sc.RunAsUser, RunAsGroup: sc.RunAsGroup}
	}
	if app.Spec.NodeSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(app.Spec.NodeSelector)
		if err != nil {
			return cl, scheduler.Task{}, "invalid spec.nodeSelector: " + err.Error(), nil
		}
		task.Selector = sel
	}
	policy, err := c.policy(ctx)
	if err != nil {
		return nil, scheduler.Task{}, "", err
	}
	ns := &metav1.PartialObjectMetadata{}
	ns.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
	if err := c.client.Get(ctx, client.ObjectKey{Name: app.Namespace}, ns); client.IgnoreNotFound(err) != nil {
		return nil, scheduler.Task{}, "", fmt.Errorf("get Namespace %s: %w", app.Namespace, err)
	}
	task.Access = policy.For(app.Namespace, ns.Labels)
	return cl, task, "", nil
}

// policy compiles the cluster's NodeGrants; one that does not compile
// grants nothing and gets a Warning Event once per generation.
func (c *Controller) policy(ctx context.Context) (*tenancy.Policy, error) {
	var list fleetv1.NodeGrantList
	if err := c.client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list NodeGrants: %w", err)
	}
	p, errs := tenancy.Compile(list.Items)
	if len(errs) == 0 {
		return p, nil
	}
	for i := range list.Items {
		g := &list.Items[i]
		if _, gerrs := tenancy.Compile(list.Items[i : i+1]); len(gerrs) > 0 && c.badGrants[g.UID] != g.Generation {
			c.badGrants[g.UID] = g.Generation
			log.FromContext(ctx).Error(gerrs[0], "NodeGrant grants nothing until fixed", "NodeGrant", g.Name)
		}
	}
	return p, nil
}

// bind writes s's binding: instance, node and finalizer in one update.
func (c *Controller) bind(ctx context.Context, s *serverlessv1.ApplicationSession, p placement, now time.Time) error {
	s = s.DeepCopy()
	s.Spec.InstanceName, s.Spec.NodeName = p.inst.Name, p.node
	controllerutil.AddFinalizer(s, serverlessv1.FinalizerSession)
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[AnnotationBoundTime] = now.UTC().Format(time.RFC3339Nano)
	// The label costs nothing in the same update and lets people select
	// an Application's sessions (kubectl get sess -l …).
	if s.Labels == nil {
		s.Labels = map[string]string{}
	}
	s.Labels[serverlessv1.LabelApplication] = kname.LabelValue(s.Spec.Application)
	if err := c.client.Update(ctx, s); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return nil // it changed or went: the next reconcile decides again
		}
		return fmt.Errorf("bind ApplicationSession %s/%s: %w", s.Namespace, s.Name, err)
	}
	c.notes[client.ObjectKeyFromObject(s)] = sessionNote{uid: s.UID, instance: p.inst.Name, node: p.node, at: now}
	sessionsBound.Inc()
	log.FromContext(ctx).V(1).Info("session bound", "ApplicationSession", client.ObjectKeyFromObject(s), "instance", p.inst.Name, "node", p.node)
	return nil
}

// endSession writes s Terminated with reason (and removes this feature's
// finalizer: no hub will). Errors are logged: the next reconcile tries
// again.
func (c *Controller) endSession(ctx context.Context, s *serverlessv1.ApplicationSession, reason, msg string, now time.Time) {
	sk := client.ObjectKeyFromObject(s)
	if !s.Status.Phase.Final() {
		u := s.DeepCopy()
		t := metav1.NewTime(now)
		u.Status.Phase, u.Status.Reason, u.Status.Message, u.Status.CloseTime = serverlessv1.SessionTerminated, reason, msg, &t
		u.Status.Endpoint = nil
		if err := c.client.Status().Update(ctx, u); err != nil {
			if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				log.FromContext(ctx).Error(err, "end ApplicationSession", "ApplicationSession", sk, "reason", reason)
			}
			return
		}
		s = u
		sessionsEnded.WithLabelValues(reason).Inc()
		c.notes[sk] = sessionNote{uid: s.UID, ended: true, at: now}
		if c.rec != nil {
			c.rec.Eventf(s, nil, corev1.EventTypeWarning, reason, "Close", "%s", msg)
		}
	}
	c.dropFinalizer(ctx, s)
}

func (c *Controller) dropFinalizer(ctx context.Context, s *serverlessv1.ApplicationSession) {
	if !controllerutil.ContainsFinalizer(s, serverlessv1.FinalizerSession) {
		return
	}
	patch := client.MergeFromWithOptions(s.DeepCopy(), client.MergeFromWithOptimisticLock{})
	u := s.DeepCopy()
	controllerutil.RemoveFinalizer(u, serverlessv1.FinalizerSession)
	if err := c.client.Patch(ctx, u, patch); client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
		log.FromContext(ctx).Error(err, "remove the session finalizer", "ApplicationSession", client.ObjectKeyFromObject(s))
	}
}

// closeLost ends the bound sessions no hub can end: their node is lost,
// their instance is gone from its slice, or they were not ready within
// their open timeout (plus grace). It returns when to look again.
func (c *Controller) closeLost(ctx context.Context, v *view, now time.Time) time.Duration {
	var wake time.Duration
	soon := func(d time.Duration) {
		if d > 0 && (wake == 0 || d < wake) {
			wake = d
		}
	}
	live := map[types.UID]bool{}
	for _, s := range v.sessions {
		live[s.UID] = true
		if s.Spec.InstanceName == "" {
			continue
		}
		n := v.nodes[s.Spec.NodeName]
		if s.Status.Phase.Final() {
			// Ended while its node was lost: nobody else removes it.
			if nodeLost(n) {
				c.dropFinalizer(ctx, s)
			}
			continue
		}
		if nodeLost(n) {
			why := "was deleted"
			if n != nil {
				why = "is " + string(n.Status.Phase)
			}
			c.endSession(ctx, s, serverlessv1.ReasonNodeLost, fmt.Sprintf("node %s %s", s.Spec.NodeName, why), now)
			continue
		}
		if !c.instanceKnown(v, s) {
			first, ok := c.goneSince[s.UID]
			if !ok {
				first = now
				c.goneSince[s.UID] = now
			}
			if end := first.Add(c.opts.InstanceGoneGrace); now.Before(end) {
				soon(end.Sub(now))
			} else {
				c.endSession(ctx, s, serverlessv1.ReasonInstanceGone,
					fmt.Sprintf("instance %s is no longer on node %s", s.Spec.InstanceName, s.Spec.NodeName), now)
				continue
			}
		} else {
			delete(c.goneSince, s.UID)
		}
		switch s.Status.Phase {
		case "", serverlessv1.SessionPending, serverlessv1.SessionStarting, serverlessv1.SessionReadinessChecking:
			timeout := 10 * time.Second
			if v.app != nil && v.app.Spec.Session.OpenTimeout.Duration > 0 {
				timeout = v.app.Spec.Session.OpenTimeout.Duration
			}
			if s.Spec.OpenTimeout != nil && s.Spec.OpenTimeout.Duration > 0 {
				timeout = s.Spec.OpenTimeout.Duration
			}
			end := boundTime(s).Add(timeout + c.opts.SessionGrace)
			if now.Before(end) {
				soon(end.Sub(now))
				continue
			}
			c.endSession(ctx, s, serverlessv1.ReasonOpenTimeout,
				fmt.Sprintf("instance %s did not make the session ready within %s", s.Spec.InstanceName, timeout), now)
		}
	}
	for uid := range c.goneSince {
		if !live[uid] {
			delete(c.goneSince, uid)
		}
	}
	return wake
}

// instanceKnown: s's instance is in its slice's spec or status.
func (c *Controller) instanceKnown(v *view, s *serverlessv1.ApplicationSession) bool {
	sl := v.slices[s.Spec.NodeName]
	if sl == nil {
		return false
	}
	for _, in := range sl.Spec.Instances {
		if in.Name == s.Spec.InstanceName {
			return true
		}
	}
	for _, in := range sl.Status.Instances {
		if in.Name == s.Spec.InstanceName && in.State != serverlessv1.InstanceTerminated {
			return true
		}
	}
	return false
}

// boundTime is when s was bound: the hub's status, else the manager's
// annotation, else its creation (Open creates sessions bound).
func boundTime(s *serverlessv1.ApplicationSession) time.Time {
	if s.Status.BoundTime != nil {
		return s.Status.BoundTime.Time
	}
	if t, err := time.Parse(time.RFC3339Nano, s.Annotations[AnnotationBoundTime]); err == nil {
		return t
	}
	return s.CreationTimestamp.Time
}

// closeAll closes the sessions of an Application that is gone: unbound
// ones end ApplicationNotFound, bound ones are deleted (their hub closes
// them on their instance).
func (c *Controller) closeAll(ctx context.Context, v *view, now time.Time) error {
	closed := 0
	for _, s := range v.sessions {
		switch {
		case s.Spec.InstanceName == "" && !s.Status.Phase.Final():
			c.endSession(ctx, s, serverlessv1.ReasonApplicationNotFound,
				fmt.Sprintf("application %s not found in namespace %s", v.key.Name, v.key.Namespace), now)
		case s.Spec.InstanceName != "" && s.DeletionTimestamp == nil:
			if err := c.client.Delete(ctx, s, client.Preconditions{UID: &s.UID}); client.IgnoreNotFound(err) != nil {
				return fmt.Errorf("close ApplicationSession %s/%s of deleted application: %w", s.Namespace, s.Name, err)
			}
			closed++
		}
	}
	if closed > 0 {
		log.FromContext(ctx).Info("closed the sessions of a deleted application", "Application", v.key, "sessions", closed)
	}
	return nil
}

// writeStatus writes the Application's status when it changed.
func (c *Controller) writeStatus(ctx context.Context, v *view, d Decision, res *applied, now time.Time) error {
	app := v.app
	st := app.Status.DeepCopy()
	st.ObservedGeneration = app.Generation
	st.Instances, st.Nodes = serverlessv1.InstanceCounts{}, 0
	for node, s := range v.slices {
		if len(s.Spec.Instances) > 0 {
			st.Nodes++
		}
		reported := statusByName(s)
		lost := nodeLost(v.nodes[node])
		for _, in := range s.Spec.Instances {
			state := serverlessv1.InstancePending
			if r := reported[in.Name]; r != nil && r.State != "" {
				state = r.State
			}
			delete(reported, in.Name)
			count(&st.Instances, state)
		}
		if !lost {
			for _, r := range reported {
				if r.State != serverlessv1.InstanceTerminated {
					count(&st.Instances, serverlessv1.InstanceTerminating) // taken out, stopping
				}
			}
		}
	}
	st.Sessions = serverlessv1.SessionCounts{}
	for _, s := range v.sessions {
		switch p := s.Status.Phase; {
		case p.Final():
			st.Sessions.Terminated++
		case p.Open():
			st.Sessions.Open++
		case p == serverlessv1.SessionEvacuating || p == serverlessv1.SessionTerminating:
			st.Sessions.Closing++
		case s.Spec.InstanceName == "":
			if _, ok := res.bound[s.Name]; ok {
				st.Sessions.Starting++
			} else if _, ok := res.noCapacity[s.Name]; ok {
				st.Sessions.Terminated++
			} else {
				st.Sessions.Pending++
			}
		default:
			st.Sessions.Starting++
		}
	}
	gen := app.Generation
	switch {
	case res.unplaced > 0:
		reason := ReasonUnschedulable
		if res.denied {
			reason = ReasonNotGranted
		}
		old := meta.FindStatusCondition(st.Conditions, serverlessv1.ConditionSchedulable)
		if c.rec != nil && (old == nil || old.Status != metav1.ConditionFalse || old.Message != res.message) {
			c.rec.Eventf(app, nil, corev1.EventTypeWarning, ReasonFailedScheduling, "Schedule", "%d instance(s) fit nowhere: %s", res.unplaced, res.message)
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: serverlessv1.ConditionSchedulable, Status: metav1.ConditionFalse,
			Reason: reason, Message: res.message, ObservedGeneration: gen, LastTransitionTime: metav1.NewTime(now)})
	case len(d.Add) > 0 || d.Missing == 0 || meta.FindStatusCondition(st.Conditions, serverlessv1.ConditionSchedulable) == nil:
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: serverlessv1.ConditionSchedulable, Status: metav1.ConditionTrue,
			Reason: ReasonPlaced, Message: "new instances find a granted, ready node with room", ObservedGeneration: gen, LastTransitionTime: metav1.NewTime(now)})
	}
	ready := metav1.Condition{Type: serverlessv1.ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonInstancesReady,
		ObservedGeneration: gen, LastTransitionTime: metav1.NewTime(now)}
	held := st.Instances.Total - st.Instances.Terminating
	switch {
	case d.Missing > 0 || st.Instances.Creating > 0:
		ready.Status, ready.Reason = metav1.ConditionFalse, ReasonScaling
		if res.unplaced > 0 {
			ready.Reason = ReasonUnschedulable
			if res.denied {
				ready.Reason = ReasonNotGranted
			}
		}
		ready.Message = fmt.Sprintf("%d instance(s) held, %d starting, %d more wanted", held, st.Instances.Creating, d.Missing)
	default:
		ready.Message = fmt.Sprintf("%d instance(s) held (%d standby)", held, st.Instances.Standby)
	}
	meta.SetStatusCondition(&st.Conditions, ready)
	if equality.Semantic.DeepEqual(st, &app.Status) {
		return nil
	}
	u := app.DeepCopy()
	u.Status = *st
	if err := c.client.Status().Update(ctx, u); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return nil // the change brings the reconcile back
		}
		return fmt.Errorf("update Application %s/%s status: %w", app.Namespace, app.Name, err)
	}
	return nil
}

func count(c *serverlessv1.InstanceCounts, s serverlessv1.InstanceState) {
	switch s {
	case serverlessv1.InstanceTerminated:
		return
	case serverlessv1.InstanceStandby:
		c.Standby++
	case serverlessv1.InstanceIdle:
		c.Idle++
	case serverlessv1.InstanceActivating, serverlessv1.InstanceRunning:
		c.Serving++
	case serverlessv1.InstanceEvacuating, serverlessv1.InstanceTerminating:
		c.Terminating++
	default:
		c.Creating++
	}
	c.Total++
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
