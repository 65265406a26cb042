// Package tenancy decides which nodes a namespace's work may run on, and as
// whom, from the cluster's NodeGrants (fleet.drover.io). It is pure: the
// admission webhook and the scheduler both ask it, so that what the API
// admits and where work is placed never disagree.
//
// The model fails closed. A namespace that no NodeGrant names reaches no
// node. A namespace named by several grants reaches their union, but each
// piece of work must be allowed by one grant as a whole: its node, its user
// and group, its working dir. (Two grants, "root on the lab nodes" and
// "uid 1000 everywhere", do not add up to "root everywhere".)
package tenancy

import (
	"fmt"
	"path"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
)

// Work is what a piece of work asks of the node it runs on.
type Work struct {
	// RunAsUser and RunAsGroup as the spec sets them; nil is the node's own
	// unprivileged task user, which every grant allows.
	RunAsUser, RunAsGroup *int64
	// WorkingDir as the spec sets it. Relative dirs stay inside the
	// attempt's own directory and need no grant; absolute ones must lie
	// under one of the grant's hostDirs.
	WorkingDir string
}

// Policy is the cluster's NodeGrants, compiled.
type Policy struct {
	grants []grant
}

type grant struct {
	name       string
	namespaces map[string]bool
	nsSel      labels.Selector // nil: by name only
	nodeSel    labels.Selector
	nodeDesc   string
	users      []fleetv1.IDRange
	groups     []fleetv1.IDRange
	hostDirs   []string
}

// Compile reads grants. A grant whose selectors do not parse grants
// nothing (it fails closed) and is returned among the errors, so that the
// caller can report it; the rest still apply.
func Compile(grants []fleetv1.NodeGrant) (*Policy, []error) {
	p := &Policy{}
	var errs []error
	for i := range grants {
		g, err := compile(&grants[i])
		if err != nil {
			errs = append(errs, fmt.Errorf("NodeGrant %q grants nothing: %w", grants[i].Name, err))
			continue
		}
		p.grants = append(p.grants, g)
	}
	sort.Slice(p.grants, func(i, j int) bool { return p.grants[i].name < p.grants[j].name })
	return p, errs
}

func compile(ng *fleetv1.NodeGrant) (grant, error) {
	g := grant{name: ng.Name, namespaces: map[string]bool{}}
	for _, ns := range ng.Spec.Namespaces {
		g.namespaces[ns] = true
	}
	if ng.Spec.NamespaceSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(ng.Spec.NamespaceSelector)
		if err != nil {
			return g, fmt.Errorf("invalid namespaceSelector: %w", err)
		}
		g.nsSel = s
	}
	s, err := metav1.LabelSelectorAsSelector(&ng.Spec.NodeSelector)
	if err != nil {
		return g, fmt.Errorf("invalid nodeSelector: %w", err)
	}
	g.nodeSel = s
	g.nodeDesc = s.String()
	if g.nodeDesc == "" {
		g.nodeDesc = "every node"
	}
	if ng.Spec.RunAs != nil {
		g.users = ng.Spec.RunAs.Users
		g.groups = ng.Spec.RunAs.Groups
		if len(g.groups) == 0 {
			g.groups = g.users
		}
	}
	for _, d := range ng.Spec.HostDirs {
		g.hostDirs = append(g.hostDirs, path.Clean(d))
	}
	return g, nil
}

// Len is the number of grants in force.
func (p *Policy) Len() int { return len(p.grants) }

// For is what namespace ns (with its labels) is granted.
func (p *Policy) For(ns string, nsLabels map[string]string) Access {
	a := Access{Namespace: ns}
	set := labels.Set(nsLabels)
	for i := range p.grants {
		g := &p.grants[i]
		if g.namespaces[ns] || (g.nsSel != nil && g.nsSel.Matches(set)) {
			a.grants = append(a.grants, g)
		}
	}
	return a
}

// Access is what one namespace is granted.
type Access struct {
	Namespace string
	grants    []*grant
}

// Grants names the grants that apply, sorted.
func (a Access) Grants() []string {
	out := make([]string, len(a.grants))
	for i, g := range a.grants {
		out[i] = g.name
	}
	return out
}

// Check says whether some grant of the namespace allows w on some node:
// what admission can decide before the work has a node. The error names
// the grants and what they allow.
func (a Access) Check(w Work) error {
	if len(a.grants) == 0 {
		return a.noGrant()
	}
	var why []string
	for _, g := range a.grants {
		reason := g.allows(w)
		if reason == "" {
			return nil
		}
		why = append(why, fmt.Sprintf("NodeGrant %q %s", g.name, reason))
	}
	return fmt.Errorf("namespace %q may not run this work: %s", a.Namespace, strings.Join(why, "; "))
}

// CheckNode says whether some grant of the namespace allows w on the node
// named nodeName with labels nodeLabels. The error names the grants and
// what they select.
func (a Access) CheckNode(w Work, nodeName string, nodeLabels map[string]string) error {
	if len(a.grants) == 0 {
		return a.noGrant()
	}
	set := labels.Set(nodeLabels)
	var why []string
	for _, g := range a.grants {
		if !g.nodeSel.Matches(set) {
			why = append(why, fmt.Sprintf("NodeGrant %q grants %s", g.name, describeSelector(g.nodeDesc)))
			continue
		}
		reason := g.allows(w)
		if reason == "" {
			return nil
		}
		why = append(why, fmt.Sprintf("NodeGrant %q %s", g.name, reason))
	}
	return fmt.Errorf("node %q is not granted to namespace %q for this work: %s", nodeName, a.Namespace, strings.Join(why, "; "))
}

// Allows is CheckNode without the message, for the scheduler's filter.
func (a Access) Allows(w Work, nodeLabels map[string]string) bool {
	set := labels.Set(nodeLabels)
	for _, g := range a.grants {
		if g.nodeSel.Matches(set) && g.allows(w) == "" {
			return true
		}
	}
	return false
}

func (a Access) noGrant() error {
	return fmt.Errorf("namespace %q has no NodeGrant: it may not run work on any node (a cluster administrator grants nodes to namespaces with a NodeGrant, fleet.drover.io)", a.Namespace)
}

func describeSelector(desc string) string {
	if desc == "every node" {
		return desc
	}
	return "only nodes " + desc
}

// allows is "" when g allows w's user, group and dir, else why not.
func (g *grant) allows(w Work) string {
	if w.RunAsUser != nil && !inRanges(*w.RunAsUser, g.users) {
		return fmt.Sprintf("does not allow runAsUser %d (%s)", *w.RunAsUser, describeRanges("users", g.users))
	}
	gid := w.RunAsGroup
	if gid == nil {
		gid = w.RunAsUser
	}
	if gid != nil && !inRanges(*gid, g.groups) {
		return fmt.Sprintf("does not allow group %d (%s)", *gid, describeRanges("groups", g.groups))
	}
	if path.IsAbs(w.WorkingDir) && !underAny(path.Clean(w.WorkingDir), g.hostDirs) {
		if len(g.hostDirs) == 0 {
			return fmt.Sprintf("allows no host workingDir such as %s (only dirs inside the attempt's own)", w.WorkingDir)
		}
		return fmt.Sprintf("does not allow workingDir %s (hostDirs: %s)", w.WorkingDir, strings.Join(g.hostDirs, ", "))
	}
	return ""
}

func inRanges(id int64, rs []fleetv1.IDRange) bool {
	for _, r := range rs {
		if id >= r.Min && id <= r.Max {
			return true
		}
	}
	return false
}

func describeRanges(what string, rs []fleetv1.IDRange) string {
	if len(rs) == 0 {
		return "it allows only the node's task user"
	}
	parts := make([]string, len(rs))
	for i, r := range rs {
		if r.Min == r.Max {
			parts[i] = fmt.Sprint(r.Min)
		} else {
			parts[i] = fmt.Sprintf("%d-%d", r.Min, r.Max)
		}
	}
	return what + " " + strings.Join(parts, ", ")
}

// underAny: dir is one of roots or below one. Both are clean.
func underAny(dir string, roots []string) bool {
	for _, r := range roots {
		if dir == r || r == "/" || strings.HasPrefix(dir, r+"/") {
			return true
		}
	}
	return false
}
