package fleetnodectl

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
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
	"github.com/drover-fleet/drover/internal/clock"
	"github.com/drover-fleet/drover/internal/clock/clocktest"
	"github.com/drover-fleet/drover/pkg/ctrlkit/gen"
)

// The generated file must be what the generator writes from
// fleetnode.ctrlkit today.
func TestGeneratedCodeIsUpToDate(t *testing.T) {
	cmd := gen.Command{Getenv: func(string) string { return "fleetnodectl" }}
	if err := cmd.Run([]string{"check", "-o", "zz_generated.ctrlkit.go", "fleetnode.ctrlkit"}); err != nil {
		t.Fatal(err)
	}
}

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

type fixture struct {
	r        *Reconciler
	c        client.Client
	recorder *events.FakeRecorder
}

func newFixture(t *testing.T, funcs interceptor.Funcs, objs ...client.Object) *fixture {
	t.Helper()
	f := &fixture{recorder: events.NewFakeRecorder(10)}
	f.c = fake.NewClientBuilder().WithScheme(testScheme(t)).
		WithObjects(objs...).WithStatusSubresource(&fleetv1.FleetNode{}).
		WithInterceptorFuncs(funcs).Build()
	f.r = &Reconciler{Client: f.c, Recorder: f.recorder, Clock: fixedClock(now)}
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

func TestReconcileRecordsAnAutoApprovalWithoutAnEvent(t *testing.T) {
	f := newFixture(t, interceptor.Funcs{}, registered(true))
	if res, err := f.reconcile(t); err != nil || !res.IsZero() {
		t.Fatalf("Reconcile() = %+v, %v; want no requeue, no error", res, err)
	}
	n := f.node(t)
	if c := meta.FindStatusCondition(n.Status.Conditions, fleetv1.ApprovedCondition); n.Status.Phase != fleetv1.FleetNodePending || c == nil || c.Reason != fleetv1.ReasonAutoApproved {
		t.Errorf("phase %s, Approved %+v; want Pending, AutoApproved", n.Status.Phase, c)
	}
	if ev := f.events(); len(ev) != 0 {
		t.Errorf("events = %q, want none", ev)
	}
}

func TestReconcileAnnouncesAnOperatorsApprovalAndARevocation(t *testing.T) {
	f := newFixture(t, interceptor.Funcs{}, registered(false))
	if _, err := f.reconcile(t); err != nil {
		t.Fatal(err)
	}
	n := f.node(t)
	n.Spec.Approved = true
	if err := f.c.Update(t.Context(), n); err != nil {
		t.Fatal(err)
	}
	if _, err := f.reconcile(t); err != nil {
		t.Fatal(err)
	}
	ev := f.events()
	if len(ev) != 1 || !strings.HasPrefix(ev[0], "Normal "+fleetv1.ReasonApproved+" ") {
		t.Errorf("events after approving = %q, want one Normal %s", ev, fleetv1.ReasonApproved)
	}
	n = f.node(t)
	n.Spec.Revoked = true
	if err := f.c.Update(t.Context(), n); err != nil {
		t.Fatal(err)
	}
	if _, err := f.reconcile(t); err != nil {
		t.Fatal(err)
	}
	if got := f.node(t).Status.Phase; got != fleetv1.FleetNodeRevoked {
		t.Errorf("phase = %s, want Revoked", got)
	}
	ev = f.events()
	if len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning "+fleetv1.ReasonRevoked+" ") {
		t.Errorf("events after revoking = %q, want one Warning %s", ev, fleetv1.ReasonRevoked)
	}
	// Nothing left to decide: no write, no Event.
	if _, err := f.reconcile(t); err != nil {
		t.Fatal(err)
	}
	if ev := f.events(); len(ev) != 0 {
		t.Errorf("events of a settled node = %q, want none", ev)
	}
}

func TestReconcileRecordsNoEventWhenThePatchFails(t *testing.T) {
	conflict := apierrors.NewConflict(schema.GroupResource{Group: fleetv1.GroupVersion.Group, Resource: "fleetnodes"}, "n1", errors.New("a hub wrote it"))
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
			n := online("hub-a")
			n.Spec.Revoked = true
			f := newFixture(t, funcs, n)
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

// fixedClock is a clock stopped at t.
func fixedClock(t time.Time) clock.Clock { return clocktest.New(t) }
