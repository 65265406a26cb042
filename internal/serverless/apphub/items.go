package apphub

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	serverlessv1 "github.com/drover-fleet/drover/api/serverless/v1alpha1"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/serverless/appwire"
	"github.com/drover-fleet/drover/internal/task/taskwire"
)

// MaxSpecBytes bounds one item's spec: every item of a node travels in one
// snapshot (protocol.MaxEnvelopeBytes), so a few huge Applications must
// not keep their node from connecting.
const MaxSpecBytes = 64 << 10

// ErrSpecTooLarge is wrapped by the error of an item over MaxSpecBytes.
var ErrSpecTooLarge = errors.New("work item too large")

func probe(p *serverlessv1.Probe) *appwire.Probe {
	if p == nil {
		return nil
	}
	out := &appwire.Probe{Exec: p.Exec, TCP: p.TCP, TimeoutSeconds: p.TimeoutSeconds}
	if p.HTTPGet != nil {
		out.HTTPPath = p.HTTPGet.Path
	}
	return out
}

// InstanceSpec is the PodCreate of the instance in of app.
func InstanceSpec(app *serverlessv1.Application, in serverlessv1.SliceInstance) *appwire.InstanceSpec {
	s := &appwire.InstanceSpec{
		Namespace: app.Namespace, Application: app.Name, Name: in.Name,
		Standby: in.Standby, Daemon: app.Spec.Mode == serverlessv1.ModeDaemon,
		Runtime: app.Spec.Runtime, Image: app.Spec.Image, Command: app.Spec.Command,
		Liveness: probe(app.Spec.LivenessProbe), Readiness: probe(app.Spec.ReadinessProbe),
		Config:                  app.Spec.Config,
		SessionsPerInstance:     int(app.Spec.Scaling.SessionsPerInstance),
		EvacuationTimeoutMillis: appwire.Millis(app.Spec.Session.EvacuationTimeout.Duration),
	}
	if s.Runtime != serverlessv1.RuntimeContainer {
		// The image is the container runtime's only.
		s.Image = ""
	}
	for _, e := range app.Spec.Env {
		s.Env = append(s.Env, e.Name+"="+e.Value)
	}
	for _, a := range app.Spec.Artifacts {
		s.Artifacts = append(s.Artifacts, taskwire.Artifact{URL: a.URL, SHA256: a.SHA256, Path: a.Path, Executable: a.Executable})
	}
	if sc := app.Spec.SecurityContext; sc != nil {
		s.RunAsUser, s.RunAsGroup = sc.RunAsUser, sc.RunAsGroup
	}
	if q, ok := app.Spec.Resources[corev1.ResourceMemory]; ok {
		s.MemoryBytes = q.Value()
	}
	if q, ok := app.Spec.Resources[corev1.ResourceCPU]; ok {
		s.CPUMillis = q.MilliValue()
	}
	if len(app.Spec.Ports) > 0 {
		s.PortName = app.Spec.Ports[0].Name
	}
	return s
}

// openTimeout is sess's open timeout: its own, else its Application's
// (app may be nil: 0, the agent's default).
func openTimeout(app *serverlessv1.Application, sess *serverlessv1.ApplicationSession) int64 {
	if sess.Spec.OpenTimeout != nil {
		return appwire.Millis(sess.Spec.OpenTimeout.Duration)
	}
	if app != nil {
		return appwire.Millis(app.Spec.Session.OpenTimeout.Duration)
	}
	return 0
}

// SessionSpec is the SessionStart of sess, bound to the instance whose
// slice entry uid is instID. app may be nil (gone): the agent's defaults.
func SessionSpec(app *serverlessv1.Application, sess *serverlessv1.ApplicationSession, instID string) *appwire.SessionSpec {
	s := &appwire.SessionSpec{
		Namespace: sess.Namespace, Application: sess.Spec.Application, Name: sess.Name,
		Instance: appwire.InstanceWorkID(instID), Data: sess.Spec.Data,
		OpenTimeoutMillis: openTimeout(app, sess),
	}
	if app != nil {
		p := app.Spec.Session
		s.HeartbeatIntervalMillis = appwire.Millis(p.HeartbeatInterval.Duration)
		s.HeartbeatMisses = int(p.HeartbeatMisses)
		s.EvacuationTimeoutMillis = appwire.Millis(p.EvacuationTimeout.Duration)
	}
	return s
}

func encodeItem(uid, typ string, spec interface{ Validate() error }) (*agentv1.WorkItem, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	b, err := appwire.Encode(spec)
	if err != nil {
		return nil, err
	}
	if len(b) > MaxSpecBytes {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", ErrSpecTooLarge, len(b), MaxSpecBytes)
	}
	return &agentv1.WorkItem{Uid: uid, Type: typ, Spec: b}, nil
}

// InstanceItem is the work item of instance in of app.
func InstanceItem(app *serverlessv1.Application, in serverlessv1.SliceInstance) (*agentv1.WorkItem, error) {
	it, err := encodeItem(appwire.InstanceWorkID(in.UID), appwire.TypeInstance, InstanceSpec(app, in))
	if err != nil {
		return nil, fmt.Errorf("instance %s of application %s/%s: %w", in.Name, app.Namespace, app.Name, err)
	}
	return it, nil
}

// SessionItem is the work item of sess, bound to instance instID.
func SessionItem(app *serverlessv1.Application, sess *serverlessv1.ApplicationSession, instID string) (*agentv1.WorkItem, error) {
	it, err := encodeItem(appwire.SessionWorkID(string(sess.UID)), appwire.TypeSession, SessionSpec(app, sess, instID))
	if err != nil {
		return nil, fmt.Errorf("session %s/%s: %w", sess.Namespace, sess.Name, err)
	}
	return it, nil
}

// active reports whether sess belongs on its node: bound, not ended, not
// being deleted.
func active(sess *serverlessv1.ApplicationSession) bool {
	return sess.DeletionTimestamp == nil && sess.Spec.NodeName != "" && sess.Spec.InstanceName != "" &&
		!sess.Status.Phase.Final()
}

// application reads namespace/name from the cache; nil when it is not
// there.
func (f *Feature) application(ctx context.Context, namespace, name string) *serverlessv1.Application {
	var app serverlessv1.Application
	if err := f.opts.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, &app); err != nil {
		return nil
	}
	return &app
}

// instanceOf finds the slice entry sess is bound to: the uid of the
// instance spec.instanceName in the slice of its Application on its node.
func (f *Feature) instanceOf(ctx context.Context, sess *serverlessv1.ApplicationSession) (slice types.NamespacedName, in serverlessv1.SliceInstance, ok bool) {
	var l serverlessv1.InstanceSliceList
	if err := f.opts.Client.List(ctx, &l, client.InNamespace(sess.Namespace),
		client.MatchingFields{IndexSliceNode: sess.Spec.NodeName}, client.UnsafeDisableDeepCopy); err != nil {
		return slice, in, false
	}
	for i := range l.Items {
		s := &l.Items[i]
		if s.Spec.Application != sess.Spec.Application || s.DeletionTimestamp != nil {
			continue
		}
		for _, e := range s.Spec.Instances {
			if e.Name == sess.Spec.InstanceName {
				return client.ObjectKeyFromObject(s), e, true
			}
		}
	}
	return slice, in, false
}

// WorkFor implements hub.Feature: every instance of node's InstanceSlices
// and every bound session of node that has not ended and is not being
// deleted. An agent that does not name protocol.FeatureApps gets none.
// It replaces what this hub recorded as sent to node.
func (f *Feature) WorkFor(ctx context.Context, node string) ([]*agentv1.WorkItem, error) {
	if !f.synced.Load() {
		// An empty list would make the agent stop its instances.
		return nil, errNotReady
	}
	h := f.getHub()
	if h == nil {
		return nil, errors.New("the application feature is not attached to a hub yet; reconnect shortly")
	}
	if err := canSend(h, node); err != nil {
		f.log.Info("no applications for this node", "node", node, "why", err)
		return nil, nil
	}
	var slices serverlessv1.InstanceSliceList
	if err := f.opts.Client.List(ctx, &slices, client.MatchingFields{IndexSliceNode: node}); err != nil {
		return nil, fmt.Errorf("list the instance slices of node %s: %w", node, err)
	}
	var sessions serverlessv1.ApplicationSessionList
	if err := f.opts.Client.List(ctx, &sessions, client.MatchingFields{IndexSessionNode: node}); err != nil {
		return nil, fmt.Errorf("list the sessions of node %s: %w", node, err)
	}
	type appKey struct{ ns, app, inst string }
	entries := map[appKey]string{} // instance → its id
	var out []*agentv1.WorkItem
	sentInsts := map[types.NamespacedName][]serverlessv1.SliceInstance{}
	apps := map[types.NamespacedName]*serverlessv1.Application{}
	appOf := func(ns, name string) *serverlessv1.Application {
		k := types.NamespacedName{Namespace: ns, Name: name}
		if a, ok := apps[k]; ok {
			return a
		}
		a := f.application(ctx, ns, name)
		apps[k] = a
		return a
	}
	for i := range slices.Items {
		s := &slices.Items[i]
		if s.DeletionTimestamp != nil {
			continue
		}
		app := appOf(s.Namespace, s.Spec.Application)
		if app == nil {
			f.log.Info("instance slice of a missing application: its instances are not sent", "slice", client.ObjectKeyFromObject(s))
			continue
		}
		for _, in := range s.Spec.Instances {
			it, err := InstanceItem(app, in)
			if err != nil {
				f.log.Error("cannot build an instance's item", "slice", client.ObjectKeyFromObject(s), "instance", in.Name, "err", err)
				continue
			}
			out = append(out, it)
			entries[appKey{s.Namespace, s.Spec.Application, in.Name}] = in.UID
			k := client.ObjectKeyFromObject(s)
			sentInsts[k] = append(sentInsts[k], in)
		}
	}
	var sentSess []*serverlessv1.ApplicationSession
	for i := range sessions.Items {
		s := &sessions.Items[i]
		if !active(s) {
			continue
		}
		id, ok := entries[appKey{s.Namespace, s.Spec.Application, s.Spec.InstanceName}]
		if !ok {
			// Its instance is not on the node's slices (yet): the session's
			// reconcile sends it once it is.
			continue
		}
		it, err := SessionItem(appOf(s.Namespace, s.Spec.Application), s, id)
		if err != nil {
			f.log.Error("cannot build a session's item", "session", client.ObjectKeyFromObject(s), "err", err)
			continue
		}
		out = append(out, it)
		sentSess = append(sentSess, s)
	}

	f.mu.Lock()
	// The snapshot replaces what the node holds: what it leaves out the
	// agent cancels.
	for _, ir := range f.insts {
		if ir.node == node {
			ir.sent = false
		}
	}
	for _, sr := range f.sessUID {
		if sr.node == node {
			sr.sent = false
		}
	}
	for k, ins := range sentInsts {
		r := f.sliceLocked(k, node)
		for _, in := range ins {
			r.insts[in.UID] = struct{}{}
			f.instLocked(in.UID, node, k, in.Name).sent = true
		}
	}
	for _, s := range sentSess {
		r := f.sessLocked(client.ObjectKeyFromObject(s), string(s.UID), node)
		r.sent = true
	}
	f.mu.Unlock()
	f.m.dispatched.Add(float64(len(out)))
	return out, nil
}

// sliceLocked returns k's record, made for node if missing. f.mu is held.
func (f *Feature) sliceLocked(k types.NamespacedName, node string) *sliceRec {
	r := f.slices[k]
	if r == nil {
		r = &sliceRec{node: node, insts: map[string]struct{}{}}
		f.slices[k] = r
	}
	r.node = node
	return r
}

// instLocked returns instance id's record, made if missing. f.mu is held.
func (f *Feature) instLocked(id, node string, slice types.NamespacedName, name string) *instRec {
	r := f.insts[id]
	if r == nil {
		r = &instRec{}
		f.insts[id] = r
	}
	r.node, r.slice, r.name = node, slice, name
	return r
}

// sessLocked returns the session's record, made if missing. f.mu is held.
func (f *Feature) sessLocked(k types.NamespacedName, uid, node string) *sessRec {
	r := f.sessUID[uid]
	if r == nil {
		if old := f.sessions[k]; old != nil {
			// A session of the same name before this one.
			delete(f.sessUID, old.uid)
			if old.node != "" {
				f.rememberGoneLocked(old.work, old.node)
			}
		}
		r = &sessRec{key: k, uid: uid, work: appwire.SessionWorkID(uid)}
		f.sessUID[uid] = r
		f.sessions[k] = r
	}
	if node != "" {
		r.node = node
	}
	return r
}
