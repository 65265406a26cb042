package apphub

import (
	"cmp"
	"context"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	serverlessv1 "github.com/drover-fleet/drover/api/serverless/v1alpha1"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/serverless/appwire"
	"github.com/drover-fleet/drover/internal/task/taskwire"
)

func final(phase string) bool {
	return phase == taskwire.PhaseSucceeded || phase == taskwire.PhaseFailed || phase == taskwire.PhaseCancelled
}

// WorkStatus implements hub.Feature. It only records the report and
// queues the write: the writers talk to the API.
func (f *Feature) WorkStatus(ctx context.Context, node string, st *agentv1.WorkStatus) {
	f.m.reports.Inc()
	switch kind, id := appwire.ParseWorkID(st.GetUid()); kind {
	case appwire.TypeInstance:
		r, err := appwire.DecodeInstanceReport(st.GetMessage())
		if err != nil {
			f.log.Warn("instance report is not an appwire.InstanceReport", "node", node, "work", st.GetUid(), "err", err)
		}
		f.instanceReport(ctx, node, id, st.GetPhase(), st.GetReason(), &r)
	case appwire.TypeSession:
		r, err := appwire.DecodeSessionReport(st.GetMessage())
		if err != nil {
			f.log.Warn("session report is not an appwire.SessionReport", "node", node, "work", st.GetUid(), "err", err)
		}
		f.sessionReport(ctx, node, id, st.GetPhase(), st.GetReason(), &r)
	}
}

// NodeState implements hub.Feature: the node's whole work replaces what
// this hub knew of it. It carries each item's phase and reason (the
// state), not the reports: what the reports said before is kept for the
// instances and sessions it still lists; the instances it does not list
// lose their status (the agent holds none of them).
func (f *Feature) NodeState(ctx context.Context, node string, work []*agentv1.WorkStatus) {
	seen := map[string]bool{}
	for _, st := range work {
		switch kind, id := appwire.ParseWorkID(st.GetUid()); kind {
		case appwire.TypeInstance:
			seen[id] = true
			f.instanceReport(ctx, node, id, st.GetPhase(), st.GetReason(), nil)
		case appwire.TypeSession:
			f.sessionReport(ctx, node, id, st.GetPhase(), st.GetReason(), nil)
		}
	}
	var dirty []types.NamespacedName
	f.mu.Lock()
	for id, ir := range f.insts {
		if ir.node != node || seen[id] || ir.status == nil {
			continue
		}
		ir.status = nil
		if sr := f.slices[ir.slice]; sr != nil {
			sr.dirty = true
			dirty = append(dirty, ir.slice)
		}
	}
	f.mu.Unlock()
	for _, k := range dirty {
		f.queueSlice(k)
	}
}

// instanceReport records one report (rep nil: from a NodeState) of
// instance id and queues its slice's write if it changed anything.
func (f *Feature) instanceReport(ctx context.Context, node, id, phase, reason string, rep *appwire.InstanceReport) {
	f.mu.Lock()
	ir := f.insts[id]
	f.mu.Unlock()
	if ir == nil {
		s, name := f.sliceOfInstance(ctx, id)
		if s == nil {
			f.log.Debug("report of an instance no slice holds", "node", node, "work", appwire.InstanceWorkID(id))
			return
		}
		k := client.ObjectKeyFromObject(s)
		f.mu.Lock()
		f.sliceLocked(k, node).insts[id] = struct{}{}
		ir = f.instLocked(id, node, k, name)
		f.mu.Unlock()
	}
	state := reason
	if rep != nil && rep.State != "" {
		state = rep.State
	}
	if final(phase) {
		state = string(serverlessv1.InstanceTerminated)
	}
	now := f.opts.Clock.Now()
	f.mu.Lock()
	var st serverlessv1.InstanceStatus
	if ir.status != nil {
		st = *ir.status.DeepCopy()
	}
	st.Name = ir.name
	if state != "" {
		st.State = serverlessv1.InstanceState(state)
	}
	if rep != nil {
		if rep.Port > 0 {
			st.Port = int32(rep.Port)
		}
		st.Sessions = f.sessionNamesLocked(rep.Sessions)
		st.Reason, st.Message = rep.Reason, truncate(rep.Message, 1024)
		if t, err := time.Parse(time.RFC3339Nano, rep.Since); err == nil {
			mt := metav1.NewTime(t)
			st.Since = &mt
		}
	}
	if st.State == "" {
		st.State = serverlessv1.InstanceCreating
	}
	changed := ir.status == nil || !equalInstance(*ir.status, st)
	if changed {
		ir.status = &st
		if ir.reportedAt.IsZero() {
			ir.reportedAt = now
		}
		if sr := f.slices[ir.slice]; sr != nil {
			sr.dirty = true
		}
	}
	k := ir.slice
	f.mu.Unlock()
	if changed {
		f.queueSlice(k)
	}
}

func equalInstance(a, b serverlessv1.InstanceStatus) bool {
	return a.Name == b.Name && a.State == b.State && a.Port == b.Port && slices.Equal(a.Sessions, b.Sessions) &&
		a.Reason == b.Reason && a.Message == b.Message && a.Since.Equal(b.Since)
}

// sessionNamesLocked maps session work uids to the names of their
// ApplicationSessions, as far as this hub knows them (others keep their
// uid). f.mu is held.
func (f *Feature) sessionNamesLocked(works []string) []string {
	if len(works) == 0 {
		return nil
	}
	out := make([]string, 0, len(works))
	for _, w := range works {
		_, id := appwire.ParseWorkID(w)
		if r := f.sessUID[id]; r != nil {
			out = append(out, r.key.Name)
		} else {
			out = append(out, w)
		}
	}
	return out
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// queueSlice queues k's write: at once if the slice was not written
// within SliceWriteInterval, else when it ends.
func (f *Feature) queueSlice(k types.NamespacedName) {
	f.mu.Lock()
	var wait time.Duration
	if sr := f.slices[k]; sr != nil && !sr.lastWrite.IsZero() {
		wait = sr.lastWrite.Add(f.opts.SliceWriteInterval).Sub(f.opts.Clock.Now())
	}
	f.mu.Unlock()
	if wait > 0 {
		f.sliceQ.AddAfter(k, wait)
	} else {
		f.sliceQ.Add(k)
	}
}

// writeSlice writes what the reports of slice k's instances say into its
// status, at most once per SliceWriteInterval.
func (f *Feature) writeSlice(ctx context.Context, k types.NamespacedName) (time.Duration, error) {
	now := f.opts.Clock.Now()
	f.mu.Lock()
	sr := f.slices[k]
	if sr == nil || !sr.dirty {
		f.mu.Unlock()
		return 0, nil
	}
	if wait := sr.lastWrite.Add(f.opts.SliceWriteInterval).Sub(now); !sr.lastWrite.IsZero() && wait > 0 {
		f.mu.Unlock()
		return wait, nil
	}
	byName := map[string]serverlessv1.InstanceStatus{}
	var oldest time.Time
	for id := range sr.insts {
		ir := f.insts[id]
		if ir == nil || ir.status == nil {
			continue
		}
		byName[ir.name] = *ir.status.DeepCopy()
		if !ir.reportedAt.IsZero() && (oldest.IsZero() || ir.reportedAt.Before(oldest)) {
			oldest = ir.reportedAt
		}
		ir.reportedAt = time.Time{}
	}
	node := sr.node
	sr.dirty, sr.lastWrite = false, now
	f.mu.Unlock()
	fail := func(err error) (time.Duration, error) {
		f.mu.Lock()
		if sr := f.slices[k]; sr != nil {
			sr.dirty = true
		}
		f.mu.Unlock()
		return 0, err
	}

	var s serverlessv1.InstanceSlice
	if err := f.opts.Client.Get(ctx, k, &s); err != nil {
		if apierrors.IsNotFound(err) {
			return 0, nil
		}
		return fail(err)
	}
	st := serverlessv1.InstanceSliceStatus{Address: s.Status.Address}
	if h := f.getHub(); h != nil {
		st.Address = cmp.Or(h.Address(node), st.Address)
	}
	for _, in := range s.Spec.Instances {
		is, ok := byName[in.Name]
		if !ok {
			continue
		}
		st.Instances = append(st.Instances, is)
		if is.State != serverlessv1.InstanceTerminated {
			st.Count++
		}
		if is.State == serverlessv1.InstanceStandby {
			st.Standby++
		}
	}
	if sameSlice(&s.Status, &st) {
		return 0, nil
	}
	t := metav1.NewTime(now)
	st.UpdateTime = &t
	patch := client.MergeFrom(s.DeepCopy())
	s.Status = st
	if err := f.opts.Client.Status().Patch(ctx, &s, patch); err != nil {
		if apierrors.IsNotFound(err) {
			return 0, nil
		}
		return fail(err)
	}
	f.m.sliceWrites.Inc()
	if !oldest.IsZero() {
		f.m.lag.WithLabelValues("instance").Observe(f.opts.Clock.Since(oldest).Seconds())
	}
	return 0, nil
}

// sameSlice reports whether a and b say the same (updateTime aside).
func sameSlice(a, b *serverlessv1.InstanceSliceStatus) bool {
	if a.Address != b.Address || a.Count != b.Count || a.Standby != b.Standby || len(a.Instances) != len(b.Instances) {
		return false
	}
	for i := range a.Instances {
		if !equalInstance(a.Instances[i], b.Instances[i]) {
			return false
		}
	}
	return true
}

// visible reports whether a user sees phase p written: the short-lived
// Starting and ReadinessChecking are not (the open-path budget is two
// writes: the binding and Ready).
func visible(p serverlessv1.SessionPhase) bool {
	switch p {
	case serverlessv1.SessionReady, serverlessv1.SessionLive, serverlessv1.SessionEvacuating, serverlessv1.SessionTerminated:
		return true
	}
	return false
}

// sessionReport records one report (rep nil: from a NodeState) of the
// session with uid and queues its write if a user would see the change.
func (f *Feature) sessionReport(ctx context.Context, node, uid, phase, reason string, rep *appwire.SessionReport) {
	f.mu.Lock()
	rec := f.sessUID[uid]
	f.mu.Unlock()
	if rec == nil {
		s := f.sessionByUID(ctx, uid)
		if s == nil {
			f.log.Debug("report of a session that is gone", "node", node, "work", appwire.SessionWorkID(uid))
			return
		}
		f.mu.Lock()
		rec = f.sessLocked(client.ObjectKeyFromObject(s), uid, node)
		f.mu.Unlock()
	}
	state := reason
	if rep != nil && rep.State != "" {
		state = rep.State
	}
	ph := serverlessv1.SessionPhase(state)
	if final(phase) {
		ph = serverlessv1.SessionTerminated
	}
	now := f.opts.Clock.Now()
	f.mu.Lock()
	w := rec.want
	if w.phase == serverlessv1.SessionTerminated {
		f.mu.Unlock()
		return // ended: a late or repeated report changes nothing
	}
	if ph != "" {
		w.phase = ph
	}
	if rep != nil {
		if rep.Port > 0 {
			w.port = rep.Port
		}
		w.flagged, w.clients = rep.Flagged, rep.Clients
		if t, err := time.Parse(time.RFC3339Nano, rep.ReadyTime); err == nil {
			w.readyTime = t
		}
		w.reason, w.message = rep.Reason, truncate(rep.Message, 1024)
	}
	if w.phase == serverlessv1.SessionTerminated {
		w.reason = terminatedReason(reason, w.reason, rec.hbCancelled)
	}
	write := (visible(w.phase) && w.phase != rec.written.phase) || w.flagged != rec.written.flagged ||
		(visible(w.phase) && !slices.Equal(w.clients, rec.written.clients))
	check := false
	switch {
	case w.flagged && rec.flaggedSince.IsZero():
		rec.flaggedSince, check = now, true
	case !w.flagged:
		rec.flaggedSince = time.Time{}
	}
	rec.want = w
	if write {
		rec.dirty = true
		if rec.reportedAt.IsZero() {
			rec.reportedAt = now
		}
	}
	k := rec.key
	f.mu.Unlock()
	if write || check {
		f.sessQ.Add(k)
	}
}

// terminatedReason is the reason of a session that ended: the report's,
// else the WorkStatus's unless it is only the state's name.
func terminatedReason(statusReason, reportReason string, hbCancelled bool) string {
	r := reportReason
	if r == "" && statusReason != string(serverlessv1.SessionTerminated) && statusReason != "" {
		r = statusReason
	}
	if r == "" || r == taskwire.ReasonCancelled {
		r = serverlessv1.ReasonClosed
	}
	if hbCancelled && r == serverlessv1.ReasonClosed {
		r = serverlessv1.ReasonHeartbeatLost
	}
	return r
}

// defaultOpenTimeout is the API's default session.openTimeout, for a
// session whose Application is gone.
const defaultOpenTimeout = 10 * time.Second

// syncSession writes the session's status as its reports ask, and applies
// the heartbeat policy.
func (f *Feature) syncSession(ctx context.Context, k types.NamespacedName) (time.Duration, error) {
	f.mu.Lock()
	rec := f.sessions[k]
	if rec == nil {
		f.mu.Unlock()
		return 0, nil
	}
	w, dirty, reportedAt, node := rec.want, rec.dirty, rec.reportedAt, rec.node
	w.clients = slices.Clone(w.clients)
	f.mu.Unlock()

	var s serverlessv1.ApplicationSession
	if err := f.opts.Client.Get(ctx, k, &s); err != nil {
		if apierrors.IsNotFound(err) {
			return 0, nil
		}
		return 0, err
	}
	if string(s.UID) != rec.uid {
		return 0, nil // another session of the same name
	}
	app := f.application(ctx, s.Namespace, s.Spec.Application)
	if dirty && !s.Status.Phase.Final() {
		if err := f.writeSession(ctx, &s, app, node, w); err != nil {
			return 0, err
		}
		f.mu.Lock()
		rec.written = w
		// Only what this write carried: a report since waits for the
		// next one (it queued the session again).
		if rec.want.phase == w.phase && rec.want.flagged == w.flagged && slices.Equal(rec.want.clients, w.clients) {
			rec.dirty = false
		}
		if rec.reportedAt.Equal(reportedAt) {
			rec.reportedAt = time.Time{}
		}
		f.mu.Unlock()
		if !reportedAt.IsZero() {
			f.m.lag.WithLabelValues("session").Observe(f.opts.Clock.Since(reportedAt).Seconds())
		}
	} else if dirty {
		f.mu.Lock()
		rec.dirty = false
		f.mu.Unlock()
	}
	return f.heartbeatPolicy(&s, app, rec)
}

// writeSession patches s's status to what w says.
func (f *Feature) writeSession(ctx context.Context, s *serverlessv1.ApplicationSession, app *serverlessv1.Application, node string, w sessWant) error {
	orig := s.DeepCopy()
	st := &s.Status
	now := metav1.NewTime(f.opts.Clock.Now())
	if visible(w.phase) {
		st.Phase = w.phase
	}
	st.Flagged = w.flagged
	if len(w.clients) > 256 {
		w.clients = w.clients[:256]
	}
	st.Clients = w.clients
	switch w.phase {
	case serverlessv1.SessionReady, serverlessv1.SessionLive:
		if w.port == 0 {
			w.port = f.instancePort(ctx, s)
		}
		if st.Endpoint == nil || (w.port > 0 && st.Endpoint.Port != int32(w.port)) {
			st.Endpoint = &serverlessv1.Endpoint{Host: f.nodeAddress(ctx, s, node), Port: int32(w.port)}
			if app != nil && len(app.Spec.Ports) > 0 {
				st.Endpoint.Name = app.Spec.Ports[0].Name
			}
		}
		if st.ReadyTime == nil {
			rt := now
			if !w.readyTime.IsZero() {
				rt = metav1.NewTime(w.readyTime)
			}
			st.ReadyTime = &rt
		}
		st.Reason, st.Message = "", ""
	case serverlessv1.SessionEvacuating:
		st.Reason, st.Message = cmp.Or(w.reason, st.Reason), w.message
	case serverlessv1.SessionTerminated:
		st.Reason, st.Message = w.reason, w.message
		st.CloseTime = &now
	}
	if err := f.opts.Client.Status().Patch(ctx, s, client.MergeFrom(orig)); err != nil {
		return err
	}
	f.m.sessionWrites.Inc()
	switch {
	case w.phase == serverlessv1.SessionTerminated:
		f.m.closed.WithLabelValues(w.reason).Inc()
		typ := corev1.EventTypeNormal
		if w.reason != serverlessv1.ReasonClosed && w.reason != serverlessv1.ReasonClosedByInstance {
			typ = corev1.EventTypeWarning
		}
		f.event(s, typ, w.reason, "Close", "session terminated on node %s: %s %s", node, w.reason, w.message)
	case w.phase.Open() && orig.Status.ReadyTime == nil:
		f.m.opened.Inc()
	}
	return nil
}

// instancePort is the host port the instance of s last reported; 0 when
// unknown.
func (f *Feature) instancePort(ctx context.Context, s *serverlessv1.ApplicationSession) int {
	_, in, ok := f.instanceOf(ctx, s)
	if !ok {
		return 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if ir := f.insts[in.UID]; ir != nil && ir.status != nil {
		return int(ir.status.Port)
	}
	return 0
}

// nodeAddress is the address clients reach node at: its stream's peer IP
// on this hub, else what its slice's status says.
func (f *Feature) nodeAddress(ctx context.Context, s *serverlessv1.ApplicationSession, node string) string {
	if h := f.getHub(); h != nil {
		if a := h.Address(node); a != "" {
			return a
		}
	}
	var l serverlessv1.InstanceSliceList
	if err := f.opts.Client.List(ctx, &l, client.InNamespace(s.Namespace), client.MatchingFields{IndexSliceNode: node},
		client.UnsafeDisableDeepCopy); err == nil {
		for i := range l.Items {
			if l.Items[i].Status.Address != "" {
				return l.Items[i].Status.Address
			}
		}
	}
	return node
}

// heartbeatPolicy closes a session its instance has flagged for longer
// than its open timeout, unless its Application says Flag. It returns
// when to look again.
func (f *Feature) heartbeatPolicy(s *serverlessv1.ApplicationSession, app *serverlessv1.Application, rec *sessRec) (time.Duration, error) {
	f.mu.Lock()
	since, done, node, work := rec.flaggedSince, rec.hbCancelled, rec.node, rec.work
	f.mu.Unlock()
	if since.IsZero() || done || s.Status.Phase.Final() || s.DeletionTimestamp != nil {
		return 0, nil
	}
	if app != nil && app.Spec.Session.OnHeartbeatLost == "Flag" {
		return 0, nil
	}
	timeout := time.Duration(openTimeout(app, s)) * time.Millisecond
	if timeout <= 0 {
		timeout = defaultOpenTimeout
	}
	if wait := since.Add(timeout).Sub(f.opts.Clock.Now()); wait > 0 {
		return wait, nil
	}
	h := f.getHub()
	if h == nil || !h.Connected(node) {
		return 0, nil // the hub it reconnects to flags it again
	}
	if err := h.Cancel(node, work); err != nil {
		return 0, err
	}
	f.mu.Lock()
	rec.hbCancelled = true
	f.mu.Unlock()
	f.m.cancels.Inc()
	f.log.Info("session closed: its heartbeats stopped", "session", rec.key, "node", node, "flaggedFor", f.opts.Clock.Since(since).String())
	f.event(s, corev1.EventTypeWarning, ReasonHeartbeatLost, "Close",
		"the instance's heartbeats for the session stopped %s ago (longer than the open timeout %s): closing it", f.opts.Clock.Since(since).Round(time.Second), timeout)
	return 0, nil
}
