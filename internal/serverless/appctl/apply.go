package appctl

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	serverlessv1 "github.com/drover-fleet/drover/api/serverless/v1alpha1"
	"github.com/drover-fleet/drover/internal/kname"
	"github.com/drover-fleet/drover/internal/scheduler"
	"github.com/drover-fleet/drover/internal/tenancy"
)

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
