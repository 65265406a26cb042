package scheduler

import (
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/tenancy"
)

func nodeGrant(name string, mutate func(*fleetv1.NodeGrantSpec)) fleetv1.NodeGrant {
	g := fleetv1.NodeGrant{ObjectMeta: metav1.ObjectMeta{Name: name}}
	mutate(&g.Spec)
	return g
}

// The tenancy filter: a node is eligible only if a grant of the task's
// namespace selects it and allows the task's user, group and dir as a whole.
func TestPlaceUnderTheTenancyPolicy(t *testing.T) {
	lab := map[string]string{"pool": "lab"}
	prod := map[string]string{"pool": "prod"}
	labOnly := nodeGrant("lab", func(s *fleetv1.NodeGrantSpec) {
		s.Namespaces = []string{"team-a"}
		s.NodeSelector = metav1.LabelSelector{MatchLabels: lab}
	})
	rootOnLab := nodeGrant("root-on-lab", func(s *fleetv1.NodeGrantSpec) {
		s.Namespaces = []string{"team-a"}
		s.NodeSelector = metav1.LabelSelector{MatchLabels: lab}
		s.RunAs = &fleetv1.RunAsPolicy{Users: []fleetv1.IDRange{{Min: 0, Max: 0}}}
	})
	uid1000Everywhere := nodeGrant("uid-1000", func(s *fleetv1.NodeGrantSpec) {
		s.Namespaces = []string{"team-a"}
		s.RunAs = &fleetv1.RunAsPolicy{Users: []fleetv1.IDRange{{Min: 1000, Max: 1000}}}
	})
	bySelector := nodeGrant("labelled", func(s *fleetv1.NodeGrantSpec) {
		s.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"tenant": "a"}}
		s.NodeSelector = metav1.LabelSelector{MatchLabels: prod}
	})
	hostDir := nodeGrant("builds", func(s *fleetv1.NodeGrantSpec) {
		s.Namespaces = []string{"team-a"}
		s.HostDirs = []string{"/srv/builds"}
	})
	nodes := []Node{
		online("lab-1", nil, lab), online("lab-2", nil, lab),
		online("prod-1", nil, prod), online("prod-2", nil, prod), online("prod-3", nil, prod),
	}
	asUser := func(uid int64) func(*batchv1.Task) {
		return func(t *batchv1.Task) { t.Spec.SecurityContext = &batchv1.TaskSecurityContext{RunAsUser: &uid} }
	}
	tests := []struct {
		name     string
		grants   []fleetv1.NodeGrant
		nsLabels map[string]string
		nodes    []Node
		mutate   func(*batchv1.Task)
		// want is the node, or one of oneOf; else message and denied.
		want    string
		oneOf   []string
		message string
		// denied: Result.Denied is set and its text is in the message.
		denied bool
	}{
		{
			name:   "placed on a granted node only",
			grants: []fleetv1.NodeGrant{labOnly},
			nodes:  []Node{online("prod-1", nil, prod), online("lab-1", nil, lab), online("prod-2", nil, prod)},
			want:   "lab-1",
		},
		{
			name:   "no grant at all: every node is counted, and the policy says why",
			nodes:  nodes,
			denied: true,
			message: `0/5 nodes are available: 5 not granted to the namespace. namespace "team-a" has no NodeGrant: it may not run work on any node ` +
				`(a cluster administrator grants nodes to namespaces with a NodeGrant, fleet.drover.io)`,
		},
		{
			name:    "counted with the other reasons",
			grants:  []fleetv1.NodeGrant{labOnly},
			nodes:   append([]Node{{Name: "lab-3", Phase: fleetv1.FleetNodeOnline, Unschedulable: true, Labels: lab}}, nodes[2:]...),
			message: "0/4 nodes are available: 3 not granted to the namespace, 1 unschedulable.",
		},
		{
			name:   "an ungranted node's state is not told",
			grants: []fleetv1.NodeGrant{labOnly},
			nodes: []Node{{Name: "prod-off", Phase: fleetv1.FleetNodeOffline, Labels: prod},
				{Name: "lab-off", Phase: fleetv1.FleetNodeOffline, Labels: lab}},
			message: "0/2 nodes are available: 1 Offline, 1 not granted to the namespace.",
		},
		{
			name:    "nodeName naming an ungranted node: refused in the policy's words",
			grants:  []fleetv1.NodeGrant{labOnly},
			nodes:   nodes,
			mutate:  func(t *batchv1.Task) { t.Spec.NodeName = "prod-2" },
			denied:  true,
			message: `node "prod-2" is not granted to namespace "team-a" for this work: NodeGrant "lab" grants only nodes pool=lab`,
		},
		{
			name:   "nodeName naming a granted node",
			grants: []fleetv1.NodeGrant{labOnly},
			nodes:  nodes,
			mutate: func(t *batchv1.Task) { t.Spec.NodeName = "lab-2" },
			want:   "lab-2",
		},
		{
			name:    "nodeName naming no node is not a policy matter",
			grants:  []fleetv1.NodeGrant{labOnly},
			nodes:   nodes[:2],
			mutate:  func(t *batchv1.Task) { t.Spec.NodeName = "gone" },
			message: "0/2 nodes are available: 2 did not match nodeName.",
		},
		{
			name:   "root where one grant allows root",
			grants: []fleetv1.NodeGrant{rootOnLab, uid1000Everywhere},
			nodes:  nodes,
			mutate: asUser(0),
			oneOf:  []string{"lab-1", "lab-2"},
		},
		{
			name:    "grants do not add up: root is not allowed on prod by uid-1000's grant",
			grants:  []fleetv1.NodeGrant{rootOnLab, uid1000Everywhere},
			nodes:   nodes[2:],
			mutate:  asUser(0),
			message: "0/3 nodes are available: 3 not granted to the namespace.",
		},
		{
			name:   "grants do not add up: pinned root on prod names both grants",
			grants: []fleetv1.NodeGrant{rootOnLab, uid1000Everywhere},
			nodes:  nodes,
			mutate: func(t *batchv1.Task) { asUser(0)(t); t.Spec.NodeName = "prod-1" },
			denied: true,
			message: `node "prod-1" is not granted to namespace "team-a" for this work: NodeGrant "root-on-lab" grants only nodes pool=lab; ` +
				`NodeGrant "uid-1000" does not allow runAsUser 0 (users 1000)`,
		},
		{
			name:   "a user no grant allows: denied whatever the nodes",
			grants: []fleetv1.NodeGrant{labOnly},
			nodes:  nodes,
			mutate: asUser(0),
			denied: true,
			message: `0/5 nodes are available: 5 not granted to the namespace. namespace "team-a" may not run this work: ` +
				`NodeGrant "lab" does not allow runAsUser 0 (it allows only the node's task user)`,
		},
		{
			name:     "granted by the namespace's labels",
			grants:   []fleetv1.NodeGrant{bySelector},
			nsLabels: map[string]string{"tenant": "a"},
			nodes:    nodes,
			oneOf:    []string{"prod-1", "prod-2", "prod-3"},
		},
		{
			name:     "a namespace without the label is not granted",
			grants:   []fleetv1.NodeGrant{bySelector},
			nsLabels: map[string]string{"tenant": "b"},
			nodes:    nodes,
			denied:   true,
			message:  `0/5 nodes are available: 5 not granted to the namespace. namespace "team-a" has no NodeGrant`,
		},
		{
			name:   "a host workingDir under a grant's hostDirs",
			grants: []fleetv1.NodeGrant{labOnly, hostDir},
			nodes:  nodes[2:3],
			mutate: func(t *batchv1.Task) { t.Spec.WorkingDir = "/srv/builds/x" },
			want:   "prod-1",
		},
		{
			name:   "a host workingDir outside every grant's hostDirs",
			grants: []fleetv1.NodeGrant{hostDir},
			nodes:  nodes[:1],
			mutate: func(t *batchv1.Task) { t.Spec.WorkingDir = "/etc" },
			denied: true,
			message: `0/1 nodes are available: 1 not granted to the namespace. namespace "team-a" may not run this work: ` +
				`NodeGrant "builds" does not allow workingDir /etc (hostDirs: /srv/builds)`,
		},
		{
			name:   "a relative workingDir needs no grant",
			grants: []fleetv1.NodeGrant{labOnly},
			nodes:  nodes[:1],
			mutate: func(t *batchv1.Task) { t.Spec.WorkingDir = "out/build" },
			want:   "lab-1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tk := &batchv1.Task{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "t"}}
			if tt.mutate != nil {
				tt.mutate(tk)
			}
			st, err := TaskFrom(tk)
			if err != nil {
				t.Fatal(err)
			}
			st.Access = policy(tt.grants...).For("team-a", tt.nsLabels)
			got := New(tt.nodes).Place(st)
			switch {
			case tt.want != "" || len(tt.oneOf) > 0:
				if got.Node == "" || tt.want != "" && got.Node != tt.want || len(tt.oneOf) > 0 && !slices.Contains(tt.oneOf, got.Node) {
					t.Fatalf("node = %q, want %q%v (message %q)", got.Node, tt.want, tt.oneOf, got.Message)
				}
				if got.Denied != nil {
					t.Errorf("placed but denied: %v", got.Denied)
				}
				return
			case got.Node != "":
				t.Fatalf("placed on %q, want nowhere: %s", got.Node, tt.message)
			}
			if !strings.HasPrefix(got.Message, tt.message) {
				t.Errorf("message = %q\nwant      %q", got.Message, tt.message)
			}
			if tt.denied != (got.Denied != nil) {
				t.Errorf("denied = %v, want denied %v", got.Denied, tt.denied)
			} else if got.Denied != nil && !strings.Contains(got.Message, got.Denied.Error()) {
				t.Errorf("message %q does not say the policy's %q", got.Message, got.Denied)
			}
		})
	}
}

// Fail closed: a task whose caller set no Access fits nowhere.
func TestPlaceWithoutAccessFitsNowhere(t *testing.T) {
	st, err := TaskFrom(&batchv1.Task{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "t"}})
	if err != nil {
		t.Fatal(err)
	}
	got := New([]Node{online("a", nil, nil)}).Place(st)
	if got.Node != "" || got.Denied == nil || got.Reasons[ReasonNotGranted] != 1 {
		t.Errorf("Place without an Access = %+v, want nowhere, denied, 1 not granted", got)
	}
}

// WorkOf reads what a NodeGrant must allow.
func TestWorkOf(t *testing.T) {
	u, g := int64(1000), int64(2000)
	w := WorkOf(&batchv1.Task{Spec: batchv1.TaskSpec{WorkingDir: "/srv", SecurityContext: &batchv1.TaskSecurityContext{RunAsUser: &u, RunAsGroup: &g}}})
	if w.WorkingDir != "/srv" || w.RunAsUser == nil || *w.RunAsUser != 1000 || w.RunAsGroup == nil || *w.RunAsGroup != 2000 {
		t.Errorf("WorkOf = %+v", w)
	}
	if w := WorkOf(&batchv1.Task{}); w != (tenancy.Work{}) {
		t.Errorf("WorkOf(no securityContext) = %+v, want the zero Work", w)
	}
}
