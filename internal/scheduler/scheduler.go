package scheduler

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/tenancy"
)

// Node is what the scheduler knows of a FleetNode.
type Node struct {
	Name          string
	Labels        map[string]string
	Phase         fleetv1.FleetNodePhase
	Unschedulable bool
	Capacity      corev1.ResourceList
	// Disconnected: Online, but its agent's stream to its hub ended.
	Disconnected bool
}

// NodeFrom reads a FleetNode.
func NodeFrom(n *fleetv1.FleetNode) Node {
	ready := meta.FindStatusCondition(n.Status.Conditions, fleetv1.ReadyCondition)
	return Node{Name: n.Name, Labels: n.Labels, Phase: n.Status.Phase, Unschedulable: n.Spec.Unschedulable, Capacity: n.Status.Capacity,
		Disconnected: ready != nil && ready.Status == metav1.ConditionUnknown &&
			(ready.Reason == fleetv1.ReasonDisconnected || ready.Reason == fleetv1.ReasonNotResponding)}
}

// Task is what the scheduler knows of a Task.
type Task struct {
	// Key identifies the task (namespace/name).
	Key string
	// Group identifies its TaskGroup (namespace/group); "" if it has none.
	// Spread counts the tasks of one group.
	Group     string
	Priority  int32
	Created   time.Time
	Resources corev1.ResourceList
	// Selector of eligible nodes; nil matches every node.
	Selector labels.Selector
	// NodeName pins the task to one node.
	NodeName string
	Spread   *batchv1.SpreadConstraint
	// MaxPerNode bounds the group's tasks holding one node; 0: no bound.
	// It applies only to a task of a group.
	MaxPerNode int32
	// Preferred weighs the nodes that fit: the highest sum wins.
	Preferred []Preference
	// Work is what the task asks of the node's policy: its user, group
	// and working dir.
	Work tenancy.Work
	// Access is what the task's namespace is granted
	// (tenancy.Policy.For). TaskFrom leaves it granting nothing: a task
	// whose caller does not set it fits nowhere (fail closed).
	Access tenancy.Access
	// Unit are the other tasks that will run on the same node (an
	// instance of a multi-task group): a node is eligible only if each of
	// their nodeSelectors, nodeNames and NodeGrants allows it too. What
	// they hold is in Resources already (see Reservation).
	Unit []Task
}

// Preference is a soft affinity term: Weight for the nodes Selector matches.
type Preference struct {
	Weight   int32
	Selector labels.Selector
}

// ErrInvalidResources is wrapped by TaskFrom's error when the task asks
// for a resource by a name that is not valid or a negative quantity.
var ErrInvalidResources = errors.New("invalid resources")

// TaskFrom reads a Task. The error is an invalid selector, or invalid
// resources (ErrInvalidResources); such a task cannot be placed.
func TaskFrom(t *batchv1.Task) (Task, error) {
	out := Task{
		Key:       t.Namespace + "/" + t.Name,
		Priority:  t.Spec.Priority,
		Created:   t.CreationTimestamp.Time,
		Resources: t.Spec.Resources,
		NodeName:  t.Spec.NodeName,
		Spread:    t.Spec.Spread,
		Work:      WorkOf(t),
		Access:    tenancy.Access{Namespace: t.Namespace},
	}
	if g := t.Labels[batchv1.LabelTaskGroup]; g != "" {
		out.Group = t.Namespace + "/" + g
	}
	if t.Spec.NodeSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(t.Spec.NodeSelector)
		if err != nil {
			return out, fmt.Errorf("invalid nodeSelector: %w", err)
		}
		out.Selector = s
	}
	if m := t.Spec.MaxPerNode; m != nil {
		out.MaxPerNode = max(*m, 1)
	}
	// The API refuses these (config/admission); one stored before it did,
	// or in a cluster without the policy, must not make room on a node by
	// holding less than nothing, nor wait forever for "insufficient
	// memroy". In name order, so that the message is stable.
	names := make([]string, 0, len(t.Spec.Resources))
	for name := range t.Spec.Resources {
		names = append(names, string(name))
	}
	sort.Strings(names)
	for _, name := range names {
		if err := batchv1.CheckResourceName(corev1.ResourceName(name)); err != nil {
			return out, fmt.Errorf("%w: spec.resources[%s]: %w", ErrInvalidResources, name, err)
		}
		if q := t.Spec.Resources[corev1.ResourceName(name)]; q.Sign() < 0 {
			return out, fmt.Errorf("%w: spec.resources[%s] is negative (%s)", ErrInvalidResources, name, q.String())
		}
	}
	for i, p := range t.Spec.PreferredNodes {
		s, err := metav1.LabelSelectorAsSelector(&p.Selector)
		if err != nil {
			return out, fmt.Errorf("invalid preferredNodes[%d].selector: %w", i, err)
		}
		out.Preferred = append(out.Preferred, Preference{Weight: p.Weight, Selector: s})
	}
	return out, nil
}

// WorkOf is what t asks of a NodeGrant.
func WorkOf(t *batchv1.Task) tenancy.Work {
	w := tenancy.Work{WorkingDir: t.Spec.WorkingDir}
	if t.Spec.Driver == batchv1.DriverContainerd {
		w.WorkingDir = "" // a dir inside the container, not the node's
	}
	if sc := t.Spec.SecurityContext; sc != nil {
		w.RunAsUser, w.RunAsGroup = sc.RunAsUser, sc.RunAsGroup
	}
	return w
}

// Sort orders tasks for placement: higher priority first, then older,
// then by key so that the order is total.
func Sort(tasks []Task) {
	sort.SliceStable(tasks, func(i, j int) bool {
		a, b := tasks[i], tasks[j]
		if a.Priority != b.Priority {
			return a.Priority > b.Priority
		}
		if !a.Created.Equal(b.Created) {
			return a.Created.Before(b.Created)
		}
		return a.Key < b.Key
	})
}

// Reasons a node is not eligible, as counted in a Result's message.
const (
	ReasonNodeName = "did not match nodeName"
	// ReasonNotGranted: no NodeGrant of the task's namespace both selects
	// the node and allows the task's user, group and working dir.
	ReasonNotGranted    = "not granted to the namespace"
	ReasonUnschedulable = "unschedulable"
	// ReasonDisconnected: Online, but its agent's stream ended (it may be
	// gone; Offline after the offline timeout unless it reconnects).
	ReasonDisconnected = "Disconnected"
	ReasonSelector     = "did not match nodeSelector"
	ReasonSpread       = "did not satisfy spread constraint"
	// ReasonMaxPerNode: the node holds maxPerNode of the task's group.
	ReasonMaxPerNode = "already hold maxPerNode of the group's tasks"
	// ReasonInsufficient is followed by the resource's name.
	ReasonInsufficient = "insufficient "
	// ReasonMissingLabel is followed by the spread's topology key.
	ReasonMissingLabel = "missing label "
)

// Result is Place's decision.
type Result struct {
	// Node is where the task goes; "" when it fits nowhere.
	Node string
	// Reasons counts, by reason, the nodes that were not eligible (a node
	// short of two resources counts under both).
	Reasons map[string]int
	// Message says why the task fits nowhere, in kube-scheduler's words.
	Message string
	// Denied is set when the tenancy policy alone keeps the task off
	// every node, whatever their state: the node its nodeName names is
	// not granted (Message is then Denied's text, which names the
	// grants), or its namespace may run this work on no node at all
	// (Message ends with Denied's text).
	Denied error
	// InsufficientNodes is set when the task fits nowhere and some node
	// was ruled out for holding maxPerNode of its group's tasks: more
	// nodes are needed (or fewer tasks), not more room on one.
	InsufficientNodes bool
}

type node struct {
	Node
	used  map[corev1.ResourceName]int64 // milli-units held by tasks
	tasks int
}

// Cluster is the nodes and what their tasks hold. It is not safe for
// concurrent use.
type Cluster struct {
	nodes  []*node
	byName map[string]*node
	// groups counts, per task group, its tasks holding each node.
	groups map[string]map[string]int
}

// New returns a cluster of nodes with nothing held.
func New(nodes []Node) *Cluster {
	c := &Cluster{byName: make(map[string]*node, len(nodes)), groups: map[string]map[string]int{}}
	for _, n := range nodes {
		nn := &node{Node: n, used: map[corev1.ResourceName]int64{}}
		c.nodes = append(c.nodes, nn)
		c.byName[n.Name] = nn
	}
	sort.Slice(c.nodes, func(i, j int) bool { return c.nodes[i].Name < c.nodes[j].Name })
	return c
}

// Hold counts t as holding nodeName: its resources and its place in its
// group's spread. A node the cluster does not know is ignored.
func (c *Cluster) Hold(t Task, nodeName string) {
	n := c.byName[nodeName]
	if n == nil {
		return
	}
	for name, q := range t.Resources {
		n.used[name] += q.MilliValue()
	}
	n.tasks++
	if t.Group != "" {
		g := c.groups[t.Group]
		if g == nil {
			g = map[string]int{}
			c.groups[t.Group] = g
		}
		g[nodeName]++
	}
}

// Place chooses a node for t and holds it there, or says why none fits.
func (c *Cluster) Place(t Task) Result {
	// Work that no grant of the namespace allows (by user, group or dir)
	// is allowed on no node: one check instead of one per node.
	nowhere := t.Access.Check(t.Work)
	reasons := map[string]int{}
	var candidates []*node
	for _, n := range c.nodes {
		if r := n.staticReason(t, nowhere == nil); r != "" {
			reasons[r]++
			continue
		}
		candidates = append(candidates, n)
	}
	// Spread is measured among the nodes the task may run on at all
	// (selector, phase), as kube-scheduler measures it among the nodes
	// matching the pod's affinity; capacity does not shrink the domains.
	var fit []*node
	skewOK := c.spreadFilter(t, candidates, reasons)
	for _, n := range candidates {
		short := n.insufficient(t)
		for _, r := range short {
			reasons[ReasonInsufficient+string(r)]++
		}
		if len(short) > 0 {
			continue
		}
		if t.MaxPerNode > 0 && t.Group != "" && c.groups[t.Group][n.Name] >= int(t.MaxPerNode) {
			reasons[ReasonMaxPerNode]++
			continue
		}
		if r := skewOK(n); r != "" {
			reasons[r]++
			continue
		}
		fit = append(fit, n)
	}
	if len(fit) == 0 {
		r := Result{Reasons: reasons, Message: message(len(c.nodes), reasons)}
		if reasons[ReasonMaxPerNode] > 0 {
			r.InsufficientNodes = true
			r.Message = fmt.Sprintf("insufficient nodes for maxPerNode=%d: %s", t.MaxPerNode, r.Message)
		}
		switch pinned := c.byName[t.NodeName]; {
		case pinned != nil && reasons[ReasonNotGranted] > 0:
			r.Denied = t.Access.CheckNode(t.Work, pinned.Name, pinned.Labels)
			r.Message = r.Denied.Error()
		case nowhere != nil:
			r.Denied = nowhere
			r.Message += " " + nowhere.Error()
		}
		return r
	}
	best := fit[0]
	bestPref, bestLoad := best.preference(t), best.load(t)
	for _, n := range fit[1:] {
		p, l := n.preference(t), n.load(t)
		if p > bestPref || p == bestPref && (l < bestLoad || l == bestLoad && n.tasks < best.tasks) {
			best, bestPref, bestLoad = n, p, l
		}
	}
	c.Hold(t, best.Name)
	return Result{Node: best.Name}
}

// staticReason is why n can never take t, whatever it holds; "" if it can.
// anywhere: some grant of t's namespace allows t's work on some node.
// The policy comes before the node's state, so that a namespace learns
// nothing of the nodes it is not granted.
func (n *node) staticReason(t Task, anywhere bool) string {
	switch {
	case t.NodeName != "" && t.NodeName != n.Name:
		return ReasonNodeName
	case !anywhere || !t.Access.Allows(t.Work, n.Labels):
		return ReasonNotGranted
	case n.Phase != fleetv1.FleetNodeOnline:
		if n.Phase == "" {
			return "Unknown"
		}
		return string(n.Phase)
	case n.Unschedulable:
		return ReasonUnschedulable
	case n.Disconnected:
		return ReasonDisconnected
	case t.Selector != nil && !t.Selector.Matches(labels.Set(n.Labels)):
		return ReasonSelector
	}
	for _, u := range t.Unit {
		switch {
		case u.NodeName != "" && u.NodeName != n.Name:
			return ReasonNodeName
		case u.Access.Check(u.Work) != nil || !u.Access.Allows(u.Work, n.Labels):
			return ReasonNotGranted
		case u.Selector != nil && !u.Selector.Matches(labels.Set(n.Labels)):
			return ReasonSelector
		}
	}
	return ""
}

// insufficient lists the resources t asks for that n does not have free,
// in name order.
func (n *node) insufficient(t Task) []corev1.ResourceName {
	var out []corev1.ResourceName
	for name, q := range t.Resources {
		want := q.MilliValue()
		if want <= 0 {
			continue
		}
		c, ok := n.Capacity[name]
		if !ok || c.MilliValue()-n.used[name] < want {
			out = append(out, name)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// preference is the weight of t's preferred terms that n matches.
func (n *node) preference(t Task) int32 {
	var w int32
	for _, p := range t.Preferred {
		if p.Selector.Matches(labels.Set(n.Labels)) {
			w += p.Weight
		}
	}
	return w
}

// load is the mean fraction of n's reported resources in use once t is
// placed there: the balance score, lower is better.
func (n *node) load(t Task) float64 {
	var sum float64
	var k int
	for name, c := range n.Capacity {
		cv := c.MilliValue()
		if cv <= 0 {
			continue
		}
		used := n.used[name]
		if q, ok := t.Resources[name]; ok {
			used += q.MilliValue()
		}
		sum += float64(used) / float64(cv)
		k++
	}
	if k == 0 {
		return 0
	}
	return sum / float64(k)
}

// spreadFilter returns the spread check of t over candidates: "" if a node
// keeps the group within maxSkew, else the reason. Nodes without the
// topology key are counted as missing it.
func (c *Cluster) spreadFilter(t Task, candidates []*node, reasons map[string]int) func(*node) string {
	if t.Spread == nil || t.Group == "" {
		return func(*node) string { return "" }
	}
	key := t.Spread.TopologyKey
	domain := func(n *node) (string, bool) {
		if key == "" {
			return n.Name, true
		}
		v, ok := n.Labels[key]
		return v, ok
	}
	held := c.groups[t.Group]
	counts := map[string]int{}
	for _, n := range candidates {
		if d, ok := domain(n); ok {
			counts[d] += 0
		}
	}
	for name, k := range held {
		if n := c.byName[name]; n != nil {
			if d, ok := domain(n); ok {
				if _, eligible := counts[d]; eligible {
					counts[d] += k
				}
			}
		}
	}
	least := -1
	for _, k := range counts {
		if least < 0 || k < least {
			least = k
		}
	}
	skew := int(max(t.Spread.MaxSkew, 1))
	return func(n *node) string {
		d, ok := domain(n)
		if !ok {
			return ReasonMissingLabel + key
		}
		if counts[d]+1-least > skew {
			return ReasonSpread
		}
		return ""
	}
}

// message is kube-scheduler's summary: "0/5 nodes are available: 2 Offline,
// 1 insufficient cpu." Reasons by count, most first, then by name.
func message(total int, reasons map[string]int) string {
	if total == 0 {
		return "0/0 nodes are available: no FleetNodes."
	}
	type rc struct {
		r string
		n int
	}
	var list []rc
	for r, n := range reasons {
		list = append(list, rc{r, n})
	}
	sort.Slice(list, func(i, j int) bool {
		if list[i].n != list[j].n {
			return list[i].n > list[j].n
		}
		return list[i].r < list[j].r
	})
	parts := make([]string, len(list))
	for i, x := range list {
		parts[i] = fmt.Sprintf("%d %s", x.n, x.r)
	}
	return fmt.Sprintf("0/%d nodes are available: %s.", total, strings.Join(parts, ", "))
}
