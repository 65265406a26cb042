package appctl_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	serverlessv1 "github.com/drover-fleet/drover/api/serverless/v1alpha1"
	"github.com/drover-fleet/drover/internal/clock/clocktest"
	"github.com/drover-fleet/drover/internal/serverless/appctl"
	"github.com/drover-fleet/drover/internal/testenv"
)

var (
	env    *testenv.Env
	scheme = runtime.NewScheme()
)

const waitTimeout = testenv.DefaultTimeout

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, fleetv1.AddToScheme, batchv1.AddToScheme, serverlessv1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	var stop func()
	env, stop = testenv.StartMain(testenv.Options{Scheme: scheme})
	code := m.Run()
	stop()
	os.Exit(code)
}

var namespaces atomic.Int32

// start runs the Application controller with clk until the test ends, in
// a new namespace granted every node, which it returns. The test's
// FleetNodes are deleted at its end, so that the next test's placements
// see only its own.
func start(t *testing.T, base string, clk *clocktest.Fake) (string, *appctl.Controller) {
	t.Helper()
	return startWith(t, base, clk, true)
}

// startWith is start, with the namespace granted no node unless granted.
func startWith(t *testing.T, base string, clk *clocktest.Fake, granted bool) (string, *appctl.Controller) {
	t.Helper()
	ctx := context.Background()
	ns := fmt.Sprintf("%s-%d", base, namespaces.Add(1))
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	g := &fleetv1.NodeGrant{ObjectMeta: metav1.ObjectMeta{Name: "all-" + ns}, Spec: fleetv1.NodeGrantSpec{Namespaces: []string{ns}}}
	if granted {
		if err := env.Client.Create(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	skip := true
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: &skip}})
	if err != nil {
		t.Fatal(err)
	}
	opts := appctl.Options{RecorderName: "test", SessionGrace: time.Second, InstanceGoneGrace: time.Second}
	if clk != nil {
		opts.Clock = clk
	}
	c, err := appctl.Setup(mgr, opts)
	if err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	if !mgr.GetCache().WaitForCacheSync(mctx) {
		t.Fatal("cache did not sync")
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
		var nodes fleetv1.FleetNodeList
		if err := env.Client.List(ctx, &nodes); err != nil {
			t.Error(err)
		}
		for i := range nodes.Items {
			if err := env.Client.Delete(ctx, &nodes.Items[i]); client.IgnoreNotFound(err) != nil {
				t.Error(err)
			}
		}
		if err := env.Client.Delete(ctx, g); client.IgnoreNotFound(err) != nil {
			t.Error(err)
		}
		// Sessions hold a finalizer the test's hub would remove.
		var sessions serverlessv1.ApplicationSessionList
		if err := env.Client.List(ctx, &sessions, client.InNamespace(ns)); err != nil {
			t.Error(err)
		}
		for i := range sessions.Items {
			s := &sessions.Items[i]
			if controllerutil.RemoveFinalizer(s, serverlessv1.FinalizerSession) {
				if err := env.Client.Update(ctx, s); client.IgnoreNotFound(err) != nil {
					t.Error(err)
				}
			}
		}
		for _, obj := range []client.Object{&serverlessv1.ApplicationSession{}, &serverlessv1.InstanceSlice{}, &serverlessv1.Application{}} {
			if err := env.Client.DeleteAllOf(ctx, obj, client.InNamespace(ns)); err != nil {
				t.Error(err)
			}
		}
	})
	return ns, c
}

func cpu(v string) corev1.ResourceList {
	return corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(v)}
}

// node creates an Online FleetNode as a hub would have it.
func node(t *testing.T, name string, capacity corev1.ResourceList) {
	t.Helper()
	ctx := context.Background()
	n := &fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: fleetv1.FleetNodeSpec{Approved: true}}
	if err := env.Client.Create(ctx, n); err != nil {
		t.Fatal(err)
	}
	n.Status.Phase, n.Status.Capacity, n.Status.Hub = fleetv1.FleetNodeOnline, capacity, "hub-x"
	if err := env.Client.Status().Update(ctx, n); err != nil {
		t.Fatal(err)
	}
}

func setNodePhase(t *testing.T, name string, phase fleetv1.FleetNodePhase) {
	t.Helper()
	ctx := context.Background()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var n fleetv1.FleetNode
		if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
			return err
		}
		n.Status.Phase = phase
		return env.Client.Status().Update(ctx, &n)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func application(t *testing.T, ns, name string, mutate func(*serverlessv1.Application)) *serverlessv1.Application {
	t.Helper()
	// The API's defaults: the Go types send every scaling and session
	// field (no omitempty), so the schema's defaults never apply to them.
	a := &serverlessv1.Application{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: serverlessv1.ApplicationSpec{Mode: serverlessv1.ModeSessions, Runtime: serverlessv1.RuntimeProcess,
			Command: []string{"/bin/sleep", "1000"}, Resources: cpu("100m"),
			Scaling: serverlessv1.Scaling{MaxInstances: 10, StandbyInstances: ptr.To[int32](1), Burst: 2, SessionsPerInstance: 1,
				IdleInstanceTimeout: metav1.Duration{Duration: 5 * time.Minute}},
			Session: serverlessv1.SessionPolicy{OpenTimeout: metav1.Duration{Duration: 10 * time.Second}, HeartbeatInterval: metav1.Duration{Duration: 5 * time.Second},
				HeartbeatMisses: 3, OnHeartbeatLost: "Close", EvacuationTimeout: metav1.Duration{Duration: 30 * time.Second}}}}
	if mutate != nil {
		mutate(a)
	}
	if err := env.Client.Create(context.Background(), a); err != nil {
		t.Fatalf("create Application %s: %v", name, err)
	}
	return a
}

func session(t *testing.T, ns, name, app string) {
	t.Helper()
	s := &serverlessv1.ApplicationSession{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: serverlessv1.ApplicationSessionSpec{Application: app, Data: map[string]string{"user": name}}}
	if err := env.Client.Create(context.Background(), s); err != nil {
		t.Fatalf("create ApplicationSession %s: %v", name, err)
	}
}

// instances are the slice instances of app, by name, with their node.
type instance struct {
	serverlessv1.SliceInstance
	node  string
	slice string
}

func instancesOf(ctx context.Context, ns, app string) (map[string]instance, error) {
	var l serverlessv1.InstanceSliceList
	if err := env.Client.List(ctx, &l, client.InNamespace(ns), client.MatchingLabels{serverlessv1.LabelApplication: app}); err != nil {
		return nil, err
	}
	out := map[string]instance{}
	for _, s := range l.Items {
		for _, in := range s.Spec.Instances {
			out[in.Name] = instance{SliceInstance: in, node: s.Spec.NodeName, slice: s.Name}
		}
	}
	return out, nil
}

func waitInstances(t *testing.T, ns, app, what string, ok func(map[string]instance) bool) map[string]instance {
	t.Helper()
	var got map[string]instance
	testenv.Eventually(t, waitTimeout, app+": "+what, func(ctx context.Context) (bool, error) {
		var err error
		if got, err = instancesOf(ctx, ns, app); err != nil {
			return false, err
		}
		if !ok(got) {
			return false, fmt.Errorf("instances %s", describe(got))
		}
		return true, nil
	})
	return got
}

func describe(m map[string]instance) string {
	var parts []string
	for n, in := range m {
		parts = append(parts, fmt.Sprintf("%s@%s(standby=%v)", n, in.node, in.Standby))
	}
	sort.Strings(parts)
	return "[" + strings.Join(parts, " ") + "]"
}

func count(n int) func(map[string]instance) bool {
	return func(m map[string]instance) bool { return len(m) == n }
}

// report writes the state of instances as the node's hub does (slice
// status).
func report(t *testing.T, ns string, states map[string]serverlessv1.InstanceState, since time.Time) {
	t.Helper()
	ctx := context.Background()
	var l serverlessv1.InstanceSliceList
	if err := env.Client.List(ctx, &l, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, s := range l.Items {
		touched := false
		for _, in := range s.Spec.Instances {
			if _, ok := states[in.Name]; ok {
				touched = true
			}
		}
		if !touched {
			continue
		}
		key := client.ObjectKeyFromObject(&s)
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var cur serverlessv1.InstanceSlice
			if err := env.Client.Get(ctx, key, &cur); err != nil {
				return err
			}
			byName := map[string]int{}
			for i, st := range cur.Status.Instances {
				byName[st.Name] = i
			}
			for _, in := range cur.Spec.Instances {
				state, ok := states[in.Name]
				if !ok {
					continue
				}
				st := serverlessv1.InstanceStatus{Name: in.Name, State: state, Port: 30000, Since: &metav1.Time{Time: since}}
				if i, ok := byName[in.Name]; ok {
					cur.Status.Instances[i] = st
				} else {
					cur.Status.Instances = append(cur.Status.Instances, st)
				}
			}
			now := metav1.Now()
			cur.Status.UpdateTime = &now
			return env.Client.Status().Update(ctx, &cur)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func getSession(t *testing.T, ns, name string) *serverlessv1.ApplicationSession {
	t.Helper()
	var s serverlessv1.ApplicationSession
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

func waitSession(t *testing.T, ns, name, what string, ok func(*serverlessv1.ApplicationSession) bool) *serverlessv1.ApplicationSession {
	t.Helper()
	var s serverlessv1.ApplicationSession
	testenv.Eventually(t, waitTimeout, name+": "+what, func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil {
			return false, err
		}
		if !ok(&s) {
			return false, fmt.Errorf("phase %q reason %q instance %q node %q finalizers %v: %s", s.Status.Phase, s.Status.Reason,
				s.Spec.InstanceName, s.Spec.NodeName, s.Finalizers, s.Status.Message)
		}
		return true, nil
	})
	return &s
}

func bound(s *serverlessv1.ApplicationSession) bool {
	return s.Spec.InstanceName != "" && controllerutil.ContainsFinalizer(s, serverlessv1.FinalizerSession)
}

func terminated(reason string) func(*serverlessv1.ApplicationSession) bool {
	return func(s *serverlessv1.ApplicationSession) bool {
		return s.Status.Phase == serverlessv1.SessionTerminated && s.Status.Reason == reason
	}
}

func waitApp(t *testing.T, ns, name, what string, ok func(*serverlessv1.Application) bool) *serverlessv1.Application {
	t.Helper()
	var a serverlessv1.Application
	testenv.Eventually(t, waitTimeout, name+": "+what, func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &a); err != nil {
			return false, err
		}
		if !ok(&a) {
			return false, fmt.Errorf("status %+v", a.Status)
		}
		return true, nil
	})
	return &a
}

func condition(a *serverlessv1.Application, typ string) *metav1.Condition {
	return meta.FindStatusCondition(a.Status.Conditions, typ)
}

// poke touches the Application, so that the controller looks again after
// the fake clock moved.
func poke(t *testing.T, ns, name string) {
	t.Helper()
	ctx := context.Background()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var a serverlessv1.Application
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &a); err != nil {
			return err
		}
		if a.Annotations == nil {
			a.Annotations = map[string]string{}
		}
		a.Annotations["test/poke"] = fmt.Sprint(time.Now().UnixNano())
		return env.Client.Update(ctx, &a)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestStandbyPoolBindsAndRefills(t *testing.T) {
	ns, _ := start(t, "pool", nil)
	node(t, ns+"-n1", cpu("4"))
	application(t, ns, "web", nil) // defaults: standby 1, max 10, burst 2
	insts := waitInstances(t, ns, "web", "one standby instance", count(1))
	var first instance
	for _, in := range insts {
		first = in
	}
	if !first.Standby || first.node != ns+"-n1" || first.UID == "" {
		t.Fatalf("instance %+v: want standby on %s-n1 with a uid", first, ns)
	}
	var sl serverlessv1.InstanceSlice
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: appctl.SliceName("web", ns+"-n1")}, &sl); err != nil {
		t.Fatal(err)
	}
	if len(sl.OwnerReferences) != 1 || sl.OwnerReferences[0].Name != "web" || sl.Labels[serverlessv1.LabelNode] != ns+"-n1" {
		t.Fatalf("slice metadata %+v", sl.ObjectMeta)
	}
	waitApp(t, ns, "web", "not Ready while the instance starts", func(a *serverlessv1.Application) bool {
		c := condition(a, serverlessv1.ConditionReady)
		return c != nil && c.Status == metav1.ConditionFalse && a.Status.Instances.Creating == 1
	})
	report(t, ns, map[string]serverlessv1.InstanceState{first.Name: serverlessv1.InstanceStandby}, time.Now())
	waitApp(t, ns, "web", "Ready with one standby", func(a *serverlessv1.Application) bool {
		c := condition(a, serverlessv1.ConditionReady)
		return c != nil && c.Status == metav1.ConditionTrue && a.Status.Instances.Standby == 1 && a.Status.Nodes == 1
	})

	session(t, ns, "s1", "web")
	s := waitSession(t, ns, "s1", "bound to the standby instance", bound)
	if s.Spec.InstanceName != first.Name || s.Spec.NodeName != first.node {
		t.Fatalf("s1 bound to %s on %s, want %s on %s", s.Spec.InstanceName, s.Spec.NodeName, first.Name, first.node)
	}
	if s.Labels[serverlessv1.LabelApplication] != "web" {
		t.Errorf("s1 labels %v", s.Labels)
	}
	if s.Annotations[appctl.AnnotationBoundTime] == "" {
		t.Errorf("s1 has no %s annotation", appctl.AnnotationBoundTime)
	}
	insts = waitInstances(t, ns, "web", "the pool refilled", count(2))
	for n, in := range insts {
		if n != first.Name && !in.Standby {
			t.Errorf("refill %s is not standby", n)
		}
	}
	waitApp(t, ns, "web", "one session starting", func(a *serverlessv1.Application) bool {
		return a.Status.Sessions.Starting == 1 && a.Status.Instances.Total == 2
	})
}

func TestColdPathAndNoCapacity(t *testing.T) {
	ns, _ := start(t, "cold", nil)
	node(t, ns+"-n1", cpu("4"))
	application(t, ns, "sim", func(a *serverlessv1.Application) {
		a.Spec.Scaling = serverlessv1.Scaling{StandbyInstances: ptr.To[int32](0), MaxInstances: 1, Burst: 1, SessionsPerInstance: 1,
			IdleInstanceTimeout: metav1.Duration{Duration: time.Hour}}
	})
	testenv.Never(t, 2*time.Second, "no instance without a session", func(ctx context.Context) (bool, error) {
		m, err := instancesOf(context.Background(), ns, "sim")
		return err == nil && len(m) > 0, err
	})
	session(t, ns, "s1", "sim")
	s := waitSession(t, ns, "s1", "bound to a new instance", bound)
	insts := waitInstances(t, ns, "sim", "one active instance", count(1))
	in, ok := insts[s.Spec.InstanceName]
	if !ok || in.Standby || in.node != s.Spec.NodeName {
		t.Fatalf("s1 bound to %s on %s; instances %s", s.Spec.InstanceName, s.Spec.NodeName, describe(insts))
	}
	session(t, ns, "s2", "sim")
	s2 := waitSession(t, ns, "s2", "Terminated NoCapacity", terminated(serverlessv1.ReasonNoCapacity))
	if s2.Spec.InstanceName != "" || s2.Status.CloseTime == nil || !strings.Contains(s2.Status.Message, "maxInstances") {
		t.Errorf("s2 %+v %+v", s2.Spec, s2.Status)
	}
}

func TestSessionsOfMissingAndDaemonApplications(t *testing.T) {
	ns, _ := start(t, "refuse", nil)
	node(t, ns+"-n1", cpu("4"))
	session(t, ns, "lost", "nope")
	waitSession(t, ns, "lost", "Terminated ApplicationNotFound", terminated(serverlessv1.ReasonApplicationNotFound))

	application(t, ns, "stream", func(a *serverlessv1.Application) {
		a.Spec.Mode = serverlessv1.ModeDaemon
		a.Spec.Scaling = serverlessv1.Scaling{MinInstances: 3, MaxInstances: 10, StandbyInstances: ptr.To[int32](0), Burst: 2, SessionsPerInstance: 1,
			IdleInstanceTimeout: metav1.Duration{Duration: time.Hour}}
	})
	insts := waitInstances(t, ns, "stream", "burst: two instances at once", count(2))
	testenv.Never(t, 2*time.Second, "a third before the first two are live", func(ctx context.Context) (bool, error) {
		m, err := instancesOf(context.Background(), ns, "stream")
		return err == nil && len(m) > 2, err
	})
	states := map[string]serverlessv1.InstanceState{}
	for n, in := range insts {
		if in.Standby {
			t.Errorf("daemon instance %s is standby", n)
		}
		states[n] = serverlessv1.InstanceRunning
	}
	report(t, ns, states, time.Now())
	waitInstances(t, ns, "stream", "the third", count(3))
	session(t, ns, "s1", "stream")
	waitSession(t, ns, "s1", "Terminated ApplicationIsDaemon", terminated(serverlessv1.ReasonApplicationIsDaemon))
}

func TestPlacementOnGrantedNodesWithRoom(t *testing.T) {
	ns, _ := start(t, "place", nil)
	node(t, ns+"-small", cpu("1"))
	application(t, ns, "big", func(a *serverlessv1.Application) {
		a.Spec.Mode = serverlessv1.ModeDaemon
		a.Spec.Resources = cpu("600m")
		a.Spec.Scaling = serverlessv1.Scaling{MinInstances: 2, MaxInstances: 10, Burst: 2, SessionsPerInstance: 1,
			IdleInstanceTimeout: metav1.Duration{Duration: time.Hour}}
	})
	waitInstances(t, ns, "big", "one fits", count(1))
	a := waitApp(t, ns, "big", "Schedulable False", func(a *serverlessv1.Application) bool {
		c := condition(a, serverlessv1.ConditionSchedulable)
		return c != nil && c.Status == metav1.ConditionFalse
	})
	if c := condition(a, serverlessv1.ConditionSchedulable); c.Reason != appctl.ReasonUnschedulable || !strings.Contains(c.Message, "insufficient cpu") {
		t.Errorf("Schedulable %+v", c)
	}
	// A new node with room takes the second.
	node(t, ns+"-big", cpu("2"))
	insts := waitInstances(t, ns, "big", "the second on the new node", count(2))
	nodes := map[string]int{}
	for _, in := range insts {
		nodes[in.node]++
	}
	if nodes[ns+"-small"] != 1 || nodes[ns+"-big"] != 1 {
		t.Errorf("instances %s", describe(insts))
	}
}

func TestNodeLostEndsSessionsAndReplacesInstances(t *testing.T) {
	ns, _ := start(t, "lost", nil)
	node(t, ns+"-n1", cpu("4"))
	application(t, ns, "web", nil)
	insts := waitInstances(t, ns, "web", "one standby", count(1))
	var first instance
	for _, in := range insts {
		first = in
	}
	report(t, ns, map[string]serverlessv1.InstanceState{first.Name: serverlessv1.InstanceStandby}, time.Now())
	session(t, ns, "s1", "web")
	waitSession(t, ns, "s1", "bound", bound)
	waitInstances(t, ns, "web", "refilled", count(2))
	node(t, ns+"-n2", cpu("4"))
	setNodePhase(t, ns+"-n1", fleetv1.FleetNodeOffline)
	s := waitSession(t, ns, "s1", "Terminated NodeLost without finalizer", func(s *serverlessv1.ApplicationSession) bool {
		return terminated(serverlessv1.ReasonNodeLost)(s) && !controllerutil.ContainsFinalizer(s, serverlessv1.FinalizerSession)
	})
	if !strings.Contains(s.Status.Message, "Offline") {
		t.Errorf("message %q", s.Status.Message)
	}
	waitInstances(t, ns, "web", "the standby pool on n2 alone", func(m map[string]instance) bool {
		for _, in := range m {
			if in.node != ns+"-n2" {
				return false
			}
		}
		return len(m) == 1
	})
}

func TestTerminatedReplacedAndIdleScaledDown(t *testing.T) {
	clk := clocktest.New(time.Now())
	ns, _ := start(t, "idle", clk)
	node(t, ns+"-n1", cpu("4"))
	application(t, ns, "web", func(a *serverlessv1.Application) {
		a.Spec.Scaling = serverlessv1.Scaling{StandbyInstances: ptr.To[int32](1), MaxInstances: 5, Burst: 2, SessionsPerInstance: 1,
			IdleInstanceTimeout: metav1.Duration{Duration: 5 * time.Minute}}
	})
	insts := waitInstances(t, ns, "web", "one standby", count(1))
	var first string
	for n := range insts {
		first = n
	}
	report(t, ns, map[string]serverlessv1.InstanceState{first: serverlessv1.InstanceTerminated}, clk.Now())
	insts = waitInstances(t, ns, "web", "replaced", func(m map[string]instance) bool {
		_, old := m[first]
		return len(m) == 1 && !old
	})
	var second string
	for n := range insts {
		second = n
	}
	// It served a session and is idle now: kept for the idle timeout.
	report(t, ns, map[string]serverlessv1.InstanceState{second: serverlessv1.InstanceIdle}, clk.Now())
	insts = waitInstances(t, ns, "web", "a standby beside the idle one", count(2))
	clk.Step(4 * time.Minute)
	poke(t, ns, "web")
	testenv.Never(t, 2*time.Second, "the idle instance removed before its timeout", func(ctx context.Context) (bool, error) {
		m, err := instancesOf(context.Background(), ns, "web")
		if err != nil {
			return false, err
		}
		_, ok := m[second]
		return !ok, nil
	})
	clk.Step(time.Minute)
	poke(t, ns, "web")
	waitInstances(t, ns, "web", "the idle instance removed", func(m map[string]instance) bool {
		_, ok := m[second]
		return !ok && len(m) == 1
	})
}

func TestOpenTimeoutAndInstanceGone(t *testing.T) {
	clk := clocktest.New(time.Now())
	ns, _ := start(t, "timeout", clk)
	node(t, ns+"-n1", cpu("4"))
	application(t, ns, "web", func(a *serverlessv1.Application) {
		a.Spec.Scaling = serverlessv1.Scaling{StandbyInstances: ptr.To[int32](0), MaxInstances: 5, Burst: 2, SessionsPerInstance: 1,
			IdleInstanceTimeout: metav1.Duration{Duration: time.Hour}}
		a.Spec.Session.OpenTimeout = metav1.Duration{Duration: 10 * time.Second}
	})
	session(t, ns, "s1", "web")
	waitSession(t, ns, "s1", "bound", bound)
	clk.Step(10 * time.Second) // within the grace (1s in these tests)
	poke(t, ns, "web")
	testenv.Never(t, 2*time.Second, "closed within the grace", func(ctx context.Context) (bool, error) {
		var s serverlessv1.ApplicationSession
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "s1"}, &s); err != nil {
			return false, err
		}
		return s.Status.Phase.Final(), nil
	})
	clk.Step(2 * time.Second)
	poke(t, ns, "web")
	waitSession(t, ns, "s1", "Terminated OpenTimeout without finalizer", func(s *serverlessv1.ApplicationSession) bool {
		return terminated(serverlessv1.ReasonOpenTimeout)(s) && !controllerutil.ContainsFinalizer(s, serverlessv1.FinalizerSession)
	})

	// A ready session whose instance vanished from its slice.
	session(t, ns, "s2", "web")
	s2 := waitSession(t, ns, "s2", "bound", bound)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s := getSession(t, ns, "s2")
		s.Status.Phase = serverlessv1.SessionReady
		return env.Client.Status().Update(context.Background(), s)
	})
	if err != nil {
		t.Fatal(err)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var sl serverlessv1.InstanceSlice
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: appctl.SliceName("web", s2.Spec.NodeName)}, &sl); err != nil {
			return err
		}
		kept := sl.Spec.Instances[:0]
		for _, in := range sl.Spec.Instances {
			if in.Name != s2.Spec.InstanceName {
				kept = append(kept, in)
			}
		}
		sl.Spec.Instances = kept
		return env.Client.Update(context.Background(), &sl)
	})
	if err != nil {
		t.Fatal(err)
	}
	poke(t, ns, "web")
	clk.Step(2 * time.Second)
	poke(t, ns, "web")
	waitSession(t, ns, "s2", "Terminated InstanceGone", func(s *serverlessv1.ApplicationSession) bool {
		if !terminated(serverlessv1.ReasonInstanceGone)(s) {
			clk.Step(2 * time.Second)
			poke(t, ns, "web")
			return false
		}
		return !controllerutil.ContainsFinalizer(s, serverlessv1.FinalizerSession)
	})
}

func TestOpenBindsInOneWriteAndNeverOverbooks(t *testing.T) {
	ns, c := start(t, "open", nil)
	node(t, ns+"-n1", cpu("4"))
	application(t, ns, "web", func(a *serverlessv1.Application) {
		a.Spec.Scaling = serverlessv1.Scaling{StandbyInstances: ptr.To[int32](1), MaxInstances: 2, Burst: 2, SessionsPerInstance: 1,
			IdleInstanceTimeout: metav1.Duration{Duration: time.Hour}}
	})
	insts := waitInstances(t, ns, "web", "one standby", count(1))
	states := map[string]serverlessv1.InstanceState{}
	for n := range insts {
		states[n] = serverlessv1.InstanceStandby
	}
	report(t, ns, states, time.Now())
	waitApp(t, ns, "web", "Ready", func(a *serverlessv1.Application) bool { return a.Status.Instances.Standby == 1 })

	ctx := context.Background()
	if _, err := c.Open(ctx, ns, "nope", nil, nil); !errors.Is(err, appctl.ErrApplicationNotFound) {
		t.Fatalf("Open of a missing application: %v", err)
	}
	// Four at once against max 2: two open, two find no capacity, and no
	// instance serves two.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var opened []*serverlessv1.ApplicationSession
	var refused int
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			timeout := 5 * time.Second
			s, err := c.Open(ctx, ns, "web", map[string]string{"n": fmt.Sprint(i)}, &timeout)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, appctl.ErrNoCapacity):
				refused++
			case err != nil:
				t.Errorf("Open: %v", err)
			default:
				opened = append(opened, s)
			}
		}()
	}
	wg.Wait()
	if len(opened) != 2 || refused != 2 {
		t.Fatalf("opened %d, refused %d; want 2 and 2", len(opened), refused)
	}
	if opened[0].Spec.InstanceName == opened[1].Spec.InstanceName {
		t.Fatalf("two sessions on instance %s", opened[0].Spec.InstanceName)
	}
	all := waitInstances(t, ns, "web", "two instances", count(2))
	for _, s := range opened {
		if !bound(s) || s.Spec.OpenTimeout == nil || s.Spec.Data["n"] == "" {
			t.Errorf("opened %+v", s)
		}
		if in, ok := all[s.Spec.InstanceName]; !ok || in.node != s.Spec.NodeName {
			t.Errorf("session %s bound to %s on %s: instances %s", s.Name, s.Spec.InstanceName, s.Spec.NodeName, describe(all))
		}
	}
	// The kubectl path finds no room either.
	session(t, ns, "s3", "web")
	waitSession(t, ns, "s3", "Terminated NoCapacity", terminated(serverlessv1.ReasonNoCapacity))
}

func TestDeletingApplicationClosesItsSessions(t *testing.T) {
	ns, _ := start(t, "delete", nil)
	node(t, ns+"-n1", cpu("4"))
	a := application(t, ns, "web", nil)
	waitInstances(t, ns, "web", "one standby", count(1))
	session(t, ns, "s1", "web")
	waitSession(t, ns, "s1", "bound", bound)
	if err := env.Client.Delete(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	// The hub closes it on its instance and removes the finalizer; here it
	// stays, deleting.
	waitSession(t, ns, "s1", "deleted", func(s *serverlessv1.ApplicationSession) bool { return s.DeletionTimestamp != nil })
}

func TestNotGrantedNamespacePlacesNothingUntilGranted(t *testing.T) {
	ns, _ := startWith(t, "nogrant", nil, false)
	node(t, ns+"-n1", cpu("4"))
	application(t, ns, "web", nil)
	a := waitApp(t, ns, "web", "Schedulable False NotGranted", func(a *serverlessv1.Application) bool {
		c := condition(a, serverlessv1.ConditionSchedulable)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == appctl.ReasonNotGranted
	})
	if c := condition(a, serverlessv1.ConditionReady); c == nil || c.Status != metav1.ConditionFalse || c.Reason != appctl.ReasonNotGranted {
		t.Errorf("Ready %+v", c)
	}
	if m, err := instancesOf(context.Background(), ns, "web"); err != nil || len(m) > 0 {
		t.Fatalf("instances %s (%v) without a grant", describe(m), err)
	}
	// A cold-path session finds no node either: NoCapacity, saying why.
	session(t, ns, "s1", "web")
	s := waitSession(t, ns, "s1", "Terminated NoCapacity", terminated(serverlessv1.ReasonNoCapacity))
	if !strings.Contains(s.Status.Message, "NodeGrant") {
		t.Errorf("message %q does not name the missing grant", s.Status.Message)
	}
	g := &fleetv1.NodeGrant{ObjectMeta: metav1.ObjectMeta{Name: "late-" + ns}, Spec: fleetv1.NodeGrantSpec{Namespaces: []string{ns}}}
	if err := env.Client.Create(context.Background(), g); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), g) })
	waitInstances(t, ns, "web", "the standby placed once granted", count(1))
}

// The schema's scaling rules: a spec without scaling gets the defaults
// (the rules read unset fields as their defaults), and min or standby
// above max is refused.
func TestScalingDefaultsAndRules(t *testing.T) {
	ctx := context.Background()
	ns := fmt.Sprintf("schema-%d", namespaces.Add(1))
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	// Another test's controller would keep its instances.
	t.Cleanup(func() {
		if err := env.Client.DeleteAllOf(ctx, &serverlessv1.Application{}, client.InNamespace(ns)); err != nil {
			t.Error(err)
		}
	})
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": serverlessv1.GroupVersion.String(), "kind": "Application",
		"metadata": map[string]any{"namespace": ns, "name": "bare"},
		"spec":     map[string]any{"command": []any{"/bin/true"}},
	}}
	if err := env.Client.Create(ctx, u); err != nil {
		t.Fatalf("an Application without scaling: %v", err)
	}
	var a serverlessv1.Application
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "bare"}, &a); err != nil {
		t.Fatal(err)
	}
	sc := a.Spec.Scaling
	if sc.MaxInstances != 10 || sc.Standby() != 1 || sc.StandbyInstances == nil || sc.Burst != 2 || sc.SessionsPerInstance != 1 || sc.IdleInstanceTimeout.Duration != 5*time.Minute ||
		a.Spec.Mode != serverlessv1.ModeSessions {
		t.Errorf("defaults: mode %q scaling %+v", a.Spec.Mode, sc)
	}
	for name, scaling := range map[string]map[string]any{
		"min-above-max":             {"minInstances": int64(3), "maxInstances": int64(2)},
		"standby-above-max":         {"standbyInstances": int64(3), "maxInstances": int64(2)},
		"standby-above-default-max": {"standbyInstances": int64(11)},
	} {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": serverlessv1.GroupVersion.String(), "kind": "Application",
			"metadata": map[string]any{"namespace": ns, "name": name},
			"spec":     map[string]any{"command": []any{"/bin/true"}, "scaling": scaling},
		}}
		if err := env.Client.Create(ctx, u); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "must not be above maxInstances") {
			t.Errorf("%s: %v, want Invalid: … must not be above maxInstances", name, err)
		}
	}
}
