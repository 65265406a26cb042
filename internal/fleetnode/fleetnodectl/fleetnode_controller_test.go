package fleetnodectl

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/pkg/ctrlkit/gen"
)

// The generated file must be what the generator writes from
// fleetnode.ctrlkit today.
func TestGeneratedCodeIsUpToDate(t *testing.T) {
	cmd := gen.Command{Getenv: func(string) string { return "fleetnode" }}
	if err := cmd.Run([]string{"check", "-o", "zz_generated.ctrlkit.go", "fleetnode.ctrlkit"}); err != nil {
		t.Fatal(err)
	}
}

const (
	hubNamespace = "drover-system"
	timeout      = 5 * time.Minute
)

func testScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := fleetv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

// onlineNode is named n1, Online at hub-a, approved.
func onlineNode() *fleetv1.FleetNode {
	n := online("hub-a")
	n.Name = "n1"
	n.CreationTimestamp = metav1.NewTime(now.Add(-time.Hour))
	return n
}

// hubLease is hub-a's Lease in ns, renewed renewedAgo before now.
func hubLease(ns string, renewedAgo time.Duration) *coordinationv1.Lease {
	l := lease(renewedAgo)
	l.Namespace, l.Name = ns, "drover-hub-hub-a"
	return l
}

type fixture struct {
	r        *Reconciler
	c        client.Client
	recorder *events.FakeRecorder
	// leaseGets counts Gets of Leases, whatever the answer.
	leaseGets int
}

func newFixture(t *testing.T, funcs interceptor.Funcs, objs ...client.Object) *fixture {
	t.Helper()
	f := &fixture{recorder: events.NewFakeRecorder(10)}
	get := funcs.Get
	funcs.Get = func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		if _, ok := obj.(*coordinationv1.Lease); ok {
			f.leaseGets++
		}
		if get != nil {
			return get(ctx, c, key, obj, opts...)
		}
		return c.Get(ctx, key, obj, opts...)
	}
	f.c = fake.NewClientBuilder().WithScheme(testScheme(t)).
		WithObjects(objs...).WithStatusSubresource(&fleetv1.FleetNode{}).
		WithInterceptorFuncs(funcs).Build()
	f.r = &Reconciler{
		Client: f.c, APIReader: f.c, Recorder: f.recorder,
		Namespace: hubNamespace, OfflineTimeout: timeout,
		Now: func() time.Time { return now },
	}
	return f
}

func (f *fixture) reconcile(t *testing.T) (reconcile.Result, error) {
	t.Helper()
	return f.r.Reconcile(t.Context(), reconcile.Request{NamespacedName: types.NamespacedName{Name: "n1"}})
}

func (f *fixture) node(t *testing.T) *fleetv1.FleetNode {
	t.Helper()
	var n fleetv1.FleetNode
	if err := f.c.Get(t.Context(), types.NamespacedName{Name: "n1"}, &n); err != nil {
		t.Fatal(err)
	}
	return &n
}

func (f *fixture) events() []string {
	var out []string
	for {
		select {
		case e := <-f.recorder.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func TestReconcileKeepsANodeOfALiveHubOnline(t *testing.T) {
	// The Lease is looked up in the hub namespace: a node is
	// cluster-scoped, and without the Lease its creation an hour ago
	// would make it Offline.
	f := newFixture(t, interceptor.Funcs{}, onlineNode(), hubLease(hubNamespace, 10*time.Second))
	res, err := f.reconcile(t)
	if err != nil {
		t.Fatalf("Reconcile() error = %v", err)
	}
	// The Lease lapses 30s from now; the node is looked at again a
	// second after the offline timeout on top.
	if want := 30*time.Second + timeout + time.Second; res.RequeueAfter != want {
		t.Errorf("Reconcile() RequeueAfter = %v, want %v", res.RequeueAfter, want)
	}
	if got := f.node(t).Status.Phase; got != fleetv1.FleetNodeOnline {
		t.Errorf("phase = %s, want Online", got)
	}
	if ev := f.events(); len(ev) != 0 {
		t.Errorf("events = %q, want none", ev)
	}
}

func TestReconcileMarksANodeOfALostHubOffline(t *testing.T) {
	for _, tt := range []struct {
		name  string
		lease *coordinationv1.Lease
	}{
		{"lease lapsed", hubLease(hubNamespace, 40*time.Second+timeout+time.Second)},
		{"no lease in the hub namespace", hubLease("elsewhere", 0)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, interceptor.Funcs{}, onlineNode(), tt.lease)
			res, err := f.reconcile(t)
			if err != nil || !res.IsZero() {
				t.Fatalf("Reconcile() = %+v, %v; want no requeue, no error", res, err)
			}
			if got := f.node(t).Status.Phase; got != fleetv1.FleetNodeOffline {
				t.Errorf("phase = %s, want Offline", got)
			}
			ev := f.events()
			if len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning "+fleetv1.ReasonHubLost+" ") {
				t.Errorf("events = %q, want one Warning %s", ev, fleetv1.ReasonHubLost)
			}
		})
	}
}

func TestReconcileDoesNotReadALeaseForANodeWithoutHub(t *testing.T) {
	n := &fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: fleetv1.FleetNodeSpec{Approved: true}}
	f := newFixture(t, interceptor.Funcs{}, n)
	if res, err := f.reconcile(t); err != nil || !res.IsZero() {
		t.Fatalf("Reconcile() = %+v, %v; want no requeue, no error", res, err)
	}
	if f.leaseGets != 0 {
		t.Errorf("Reconcile() read %d Leases, want none", f.leaseGets)
	}
	if got := f.node(t).Status.Phase; got != fleetv1.FleetNodePending {
		t.Errorf("phase = %s, want Pending", got)
	}
	ev := f.events()
	if len(ev) != 1 || !strings.HasPrefix(ev[0], "Normal "+fleetv1.ReasonApproved+" ") {
		t.Errorf("events = %q, want one Normal %s", ev, fleetv1.ReasonApproved)
	}
}

func TestReconcileRecordsNoEventWhenThePatchFails(t *testing.T) {
	conflict := apierrors.NewConflict(schema.GroupResource{Group: fleetv1.GroupVersion.Group, Resource: "fleetnodes"}, "n1", errors.New("a hub claimed it"))
	for _, tt := range []struct {
		name        string
		err         error
		wantErr     func(error) bool
		wantRequeue bool
	}{
		{"conflict is decided again at once, without an error", conflict, func(err error) bool { return err == nil }, true},
		{"deleted meanwhile is dropped", apierrors.NewNotFound(schema.GroupResource{Resource: "fleetnodes"}, "n1"), func(err error) bool { return err == nil }, false},
		{"other errors are returned", errors.New("etcd is down"), func(err error) bool { return err != nil && strings.Contains(err.Error(), "etcd is down") }, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			funcs := interceptor.Funcs{SubResourcePatch: func(context.Context, client.Client, string, client.Object, client.Patch, ...client.SubResourcePatchOption) error {
				return tt.err
			}}
			f := newFixture(t, funcs, onlineNode(), hubLease(hubNamespace, time.Hour))
			res, err := f.reconcile(t)
			//lint:ignore SA1019 Requeue is how ctrlkit says "requeue now".
			if !tt.wantErr(err) || res.Requeue != tt.wantRequeue || res.RequeueAfter != 0 {
				t.Errorf("Reconcile() = %+v, %v; want requeue=%v", res, err, tt.wantRequeue)
			}
			if ev := f.events(); len(ev) != 0 {
				t.Errorf("events = %q, want none", ev)
			}
		})
	}
}

func TestReconcileOfADeletedNodeIsANoop(t *testing.T) {
	f := newFixture(t, interceptor.Funcs{})
	if res, err := f.reconcile(t); err != nil || !res.IsZero() {
		t.Errorf("Reconcile() of a deleted node = %+v, %v; want nothing", res, err)
	}
}
