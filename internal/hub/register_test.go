package hub

import (
	"context"
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/testenv"
)

// TestRegistrationWrites: a node that registers with an auto-approving
// token and connects costs the API three writes before its first NodeState
// (create, first status with the certificate's expiry, connect), not one
// per step; the FleetNode still shows every fact the steps used to write
// one by one.
func TestRegistrationWrites(t *testing.T) {
	f := newFixture(t, "hub-register-writes")
	h := f.startHub(Options{Name: "hub-register-writes", Status: &sink{}})
	const node = "register-writes-node"
	f.startAgent(f.agentOpts(node, h, newRunner()))
	waitConnected(t, h, node)

	var fn fleetv1.FleetNode
	testenv.Eventually(t, waitTimeout, "node Online with its registration facts", func(ctx context.Context) (bool, error) {
		if err := f.c.Get(ctx, client.ObjectKey{Name: node}, &fn); err != nil {
			return false, err
		}
		if fn.Status.Phase != fleetv1.FleetNodeOnline {
			return false, fmt.Errorf("phase %q", fn.Status.Phase)
		}
		return true, nil
	})
	approved := meta.FindStatusCondition(fn.Status.Conditions, fleetv1.ApprovedCondition)
	if approved == nil || approved.Reason != fleetv1.ReasonAutoApproved {
		t.Errorf("Approved condition %+v, want reason %s", approved, fleetv1.ReasonAutoApproved)
	}
	if fn.Status.CertificateExpiry == nil {
		t.Error("certificateExpiry not set")
	}
	if fn.Status.Capacity.Cpu().String() != "1" {
		t.Errorf("capacity cpu %s, want 1", fn.Status.Capacity.Cpu())
	}
	if fn.Status.Hub != "hub-register-writes" {
		t.Errorf("hub %q", fn.Status.Hub)
	}
	for _, tc := range []struct {
		reason string
		want   float64
	}{
		{"register", 2}, // the create and the first status
		{"certificate", 0},
		{"connect", 1},
	} {
		if got := h.counter(t, "drover_hub_api_writes_total", tc.reason); got != tc.want {
			t.Errorf("writes for %s: %v, want %v", tc.reason, got, tc.want)
		}
	}
}
