package tenancy

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
)

func ptr(v int64) *int64 { return &v }

func policy(t *testing.T) *Policy {
	t.Helper()
	p, errs := Compile([]fleetv1.NodeGrant{
		{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}, Spec: fleetv1.NodeGrantSpec{
			Namespaces:   []string{"team-a"},
			NodeSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pool": "a"}},
			RunAs:        &fleetv1.RunAsPolicy{Users: []fleetv1.IDRange{{Min: 1000, Max: 1999}}},
		}},
		{ObjectMeta: metav1.ObjectMeta{Name: "lab-root"}, Spec: fleetv1.NodeGrantSpec{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"lab": "true"}},
			NodeSelector:      metav1.LabelSelector{MatchLabels: map[string]string{"pool": "lab"}},
			RunAs:             &fleetv1.RunAsPolicy{Users: []fleetv1.IDRange{{Min: 0, Max: 0}}},
			HostDirs:          []string{"/srv/lab/"},
		}},
		{ObjectMeta: metav1.ObjectMeta{Name: "broken"}, Spec: fleetv1.NodeGrantSpec{
			Namespaces:   []string{"team-a", "team-b"},
			NodeSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "x", Operator: "Bogus"}}},
		}},
	})
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), `"broken" grants nothing`) {
		t.Fatalf("compile errors %v, want one for the broken grant", errs)
	}
	return p
}

func TestCheckNode(t *testing.T) {
	p := policy(t)
	poolA := map[string]string{"pool": "a"}
	lab := map[string]string{"pool": "lab"}
	tests := []struct {
		name    string
		ns      string
		nsLbl   map[string]string
		work    Work
		node    map[string]string
		wantErr string
	}{
		{"granted node, default user", "team-a", nil, Work{}, poolA, ""},
		{"ungranted node", "team-a", nil, Work{}, lab, `node "n" is not granted to namespace "team-a" for this work: NodeGrant "team-a" grants only nodes pool=a`},
		{"namespace without grant", "team-c", nil, Work{}, poolA, `namespace "team-c" has no NodeGrant`},
		{"broken grant grants nothing", "team-b", nil, Work{}, poolA, `namespace "team-b" has no NodeGrant`},
		{"user in range", "team-a", nil, Work{RunAsUser: ptr(1500)}, poolA, ""},
		{"root refused", "team-a", nil, Work{RunAsUser: ptr(0)}, poolA, "does not allow runAsUser 0 (users 1000-1999)"},
		{"group defaults to user ranges", "team-a", nil, Work{RunAsUser: ptr(1500), RunAsGroup: ptr(5)}, poolA, "does not allow group 5"},
		{"host dir not granted", "team-a", nil, Work{WorkingDir: "/etc"}, poolA, "allows no host workingDir"},
		{"relative dir needs no grant", "team-a", nil, Work{WorkingDir: "out"}, poolA, ""},
		{"by namespace label, root in lab", "x", map[string]string{"lab": "true"}, Work{RunAsUser: ptr(0), WorkingDir: "/srv/lab/run"}, lab, ""},
		{"host dir prefix is not a parent", "x", map[string]string{"lab": "true"}, Work{WorkingDir: "/srv/laboratory"}, lab, "does not allow workingDir /srv/laboratory"},
		{"grants do not add up", "team-a", map[string]string{"lab": "true"}, Work{RunAsUser: ptr(0)}, poolA, `NodeGrant "lab-root" grants only nodes pool=lab; NodeGrant "team-a" does not allow runAsUser 0`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := p.For(tt.ns, tt.nsLbl)
			err := a.CheckNode(tt.work, "n", tt.node)
			if allowed := a.Allows(tt.work, tt.node); allowed != (err == nil) {
				t.Errorf("Allows = %v, CheckNode = %v: they disagree", allowed, err)
			}
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("CheckNode: %v", err)
				}
				if err := a.Check(tt.work); err != nil {
					t.Fatalf("Check refuses what CheckNode allows: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("CheckNode = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	p := policy(t)
	if err := p.For("team-a", nil).Check(Work{RunAsUser: ptr(1200)}); err != nil {
		t.Fatalf("Check: %v", err)
	}
	err := p.For("team-a", nil).Check(Work{RunAsUser: ptr(0)})
	if err == nil || !strings.Contains(err.Error(), `namespace "team-a" may not run this work: NodeGrant "team-a" does not allow runAsUser 0`) {
		t.Fatalf("Check = %v", err)
	}
	if got := p.For("team-a", map[string]string{"lab": "true"}).Grants(); strings.Join(got, ",") != "lab-root,team-a" {
		t.Fatalf("Grants = %v", got)
	}
}
