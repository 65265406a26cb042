package hub

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/testenv"
)

// lostHubTimeout bounds a claim of a lost hub's node (hubs look every 5 s)
// followed by the offline timeout of the test's hubs.
const lostHubTimeout = time.Minute

func TestLeaseExpired(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	lease := func(renewed time.Time, seconds *int32) *coordinationv1.Lease {
		rt := metav1.NewMicroTime(renewed)
		return &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{RenewTime: &rt, LeaseDurationSeconds: seconds}}
	}
	for _, tt := range []struct {
		name string
		l    *coordinationv1.Lease
		want bool
	}{
		{"a Lease renewed within its duration is held", lease(t0.Add(-39*time.Second), ptr.To(int32(40))), false},
		{"a Lease not renewed for its duration has expired", lease(t0.Add(-41*time.Second), ptr.To(int32(40))), true},
		{"a Lease without a duration takes the default", lease(t0.Add(-time.Minute), nil), true},
		{"a Lease never renewed has expired", &coordinationv1.Lease{}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := leaseExpired(tt.l, t0, 40*time.Second); got != tt.want {
				t.Errorf("leaseExpired() = %v, want %v", got, tt.want)
			}
		})
	}
}

// onlineAt makes a FleetNode name that the API shows Online and Ready at hub.
func (f *fixture) onlineAt(ctx context.Context, name, hub string) {
	f.t.Helper()
	n := &fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: fleetv1.FleetNodeSpec{Approved: true}}
	if err := f.c.Create(ctx, n); err != nil {
		f.t.Fatal(err)
	}
	before := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	n.Status.Phase, n.Status.Hub, n.Status.LastHeartbeatTime = fleetv1.FleetNodeOnline, hub, &before
	meta.SetStatusCondition(&n.Status.Conditions, metav1.Condition{Type: fleetv1.ReadyCondition, Status: metav1.ConditionTrue,
		Reason: fleetv1.ReasonConnected, Message: "connected to hub " + hub, LastTransitionTime: before})
	if err := f.c.Status().Update(ctx, n); err != nil {
		f.t.Fatal(err)
	}
}

// hubLease writes hub's Lease in the fixture's namespace, last renewed at renewed.
func (f *fixture) hubLease(ctx context.Context, hub string, renewed time.Time) {
	f.t.Helper()
	rt := metav1.NewMicroTime(renewed)
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: LeaseName(hub)},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(hub), LeaseDurationSeconds: ptr.To(int32(40)), RenewTime: &rt}}
	if err := f.c.Create(ctx, l); err != nil {
		f.t.Fatal(err)
	}
}

// TestLiveHubsClaimTheNodesOfALostHub: a node still Online at a hub whose
// Lease expired, and whose agent connected nowhere since, is claimed by one
// of the live hubs (two try; the optimistic lock lets one write), shown
// Ready Unknown, HubLost, and made Offline after the claimer's offline
// timeout. A node of a hub that renews its Lease, and one of a hub without a
// Lease here (another Drover's), are left alone.
func TestLiveHubsClaimTheNodesOfALostHub(t *testing.T) {
	f := newFixture(t, "hub-lost")
	ctx := context.Background()
	f.hubLease(ctx, "hub-lost-dead", time.Now().Add(-time.Hour))
	f.hubLease(ctx, "hub-lost-alive", time.Now().Add(time.Hour))
	f.onlineAt(ctx, "lost-node", "hub-lost-dead")
	f.onlineAt(ctx, "lost-alive-node", "hub-lost-alive")
	f.onlineAt(ctx, "lost-elsewhere-node", "hub-lost-elsewhere")
	opts := Options{OfflineTimeout: 4 * time.Second, HeartbeatInterval: time.Second}
	opts.Name = "hub-lost-1"
	h1 := f.startHub(opts)
	opts.Name = "hub-lost-2"
	h2 := f.startHub(opts)

	get := func(ctx context.Context, name string) (*fleetv1.FleetNode, *metav1.Condition, error) {
		var n fleetv1.FleetNode
		if err := f.c.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
			return nil, nil, err
		}
		return &n, meta.FindStatusCondition(n.Status.Conditions, fleetv1.ReadyCondition), nil
	}
	var claimer string
	testenv.Eventually(t, lostHubTimeout, "the lost hub's node claimed, HubLost", func(ctx context.Context) (bool, error) {
		n, c, err := get(ctx, "lost-node")
		if err != nil {
			return false, err
		}
		if n.Status.Phase == fleetv1.FleetNodeOffline {
			return true, nil // claimed and already Offline: checked below
		}
		if n.Status.Hub == "hub-lost-dead" {
			return false, fmt.Errorf("still at hub-lost-dead, Ready %+v", c)
		}
		if c == nil || c.Status != metav1.ConditionUnknown || c.Reason != fleetv1.ReasonHubLost || !strings.Contains(c.Message, "hub hub-lost-dead stopped renewing its Lease") {
			return false, fmt.Errorf("hub %s, Ready %+v", n.Status.Hub, c)
		}
		claimer = n.Status.Hub
		return true, nil
	})
	testenv.Eventually(t, lostHubTimeout, "the claimed node Offline after the offline timeout", func(ctx context.Context) (bool, error) {
		n, c, err := get(ctx, "lost-node")
		if err != nil {
			return false, err
		}
		if n.Status.Phase != fleetv1.FleetNodeOffline || c == nil || c.Reason != fleetv1.ReasonHeartbeatTimeout {
			return false, fmt.Errorf("phase %s, Ready %+v", n.Status.Phase, c)
		}
		if !strings.Contains(c.Message, "took it over from a lost hub") {
			return false, fmt.Errorf("Ready message %q does not say the node's hub was lost", c.Message)
		}
		if claimer != "" && n.Status.Hub != claimer {
			return false, fmt.Errorf("Offline at hub %s, claimed by %s", n.Status.Hub, claimer)
		}
		return true, nil
	})
	if got := h1.counter(t, "drover_hub_api_writes_total", "hub-lost") + h2.counter(t, "drover_hub_api_writes_total", "hub-lost"); got != 1 {
		t.Errorf("claims written by the two hubs = %v, want 1", got)
	}
	for name, hub := range map[string]string{"lost-alive-node": "hub-lost-alive", "lost-elsewhere-node": "hub-lost-elsewhere"} {
		n, c, err := get(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if n.Status.Phase != fleetv1.FleetNodeOnline || n.Status.Hub != hub || c == nil || c.Status != metav1.ConditionTrue {
			t.Errorf("%s: phase %s, hub %s, Ready %+v; want it left Online and Ready at %s", name, n.Status.Phase, n.Status.Hub, c, hub)
		}
	}
}

// TestRevokedNodeIsNotReady: revoking a connected node closes its stream,
// and its hub sets Ready False, Revoked; the phase is the manager's (no
// manager runs here), so the hub leaves it.
func TestRevokedNodeIsNotReady(t *testing.T) {
	f := newFixture(t, "hub-revoked")
	h := f.startHub(Options{Name: "hub-revoked", Features: feature(nil, &sink{})})
	const node = "revoked-node"
	f.startAgent(f.agentOpts(node, h, newRunner()))
	waitConnected(t, h, node)
	testenv.Eventually(t, waitTimeout, "node Online", func(ctx context.Context) (bool, error) {
		var n fleetv1.FleetNode
		if err := f.c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
			return false, err
		}
		return n.Status.Phase == fleetv1.FleetNodeOnline, nil
	})
	ctx := context.Background()
	var n fleetv1.FleetNode
	if err := f.c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(n.DeepCopy())
	n.Spec.Revoked = true
	if err := f.c.Patch(ctx, &n, patch); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, lostHubTimeout, "Ready False, Revoked", func(ctx context.Context) (bool, error) {
		if err := f.c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(n.Status.Conditions, fleetv1.ReadyCondition)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != fleetv1.ReasonRevoked {
			return false, fmt.Errorf("phase %s, Ready %+v", n.Status.Phase, c)
		}
		return true, nil
	})
	if n.Status.Phase != fleetv1.FleetNodeOnline {
		t.Errorf("phase = %s, want the hub to leave it (Online; the manager makes it Revoked)", n.Status.Phase)
	}
}
