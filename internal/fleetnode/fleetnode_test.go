package fleetnode

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"maps"
	"math/big"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/diff"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
)

var (
	t0      = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	now     = t0.Add(time.Hour)
	timeout = 5 * time.Minute
)

// cond is a condition as the tests compare it: without LastTransitionTime.
func cond(typ string, st metav1.ConditionStatus, reason, msg string) metav1.Condition {
	return metav1.Condition{Type: typ, Status: st, Reason: reason, Message: msg}
}

func readyC(st metav1.ConditionStatus, reason, msg string) metav1.Condition {
	return cond(fleetv1.ReadyCondition, st, reason, msg)
}

func approvedC(st metav1.ConditionStatus, reason, msg string) metav1.Condition {
	return cond(fleetv1.ApprovedCondition, st, reason, msg)
}

// node is n1, approved, with the given phase, hub and conditions (their
// LastTransitionTime t0).
func node(phase fleetv1.FleetNodePhase, hub string, conds ...metav1.Condition) *fleetv1.FleetNode {
	n := &fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: fleetv1.FleetNodeSpec{Approved: true},
		Status: fleetv1.FleetNodeStatus{Phase: phase, Hub: hub}}
	for _, c := range conds {
		c.LastTransitionTime = metav1.NewTime(t0)
		n.Status.Conditions = append(n.Status.Conditions, c)
	}
	return n
}

func revoked(n *fleetv1.FleetNode) *fleetv1.FleetNode { n.Spec.Revoked = true; return n }

// connectedAt is n1 Online and Ready at hub.
func connectedAt(hub string) *fleetv1.FleetNode {
	return node(fleetv1.FleetNodeOnline, hub, readyC(metav1.ConditionTrue, fleetv1.ReasonConnected, "connected to hub "+hub))
}

// withoutTransitionTimes is conds without their LastTransitionTime.
func withoutTransitionTimes(conds []metav1.Condition) []metav1.Condition {
	out := []metav1.Condition{}
	for _, c := range conds {
		c.LastTransitionTime = metav1.Time{}
		c.ObservedGeneration = 0
		out = append(out, c)
	}
	return out
}

// setterTest is one call of a setter on a node and what it must leave.
type setterTest struct {
	name      string
	node      *fleetv1.FleetNode
	set       func(*fleetv1.FleetNode) Change
	wantPhase fleetv1.FleetNodePhase
	wantHub   string
	// wantConds are the node's conditions afterwards, without
	// LastTransitionTime.
	wantConds []metav1.Condition
	// wantEvent is the reason of the Event to announce ("" for none) and
	// wantType its type.
	wantEvent, wantType string
	// wantUnchanged says the setter must report no change (and change
	// nothing).
	wantUnchanged bool
}

func runSetterTests(t *testing.T, tests []setterTest) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.node.DeepCopy()
			c := tt.set(tt.node)
			if c.Changed == tt.wantUnchanged {
				t.Errorf("Changed = %v, want %v", c.Changed, !tt.wantUnchanged)
			}
			if tt.wantUnchanged {
				if !equality.Semantic.DeepEqual(before, tt.node) {
					t.Errorf("reported no change but changed the node:\n%s", diff.Diff(before, tt.node))
				}
			}
			if c.Event.Reason != tt.wantEvent || c.Event.Type != tt.wantType {
				t.Errorf("Event = %s %q (%q), want %s %q", c.Event.Type, c.Event.Reason, c.Event.Note, tt.wantType, tt.wantEvent)
			}
			if c.Event.Reason != "" && c.Event.Note == "" {
				t.Errorf("Event %s has no note", c.Event.Reason)
			}
			if tt.node.Status.Phase != tt.wantPhase {
				t.Errorf("phase = %q, want %q", tt.node.Status.Phase, tt.wantPhase)
			}
			if tt.node.Status.Hub != tt.wantHub {
				t.Errorf("hub = %q, want %q", tt.node.Status.Hub, tt.wantHub)
			}
			if got := withoutTransitionTimes(tt.node.Status.Conditions); !equality.Semantic.DeepEqual(got, withoutTransitionTimes(tt.wantConds)) {
				t.Errorf("conditions (-got +want):\n%s", diff.Diff(got, withoutTransitionTimes(tt.wantConds)))
			}
		})
	}
}

func TestSetReported(t *testing.T) {
	info := &Info{AgentVersion: "v1", OS: "linux", Arch: "arm64", Hostname: "edge",
		Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}, Labels: map[string]string{"site": "berlin"}}
	n := node(fleetv1.FleetNodePending, "")
	if !SetReported(n, info) {
		t.Fatal("SetReported() of a new node = false, want true")
	}
	if s := n.Status; s.AgentVersion != "v1" || s.OS != "linux" || s.Arch != "arm64" || s.Hostname != "edge" || s.ReportedCapacity.Cpu().String() != "2" ||
		!maps.Equal(s.ReportedLabels, map[string]string{"site": "berlin", fleetv1.LabelOS: "linux", fleetv1.LabelArch: "arm64", fleetv1.LabelHostname: "edge"}) {
		t.Errorf("status after SetReported = %+v", s)
	}
	if n.Status.Capacity != nil {
		t.Errorf("SetReported wrote capacity %v: the claim is the manager's to cap", n.Status.Capacity)
	}
	// The same again (capacity spelled otherwise) is no change.
	same := *info
	same.Capacity = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2000m")}
	if SetReported(n, &same) {
		t.Error("SetReported() of the same facts = true, want false")
	}
	if SetReported(n, nil) {
		t.Error("SetReported(nil) = true, want false")
	}
	// No labels reported means none but the node's facts; an agent label
	// with a reserved key is dropped, and a NodeState without the facts
	// keeps them.
	none := Info{Labels: map[string]string{fleetv1.LabelOS: "plan9"}}
	if !SetReported(n, &none) || !maps.Equal(n.Status.ReportedLabels, map[string]string{fleetv1.LabelOS: "linux", fleetv1.LabelArch: "arm64", fleetv1.LabelHostname: "edge"}) {
		t.Errorf("SetReported() without labels left %v", n.Status.ReportedLabels)
	}
}

// cert is a certificate as SetCertificate reads it (unsigned).
func cert(serial int64, notBefore time.Time, validity time.Duration) *x509.Certificate {
	return &x509.Certificate{SerialNumber: big.NewInt(serial), Issuer: pkix.Name{CommonName: "drover-ca"},
		NotBefore: notBefore.Add(-5 * time.Minute), NotAfter: notBefore.Add(validity)}
}

func serials(n *fleetv1.FleetNode) []string {
	var out []string
	for _, c := range n.Status.Certificates {
		out = append(out, c.Serial)
	}
	return out
}

func TestSetCertificate(t *testing.T) {
	n := node(fleetv1.FleetNodePending, "")
	c := cert(0xa1, now, time.Hour+time.Millisecond)
	if !SetCertificate(n, c) || !n.Status.CertificateExpiry.Time.Equal(now.Add(time.Hour)) {
		t.Errorf("SetCertificate() set expiry %v, want %v", n.Status.CertificateExpiry, now.Add(time.Hour))
	}
	want := fleetv1.NodeCertificate{Serial: "a1", Issuer: "drover-ca", NotAfter: metav1.NewTime(now.Add(time.Hour))}
	if len(n.Status.Certificates) != 1 || n.Status.Certificates[0] != want {
		t.Errorf("certificates %+v, want [%+v]", n.Status.Certificates, want)
	}
	if SetCertificate(n, c) {
		t.Error("SetCertificate() of the same certificate = true, want false")
	}
}

// TestSetCertificateIsBounded: renewing at two thirds of the lifetime
// keeps the two unexpired certificates; a burst of signings keeps
// MaxCertificates, the newest and those expiring last.
func TestSetCertificateIsBounded(t *testing.T) {
	const life = 7 * 24 * time.Hour
	n := node(fleetv1.FleetNodePending, "")
	at := now
	for i := range int64(20) {
		SetCertificate(n, cert(i+1, at, life))
		at = at.Add(life * 2 / 3)
	}
	// Signed at 18·(2/3)life and 19·(2/3)life: 19's is the only other
	// one unexpired when 20's was signed.
	if got := serials(n); !slices.Equal(got, []string{"13", "14"}) {
		t.Errorf("after 20 renewals: serials %v, want [13 14] (hex of 19, 20)", got)
	}

	n = node(fleetv1.FleetNodePending, "")
	for i := range int64(10) {
		// Each signed a minute after the last, for a shorter lifetime
		// than the one before but the last.
		validity := life - time.Duration(i)*time.Hour
		if i == 9 {
			validity = time.Hour
		}
		SetCertificate(n, cert(i+1, now.Add(time.Duration(i)*time.Minute), validity))
		if len(n.Status.Certificates) > MaxCertificates {
			t.Fatalf("after %d signings: %d certificates, more than %d", i+1, len(n.Status.Certificates), MaxCertificates)
		}
	}
	if got := serials(n); !slices.Equal(got, []string{"1", "2", "3", "a"}) {
		t.Errorf("after a burst: serials %v, want those expiring last and the newest: [1 2 3 a]", got)
	}
	if !n.Status.CertificateExpiry.Time.Equal(now.Add(9*time.Minute + time.Hour)) {
		t.Errorf("expiry %v, want the newest certificate's", n.Status.CertificateExpiry)
	}
}

// A condition whose status does not change keeps its transition time.
func TestSettersKeepTheTransitionTimeOfAnUnchangedStatus(t *testing.T) {
	n := connectedAt("hub-a")
	SetConnected(n, "hub-b", now, nil)
	if c := ready(n); c.Reason != fleetv1.ReasonMovedHub || !c.LastTransitionTime.Time.Equal(t0) {
		t.Errorf("Ready after a move = %+v, want MovedHub since %v", c, t0)
	}
	SetDisconnected(n, "hub-b", now, timeout)
	if c := ready(n); c.Status != metav1.ConditionUnknown || !c.LastTransitionTime.Time.Equal(now) {
		t.Errorf("Ready after a disconnect = %+v, want Unknown since %v", c, now)
	}
}
