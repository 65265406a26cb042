package hub

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/bootstrap"
	"github.com/drover-fleet/drover/internal/pki"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/testenv"
)

// TestRegistrationWrites: a node that registers with an auto-approving
// token and connects costs the API three writes before its first NodeState
// (create, first status with the certificate's expiry, connect), not one
// per step; the FleetNode still shows every fact the steps used to write
// one by one.
func TestRegistrationWrites(t *testing.T) {
	f := newFixture(t, "hub-register-writes")
	h := f.startHub(Options{Name: "hub-register-writes", Features: feature(nil, &sink{})})
	const node = "register-writes-node"
	f.startAgent(f.agentOpts(node, h, newRunner()))
	waitConnected(t, h, node)

	// Ready at this hub: its connect is written, not only its stream open.
	f.waitReady(h, node)
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
	// The Approved condition is the manager's: the hub records who approved.
	if !fn.Spec.Approved || fn.Annotations[fleetv1.AnnotationAutoApprovedBy] == "" || fn.Annotations[fleetv1.AnnotationAutoApprovedBy] != fn.Annotations[fleetv1.AnnotationBootstrapToken] {
		t.Errorf("approved %v, annotations %v; want approved by the bootstrap token", fn.Spec.Approved, fn.Annotations)
	}
	if c := meta.FindStatusCondition(fn.Status.Conditions, fleetv1.ApprovedCondition); c != nil {
		t.Errorf("the hub wrote the Approved condition %+v; it is the manager's", c)
	}
	if fn.Status.CertificateExpiry == nil {
		t.Error("certificateExpiry not set")
	}
	// What the agent reports is a claim in the status; the token approved
	// it as registered, in the spec. Capping and labels are the manager's.
	if fn.Status.ReportedCapacity.Cpu().String() != "1" || fn.Spec.ApprovedCapacity.Cpu().String() != "1" || fn.Status.Capacity != nil {
		t.Errorf("reported capacity %v, approved %v, capacity %v; want cpu 1, cpu 1 and none (the manager's)",
			fn.Status.ReportedCapacity, fn.Spec.ApprovedCapacity, fn.Status.Capacity)
	}
	if fn.Spec.ApprovedLabels[fleetv1.LabelOS] == "" || fn.Labels[fleetv1.LabelOS] != "" {
		t.Errorf("approved labels %v, labels %v; want the os approved, and no labels written by the hub", fn.Spec.ApprovedLabels, fn.Labels)
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
		// The hub counts a write once it returned: wait for the count to
		// settle rather than for the machine to be fast.
		testenv.Eventually(t, waitTimeout, "writes for "+tc.reason, func(context.Context) (bool, error) {
			if got := h.counter(t, "drover_hub_api_writes_total", tc.reason); got != tc.want {
				return false, fmt.Errorf("writes for %s: %v, want %v", tc.reason, got, tc.want)
			}
			return true, nil
		})
	}
}

// TestRegistrationIsBoundToTheFirstKey: a bootstrap token lets a machine
// join under a new name, not take over a node another machine registered
// (a cloned VM, a typo in --node, or an impostor), whether that node waits
// for approval or holds a certificate; the first machine's retries, with its
// key, still work.
func TestRegistrationIsBoundToTheFirstKey(t *testing.T) {
	f := newFixture(t, "hub-register-key")
	h := f.startHub(Options{Name: "hub-register-key", Features: feature(nil, &sink{})})
	ctx := context.Background()
	manual, err := bootstrap.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if err := bootstrap.Create(ctx, f.c, f.ns, manual); err != nil {
		t.Fatal(err)
	}
	keyA, csrA, err := pki.NewKeyAndCSR("bound-node")
	if err != nil {
		t.Fatal(err)
	}
	_, csrB, err := pki.NewKeyAndCSR("bound-node")
	if err != nil {
		t.Fatal(err)
	}
	register := func(tok string, csr []byte) (*agentv1.RegisterResponse, error) {
		return h.Register(ctx, &agentv1.RegisterRequest{Node: "bound-node", BootstrapToken: tok, Csr: csr, Info: &agentv1.NodeInfo{}})
	}
	refused := func(what string, err error) {
		t.Helper()
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "already registered by another machine") {
			t.Errorf("%s: %v, want PermissionDenied naming the other machine", what, err)
		}
	}
	if r, err := register(manual.String(), csrA); err != nil || r.GetResult() != agentv1.RegisterResponse_RESULT_PENDING {
		t.Fatalf("first registration: %v, %v; want pending", r, err)
	}
	_, err = register(manual.String(), csrB)
	refused("another key while the node waits for approval", err)
	// The first machine, restarted, asks again with the same key.
	again, err := pki.CSRForKey(keyA, "bound-node")
	if err != nil {
		t.Fatal(err)
	}
	if r, err := register(manual.String(), again); err != nil || r.GetResult() != agentv1.RegisterResponse_RESULT_PENDING {
		t.Errorf("the first machine again: %v, %v; want pending", r, err)
	}
	var fn fleetv1.FleetNode
	if err := f.c.Get(ctx, client.ObjectKey{Name: "bound-node"}, &fn); err != nil {
		t.Fatal(err)
	}
	fn.Spec.Approved = true
	if err := f.c.Update(ctx, &fn); err != nil {
		t.Fatal(err)
	}
	if r, err := register(manual.String(), again); err != nil || r.GetResult() != agentv1.RegisterResponse_RESULT_APPROVED {
		t.Fatalf("the first machine once approved: %v, %v; want a certificate", r, err)
	}
	_, err = register(f.token(), csrB)
	refused("another key, with an auto-approving token, once the node holds a certificate", err)
}
