package apphub

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	serverlessv1 "github.com/drover-fleet/drover/api/serverless/v1alpha1"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/serverless/appwire"
	"github.com/drover-fleet/drover/internal/task/taskwire"
	"github.com/drover-fleet/drover/internal/testenv"
)

// application creates an Application with most fields set, as the API's
// defaults complete it.
func (fx *fixture) application(name string) *serverlessv1.Application {
	fx.t.Helper()
	app := &serverlessv1.Application{
		ObjectMeta: metav1.ObjectMeta{Namespace: fx.ns, Name: name},
		Spec: serverlessv1.ApplicationSpec{
			Command: []string{"/usr/bin/echo-session", "--flag"},
			Env:     []batchv1.EnvVar{{Name: "GREETING", Value: "hello"}},
			Artifacts: []batchv1.Artifact{{URL: "https://example.com/data.bin",
				SHA256: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", Path: "data.bin"}},
			Config:          map[string]string{"level": "3"},
			SecurityContext: &batchv1.TaskSecurityContext{RunAsUser: ptr.To[int64](1234)},
			Resources: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"),
				corev1.ResourceMemory: resource.MustParse("64Mi")},
			Ports:          []serverlessv1.Port{{Name: "game"}},
			LivenessProbe:  &serverlessv1.Probe{TCP: true},
			ReadinessProbe: &serverlessv1.Probe{HTTPGet: &serverlessv1.HTTPGetProbe{Path: "/ready"}, TimeoutSeconds: 2},
			Mode:           serverlessv1.ModeSessions,
			Runtime:        serverlessv1.RuntimeProcess,
			Scaling: serverlessv1.Scaling{MaxInstances: 10, StandbyInstances: ptr.To[int32](1), Burst: 2, SessionsPerInstance: 2,
				IdleInstanceTimeout: metav1.Duration{Duration: 5 * time.Minute}},
			Session: serverlessv1.SessionPolicy{OpenTimeout: metav1.Duration{Duration: 4 * time.Second},
				HeartbeatInterval: metav1.Duration{Duration: time.Second}, HeartbeatMisses: 3, OnHeartbeatLost: "Close",
				EvacuationTimeout: metav1.Duration{Duration: 20 * time.Second}},
		},
	}
	fx.create(app)
	return app
}

func (fx *fixture) create(o client.Object) {
	fx.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	if err := fx.c.Create(ctx, o); err != nil {
		fx.t.Fatal(err)
	}
}

// slice creates the slice of app on the fixture's node, as the manager
// does, with instances.
func (fx *fixture) slice(app *serverlessv1.Application, instances ...serverlessv1.SliceInstance) *serverlessv1.InstanceSlice {
	fx.t.Helper()
	return fx.sliceOn(fx.node, app, instances...)
}

func (fx *fixture) sliceOn(node string, app *serverlessv1.Application, instances ...serverlessv1.SliceInstance) *serverlessv1.InstanceSlice {
	fx.t.Helper()
	for i := range instances {
		instances[i].Created = metav1.Now()
	}
	s := &serverlessv1.InstanceSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: fx.ns, Name: app.Name + "-" + node,
			Labels: map[string]string{serverlessv1.LabelApplication: app.Name, serverlessv1.LabelNode: node}},
		Spec: serverlessv1.InstanceSliceSpec{Application: app.Name, NodeName: node, Instances: instances},
	}
	fx.create(s)
	return s
}

func (fx *fixture) getSlice(s *serverlessv1.InstanceSlice) (*serverlessv1.InstanceSlice, error) {
	var got serverlessv1.InstanceSlice
	ctx, cancel := context.WithTimeout(context.Background(), testenv.ShortTimeout)
	defer cancel()
	err := fx.c.Get(ctx, client.ObjectKeyFromObject(s), &got)
	return &got, err
}

// TestInstanceDispatched: an instance added to a slice reaches the slice's
// node as an app-instance item whose spec is the Application's; one
// removed from the slice is cancelled there.
func TestInstanceDispatched(t *testing.T) {
	fx := start(t)
	app := fx.application("game")
	s := fx.slice(app, serverlessv1.SliceInstance{Name: "game-a", UID: fx.id("uid-a"), Standby: true})
	it := fx.runner.waitItem(t, appwire.InstanceWorkID(fx.id("uid-a")))
	if it.w.Type != appwire.TypeInstance {
		t.Errorf("item type %q, want %q", it.w.Type, appwire.TypeInstance)
	}
	got, err := appwire.DecodeInstance(it.w.Spec)
	if err != nil {
		t.Fatal(err)
	}
	want := &appwire.InstanceSpec{
		Namespace: fx.ns, Application: "game", Name: "game-a", Standby: true, Runtime: serverlessv1.RuntimeProcess,
		Command: []string{"/usr/bin/echo-session", "--flag"}, Env: []string{"GREETING=hello"},
		Artifacts: []taskwire.Artifact{{URL: "https://example.com/data.bin",
			SHA256: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", Path: "data.bin"}},
		RunAsUser: ptr.To[int64](1234), MemoryBytes: 64 << 20, CPUMillis: 500, PortName: "game",
		Liveness: &appwire.Probe{TCP: true, TimeoutSeconds: 1}, Readiness: &appwire.Probe{HTTPPath: "/ready", TimeoutSeconds: 2},
		Config: map[string]string{"level": "3"}, SessionsPerInstance: 2, EvacuationTimeoutMillis: 20000,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("instance spec\n got %+v\nwant %+v", got, want)
	}

	// A second instance goes out on the slice's update; the first, removed,
	// is cancelled.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := fx.getSlice(s)
		if err != nil {
			return err
		}
		cur.Spec.Instances = []serverlessv1.SliceInstance{{Name: "game-b", UID: fx.id("uid-b"), Created: metav1.Now()}}
		return fx.c.Update(context.Background(), cur)
	}); err != nil {
		t.Fatal(err)
	}
	b := fx.runner.waitItem(t, appwire.InstanceWorkID(fx.id("uid-b")))
	if spec, err := appwire.DecodeInstance(b.w.Spec); err != nil || spec.Standby || spec.Name != "game-b" {
		t.Errorf("second instance spec %+v, %v; want game-b, active", spec, err)
	}
	it.waitCancelled(t)
	if n := fx.metric("drover_hub_reports_foreign_total", "feature", "apps"); n != 0 {
		t.Errorf("%v of the node's own reports were refused as foreign", n)
	}
}

// TestInstanceReportsCoalesced: an instance's reports are written into
// its slice's status (state, port, count, standby, the node's address),
// several reports in one write.
func TestInstanceReportsCoalesced(t *testing.T) {
	// Long enough that six reports sent at once never span six intervals.
	fx := start(t, func(o *Options) { o.SliceWriteInterval = 5 * time.Second })
	app := fx.application("sim")
	s := fx.slice(app,
		serverlessv1.SliceInstance{Name: "sim-a", UID: fx.id("sim-a-1"), Standby: true},
		serverlessv1.SliceInstance{Name: "sim-b", UID: fx.id("sim-b-1")})
	a := fx.runner.waitItem(t, appwire.InstanceWorkID(fx.id("sim-a-1")))
	b := fx.runner.waitItem(t, appwire.InstanceWorkID(fx.id("sim-b-1")))
	reports := 0
	for _, st := range []string{"Creating", "LivenessChecking", "Standby"} {
		a.report(st, appwire.InstanceReport{State: st, Port: 31000})
		reports++
	}
	for _, st := range []string{"Creating", "LivenessChecking", "Idle"} {
		b.report(st, appwire.InstanceReport{State: st, Port: 31001})
		reports++
	}
	eventually(t, "the slice's status shows both instances live", func(context.Context) error {
		got, err := fx.getSlice(s)
		if err != nil {
			return err
		}
		st := got.Status
		byName := map[string]serverlessv1.InstanceStatus{}
		for _, is := range st.Instances {
			byName[is.Name] = is
		}
		if byName["sim-a"].State != serverlessv1.InstanceStandby || byName["sim-a"].Port != 31000 ||
			byName["sim-b"].State != serverlessv1.InstanceIdle || byName["sim-b"].Port != 31001 ||
			st.Count != 2 || st.Standby != 1 || st.Address != "127.0.0.1" || st.UpdateTime == nil {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
	// Six reports, and the first write goes at once while the others wait
	// out SliceWriteInterval: fewer writes than reports.
	// The counters move just after the write lands.
	fx.waitMetric("drover_hub_apps_slice_status_writes_total")
	fx.waitMetric("drover_hub_apps_report_lag_seconds", "kind", "instance")
	if w := fx.metric("drover_hub_apps_slice_status_writes_total"); w < 1 || w >= float64(reports) {
		t.Errorf("%v slice status writes for %d reports; want coalesced, at least one and fewer than the reports", w, reports)
	}
	if n := fx.metric("drover_hub_apps_report_lag_seconds", "kind", "instance"); n < 1 {
		t.Errorf("report lag observed %v times, want at least once", n)
	}

	// An instance that ends is written Terminated (the manager replaces it).
	b.end <- [3]string{taskwire.PhaseFailed, "Terminated", encode(appwire.InstanceReport{State: "Terminated", Reason: "Crashed", Message: "exit 2"})}
	eventually(t, "sim-b is Terminated in the slice's status", func(context.Context) error {
		got, err := fx.getSlice(s)
		if err != nil {
			return err
		}
		for _, is := range got.Status.Instances {
			if is.Name == "sim-b" && is.State == serverlessv1.InstanceTerminated && is.Reason == "Crashed" && got.Status.Count == 1 {
				return nil
			}
		}
		return fmt.Errorf("status %+v", got.Status)
	})
}

// TestSessionLifecycle: a session bound to an instance on the node is
// dispatched with its spec; its Ready is written with the endpoint (the
// only hub write of the open path); deleting it cancels it at the agent,
// whose Terminated is written, and the finalizer goes.
func TestSessionLifecycle(t *testing.T) {
	fx := start(t)
	app := fx.application("chat")
	fx.slice(app, serverlessv1.SliceInstance{Name: "chat-a", UID: fx.id("chat-a-1")})
	inst := fx.runner.waitItem(t, appwire.InstanceWorkID(fx.id("chat-a-1")))
	inst.report("Idle", appwire.InstanceReport{State: "Idle", Port: 32000})

	sess := &serverlessv1.ApplicationSession{
		ObjectMeta: metav1.ObjectMeta{Namespace: fx.ns, Name: "alice"},
		Spec: serverlessv1.ApplicationSessionSpec{Application: "chat", Data: map[string]string{"user": "alice"},
			OpenTimeout: &metav1.Duration{Duration: 7 * time.Second}},
	}
	fx.create(sess)
	// The manager binds it: instance, node and finalizer in one update.
	controllerutil.AddFinalizer(sess, serverlessv1.FinalizerSession)
	sess.Spec.InstanceName, sess.Spec.NodeName = "chat-a", fx.node
	if err := fx.c.Update(context.Background(), sess); err != nil {
		t.Fatal(err)
	}
	work := appwire.SessionWorkID(string(sess.UID))
	it := fx.runner.waitItem(t, work)
	spec, err := appwire.DecodeSession(it.w.Spec)
	if err != nil {
		t.Fatal(err)
	}
	want := &appwire.SessionSpec{Namespace: fx.ns, Application: "chat", Name: "alice", Instance: appwire.InstanceWorkID(fx.id("chat-a-1")),
		Data: map[string]string{"user": "alice"}, OpenTimeoutMillis: 7000, HeartbeatIntervalMillis: 1000, HeartbeatMisses: 3,
		EvacuationTimeoutMillis: 20000}
	if !reflect.DeepEqual(spec, want) {
		t.Errorf("session spec\n got %+v\nwant %+v", spec, want)
	}

	// ReadinessChecking is not written; Ready is, with the endpoint.
	it.report("ReadinessChecking", appwire.SessionReport{State: "ReadinessChecking", Instance: appwire.InstanceWorkID(fx.id("chat-a-1"))})
	ready := time.Date(2026, 11, 29, 1, 2, 3, 0, time.UTC)
	// Without a port: the instance's reported one.
	it.report("Ready", appwire.SessionReport{State: "Ready", Instance: appwire.InstanceWorkID(fx.id("chat-a-1")),
		ReadyTime: ready.Format(time.RFC3339Nano)})
	var got serverlessv1.ApplicationSession
	eventually(t, "the session is Ready with its endpoint", func(ctx context.Context) error {
		if err := fx.c.Get(ctx, client.ObjectKeyFromObject(sess), &got); err != nil {
			return err
		}
		st := got.Status
		if st.Phase != serverlessv1.SessionReady || st.Endpoint == nil || st.ReadyTime == nil {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
	if e := *got.Status.Endpoint; e != (serverlessv1.Endpoint{Host: "127.0.0.1", Port: 32000, Name: "game"}) {
		t.Errorf("endpoint %+v, want 127.0.0.1:32000 named game", e)
	}
	if !got.Status.ReadyTime.Time.Equal(ready) {
		t.Errorf("readyTime %v, want the instance's %v", got.Status.ReadyTime, ready)
	}
	fx.waitMetric("drover_hub_apps_session_status_writes_total")
	fx.waitMetric("drover_hub_apps_sessions_opened_total")
	if w := fx.metric("drover_hub_apps_session_status_writes_total"); w != 1 {
		t.Errorf("%v session status writes to open the session, want 1 (Ready)", w)
	}
	if n := fx.metric("drover_hub_apps_sessions_opened_total"); n != 1 {
		t.Errorf("sessions opened %v, want 1", n)
	}

	// Deleted: cancelled at the agent, Terminated written, finalizer gone.
	if err := fx.c.Delete(context.Background(), &got); err != nil {
		t.Fatal(err)
	}
	it.waitCancelled(t)
	eventually(t, "the deleted session is gone", func(ctx context.Context) error {
		var s serverlessv1.ApplicationSession
		err := fx.c.Get(ctx, client.ObjectKeyFromObject(sess), &s)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("still there: phase %s, finalizers %v", s.Status.Phase, s.Finalizers)
	})
	fx.waitMetric("drover_hub_apps_sessions_closed_total", "reason", serverlessv1.ReasonClosed)
	if n := fx.metric("drover_hub_apps_sessions_closed_total", "reason", serverlessv1.ReasonClosed); n != 1 {
		t.Errorf("sessions closed (Closed) %v, want 1", n)
	}
}

// TestSessionEndsAndHeartbeatPolicy: a session its instance ends is
// written Terminated with the reason and loses its finalizer while it is
// kept; a session flagged longer than its open timeout is closed
// (HeartbeatLost).
func TestSessionEndsAndHeartbeatPolicy(t *testing.T) {
	fx := start(t)
	app := fx.application("sim")
	fx.slice(app, serverlessv1.SliceInstance{Name: "sim-a", UID: fx.id("hb-a-1")})
	fx.runner.waitItem(t, appwire.InstanceWorkID(fx.id("hb-a-1")))
	bind := func(name string, timeout time.Duration) (*serverlessv1.ApplicationSession, *item) {
		s := &serverlessv1.ApplicationSession{
			ObjectMeta: metav1.ObjectMeta{Namespace: fx.ns, Name: name, Finalizers: []string{serverlessv1.FinalizerSession}},
			Spec: serverlessv1.ApplicationSessionSpec{Application: "sim", InstanceName: "sim-a", NodeName: fx.node,
				OpenTimeout: &metav1.Duration{Duration: timeout}},
		}
		fx.create(s)
		return s, fx.runner.waitItem(t, appwire.SessionWorkID(string(s.UID)))
	}
	waitTerminated := func(s *serverlessv1.ApplicationSession, reason string) {
		t.Helper()
		eventually(t, fmt.Sprintf("session %s is Terminated (%s) without its finalizer", s.Name, reason), func(ctx context.Context) error {
			var got serverlessv1.ApplicationSession
			if err := fx.c.Get(ctx, client.ObjectKeyFromObject(s), &got); err != nil {
				return err
			}
			if got.Status.Phase != serverlessv1.SessionTerminated || got.Status.Reason != reason || got.Status.CloseTime == nil ||
				controllerutil.ContainsFinalizer(&got, serverlessv1.FinalizerSession) {
				return fmt.Errorf("status %+v, finalizers %v", got.Status, got.Finalizers)
			}
			return nil
		})
	}

	crashed, it := bind("crashed", 5*time.Second)
	it.end <- [3]string{taskwire.PhaseFailed, "Terminated", encode(appwire.SessionReport{State: "Terminated",
		Reason: serverlessv1.ReasonInstanceCrashed, Message: "the instance exited"})}
	waitTerminated(crashed, serverlessv1.ReasonInstanceCrashed)

	quiet, it := bind("quiet", 500*time.Millisecond)
	it.report("Ready", appwire.SessionReport{State: "Ready", Port: 32001})
	it.report("Ready", appwire.SessionReport{State: "Ready", Port: 32001, Flagged: true})
	it.waitCancelled(t)
	waitTerminated(quiet, serverlessv1.ReasonHeartbeatLost)
	var got serverlessv1.ApplicationSession
	if err := fx.c.Get(context.Background(), client.ObjectKeyFromObject(quiet), &got); err != nil {
		t.Fatal(err)
	}
	if e := got.Status.Endpoint; e == nil || e.Port != 32001 {
		t.Errorf("endpoint %+v, want the reported port 32001", e)
	}
}

// TestAssigned: a node is trusted with its own instances and sessions
// only, known from the caches before any send, and not with unknown ones.
func TestAssigned(t *testing.T) {
	fx := start(t)
	app := fx.application("own")
	fx.slice(app, serverlessv1.SliceInstance{Name: "own-a", UID: fx.id("own-a-1")})
	s := &serverlessv1.ApplicationSession{
		ObjectMeta: metav1.ObjectMeta{Namespace: fx.ns, Name: "mine"},
		Spec:       serverlessv1.ApplicationSessionSpec{Application: "own", InstanceName: "own-a", NodeName: fx.node},
	}
	fx.create(s)
	fx.runner.waitItem(t, appwire.SessionWorkID(string(s.UID)))
	ctx := context.Background()
	for _, tc := range []struct {
		node, uid string
		want      bool
	}{
		{fx.node, appwire.InstanceWorkID(fx.id("own-a-1")), true},
		{"another-node", appwire.InstanceWorkID(fx.id("own-a-1")), false},
		{fx.node, appwire.SessionWorkID(string(s.UID)), true},
		{"another-node", appwire.SessionWorkID(string(s.UID)), false},
		{fx.node, appwire.InstanceWorkID("nobody-knows"), false},
		{fx.node, appwire.SessionWorkID("nobody-knows"), false},
		{fx.node, "task-something", false},
	} {
		if got := fx.f.Assigned(ctx, tc.node, tc.uid); got != tc.want {
			t.Errorf("Assigned(%s, %s) = %v, want %v", tc.node, tc.uid, got, tc.want)
		}
	}
	// From the caches alone, as a restarted hub knows them.
	fresh := New(Options{Client: fx.f.opts.Client})
	defer fresh.sliceQ.ShutDown()
	defer fresh.sessQ.ShutDown()
	if !fresh.Assigned(ctx, fx.node, appwire.InstanceWorkID(fx.id("own-a-1"))) || fresh.Assigned(ctx, "another-node", appwire.SessionWorkID(string(s.UID))) {
		t.Error("a feature that sent nothing does not answer from the caches")
	}
}

// TestDeletedSessionCleanupTimeout: a deleted session its agent never got
// (bound to an instance the node's slices do not hold) is cancelled, and
// when the agent does not confirm within CleanupTimeout it is written
// Terminated (InstanceGone) and released.
func TestDeletedSessionCleanupTimeout(t *testing.T) {
	fx := start(t, func(o *Options) { o.CleanupTimeout = 2 * time.Second })
	fx.application("lost")
	s := &serverlessv1.ApplicationSession{
		ObjectMeta: metav1.ObjectMeta{Namespace: fx.ns, Name: "orphan", Finalizers: []string{serverlessv1.FinalizerSession}},
		Spec:       serverlessv1.ApplicationSessionSpec{Application: "lost", InstanceName: "lost-a", NodeName: fx.node},
	}
	fx.create(s)
	if err := fx.c.Delete(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the deleted session is gone", func(ctx context.Context) error {
		var got serverlessv1.ApplicationSession
		err := fx.c.Get(ctx, client.ObjectKeyFromObject(s), &got)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("still there: status %+v, finalizers %v", got.Status, got.Finalizers)
	})
	if fx.runner.has(appwire.SessionWorkID(string(s.UID))) {
		t.Error("the agent got a session whose instance is on none of its slices")
	}
	if n := fx.metric("drover_hub_apps_sessions_closed_total", "reason", serverlessv1.ReasonInstanceGone); n != 1 {
		t.Errorf("sessions closed (InstanceGone) %v, want 1", n)
	}
}

// TestOnlyAgentsNamingApps: a node whose agent does not name the apps
// feature gets no instance and no session, in its snapshot or later; the
// node beside it that names it gets its own; and each is trusted with its
// own work only: a report of another node's instance, over real gRPC, is
// refused.
func TestOnlyAgentsNamingApps(t *testing.T) {
	fx := start(t)
	old := fx.node + "-old"
	oldRunner := newScriptRunner()
	fx.startAgent(old, oldRunner, false)
	app := fx.application("mixed")
	fx.sliceOn(old, app, serverlessv1.SliceInstance{Name: "mixed-old", UID: fx.id("mixed-old-1")})
	s := &serverlessv1.ApplicationSession{
		ObjectMeta: metav1.ObjectMeta{Namespace: fx.ns, Name: "on-old"},
		Spec:       serverlessv1.ApplicationSessionSpec{Application: "mixed", InstanceName: "mixed-old", NodeName: old},
	}
	fx.create(s)
	// The node beside it gets its instance: the feature has seen both.
	fx.slice(app, serverlessv1.SliceInstance{Name: "mixed-new", UID: fx.id("mixed-new-1")})
	fx.runner.waitItem(t, appwire.InstanceWorkID(fx.id("mixed-new-1")))
	testenv.Never(t, testenv.ShortTimeout, "the old agent got an app item", func(context.Context) (bool, error) {
		return oldRunner.has(appwire.InstanceWorkID(fx.id("mixed-old-1"))) || oldRunner.has(appwire.SessionWorkID(string(s.UID))), nil
	})
	// A report of the other node's instance, from the old agent (given the
	// item by the hub directly, as a confused or hostile node would hold
	// it), is refused before it reaches the feature.
	work := appwire.InstanceWorkID(fx.id("mixed-new-1"))
	spec, err := appwire.Encode(InstanceSpec(app, serverlessv1.SliceInstance{Name: "mixed-new", UID: fx.id("mixed-new-1")}))
	if err != nil {
		t.Fatal(err)
	}
	if err := fx.hub.Dispatch(old, &agentv1.WorkItem{Uid: work, Type: appwire.TypeInstance, Spec: spec}); err != nil {
		t.Fatal(err)
	}
	oldRunner.waitItem(t, work).report("Running", appwire.InstanceReport{State: "Running", Port: 1})
	eventually(t, "the forged report is refused", func(context.Context) error {
		if n := fx.metric("drover_hub_reports_foreign_total", "feature", "apps"); n < 1 {
			return fmt.Errorf("%v foreign reports", n)
		}
		return nil
	})
	fx.f.mu.Lock()
	ir := fx.f.insts[fx.id("mixed-new-1")]
	forged := ir != nil && ir.status != nil && ir.status.State == serverlessv1.InstanceRunning
	fx.f.mu.Unlock()
	if forged {
		t.Error("the feature took another node's report of its instance")
	}

	ctx := context.Background()
	if fx.f.Assigned(ctx, fx.node, appwire.InstanceWorkID(fx.id("mixed-old-1"))) || !fx.f.Assigned(ctx, old, appwire.InstanceWorkID(fx.id("mixed-old-1"))) ||
		fx.f.Assigned(ctx, old, appwire.InstanceWorkID(fx.id("mixed-new-1"))) {
		t.Error("Assigned does not follow the slices' nodes")
	}
}

// TestNodeStateReplaces: a NodeState replaces what the feature knew of
// the node: an instance it lists keeps its reported details with the
// state it gives; one it leaves out loses its status.
func TestNodeStateReplaces(t *testing.T) {
	fx := start(t)
	app := fx.application("ns")
	s := fx.slice(app,
		serverlessv1.SliceInstance{Name: "ns-a", UID: fx.id("ns-a-1")},
		serverlessv1.SliceInstance{Name: "ns-b", UID: fx.id("ns-b-1")})
	a := fx.runner.waitItem(t, appwire.InstanceWorkID(fx.id("ns-a-1")))
	b := fx.runner.waitItem(t, appwire.InstanceWorkID(fx.id("ns-b-1")))
	a.report("Idle", appwire.InstanceReport{State: "Idle", Port: 33000})
	b.report("Idle", appwire.InstanceReport{State: "Idle", Port: 33001})
	waitStates := func(what string, want map[string]serverlessv1.InstanceState) {
		t.Helper()
		eventually(t, what, func(context.Context) error {
			got, err := fx.getSlice(s)
			if err != nil {
				return err
			}
			have := map[string]serverlessv1.InstanceState{}
			for _, is := range got.Status.Instances {
				have[is.Name] = is.State
			}
			if !reflect.DeepEqual(have, want) {
				return fmt.Errorf("states %v", have)
			}
			return nil
		})
	}
	waitStates("both instances Idle", map[string]serverlessv1.InstanceState{"ns-a": serverlessv1.InstanceIdle, "ns-b": serverlessv1.InstanceIdle})

	fx.f.NodeState(context.Background(), fx.node, []*agentv1.WorkStatus{
		{Uid: appwire.InstanceWorkID(fx.id("ns-a-1")), Phase: taskwire.PhaseRunning, Reason: "Running"}})
	waitStates("ns-a Running, ns-b gone", map[string]serverlessv1.InstanceState{"ns-a": serverlessv1.InstanceRunning})
	got, err := fx.getSlice(s)
	if err != nil {
		t.Fatal(err)
	}
	if p := got.Status.Instances[0].Port; p != 33000 {
		t.Errorf("ns-a port %d after the NodeState, want the reported 33000 kept", p)
	}
}
