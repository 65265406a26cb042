package inplace

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
)

// Paths of the template's fields in a change set.
const (
	PathAgentVersion = "/spec/agentVersion"
	PathOSImage      = "/spec/osImage"
	// PathFilePrefix + the file's path, e.g. /files/etc/app.conf.
	PathFilePrefix = "/files"
)

// Change is one field a pool's template changes on a node.
type Change struct {
	Path           string
	SelectResource updatev1.SelectResource
	Value          string
}

// NodeFacts is what is known of a node's current state. A file whose
// digest is unknown ("" in Files, or absent) counts as changed.
type NodeFacts struct {
	AgentVersion string
	OSImage      string
	// Files maps a path to the sha256 (hex) of its content on the node.
	Files map[string]string
}

// Revision names a template: nodes carry the revision they are at
// (update.drover.io/pool-revision).
func Revision(t updatev1.NodeTemplate) string {
	b, err := json.Marshal(t)
	if err != nil {
		// A NodeTemplate is strings only; Marshal cannot fail on it.
		panic(fmt.Sprintf("marshal node template: %v", err))
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:16]
}

// ChangeSet is what t changes on a node with facts, sorted by path. Empty
// template fields are not managed and change nothing.
func ChangeSet(t updatev1.NodeTemplate, facts NodeFacts) []Change {
	var out []Change
	if t.AgentVersion != "" && t.AgentVersion != facts.AgentVersion {
		out = append(out, Change{PathAgentVersion, updatev1.SelectNodeSpec, t.AgentVersion})
	}
	if t.OSImage != "" && t.OSImage != facts.OSImage {
		out = append(out, Change{PathOSImage, updatev1.SelectNodeImage, t.OSImage})
	}
	for _, f := range t.Files {
		sum := sha256.Sum256([]byte(f.Content))
		if have := facts.Files[f.Path]; have == "" || have != hex.EncodeToString(sum[:]) {
			out = append(out, Change{PathFilePrefix + f.Path, updatev1.SelectConfiguration, f.Content})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// PoolChange is the change set of a pool: the union over its nodes that
// need anything, and which nodes those are.
type PoolChange struct {
	Changes []Change
	// Nodes need an update, sorted. Nodes already at the target are left out.
	Nodes []string
}

// Empty reports whether no node needs anything: the update request ends at
// once, updated.
func (p PoolChange) Empty() bool { return len(p.Nodes) == 0 }

// PoolChangeSet computes the change set of a pool from its nodes' facts
// (the seed's two hard states: every node at the target gives an empty
// set; some updated and some not gives the rest only).
func PoolChangeSet(t updatev1.NodeTemplate, nodes map[string]NodeFacts) PoolChange {
	var pc PoolChange
	seen := map[string]bool{}
	names := make([]string, 0, len(nodes))
	for n := range nodes {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		cs := ChangeSet(t, nodes[n])
		if len(cs) == 0 {
			continue
		}
		pc.Nodes = append(pc.Nodes, n)
		for _, c := range cs {
			if !seen[c.Path] {
				seen[c.Path] = true
				pc.Changes = append(pc.Changes, c)
			}
		}
	}
	sort.Slice(pc.Changes, func(i, j int) bool { return pc.Changes[i].Path < pc.Changes[j].Path })
	return pc
}

// Answer is an updater's answer to an ExternalUpdateRequest.
type Answer struct {
	UpdaterName string
	// Status is accept, reject or error.
	Status  string
	Message string
	// Responsibilities are the paths the updater claims.
	Responsibilities []string
	Sequence         int32
	TemplateRef      updatev1.ObjectRef
}

// ClaimError is why Claim refused: a change no updater claims, or one
// claimed twice (Twice).
type ClaimError struct {
	Twice bool
	msg   string
}

func (e *ClaimError) Error() string { return e.msg }

// Claim decides which accepting updater owns each change. A change no
// updater claims fails the request naming the paths (Drover has no
// "replace the machine" rollout to fall back to); a path claimed twice is
// refused naming both updaters. It returns the plan's updaters, by
// sequence.
func Claim(changes []Change, answers []Answer) ([]updatev1.Updater, error) {
	owner := map[string]string{}
	byName := map[string]*updatev1.Updater{}
	var order []string
	want := map[string]Change{}
	for _, c := range changes {
		want[c.Path] = c
	}
	for _, a := range answers {
		if a.Status != "accept" {
			continue
		}
		for _, p := range a.Responsibilities {
			c, ok := want[p]
			if !ok {
				continue // claims what this request does not change
			}
			if other, dup := owner[p]; dup && other != a.UpdaterName {
				return nil, &ClaimError{Twice: true, msg: fmt.Sprintf("path %s is claimed by updaters %s and %s: one change, one owner", p, other, a.UpdaterName)}
			}
			owner[p] = a.UpdaterName
			u := byName[a.UpdaterName]
			if u == nil {
				u = &updatev1.Updater{Name: a.UpdaterName, Sequence: a.Sequence, UpdaterUpdateTemplateRef: a.TemplateRef}
				byName[a.UpdaterName] = u
				order = append(order, a.UpdaterName)
			}
			u.Responsibilities = append(u.Responsibilities, updatev1.Responsibility{Path: c.Path, SelectResource: c.SelectResource, Value: c.Value})
		}
	}
	var unclaimed []string
	for _, c := range changes {
		if _, ok := owner[c.Path]; !ok {
			unclaimed = append(unclaimed, c.Path)
		}
	}
	if len(unclaimed) > 0 {
		return nil, &ClaimError{msg: fmt.Sprintf("no updater claims %s: nothing is updated in place, and fleets have no replace-the-machine rollout to fall back to", strings.Join(unclaimed, ", "))}
	}
	out := make([]updatev1.Updater, 0, len(order))
	for _, n := range order {
		out = append(out, *byName[n])
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Sequence < out[j].Sequence })
	for i := 1; i < len(out); i++ {
		if out[i].Sequence == out[i-1].Sequence {
			return nil, fmt.Errorf("updaters %s and %s share sequence %d: updaters on a node run one after another", out[i-1].Name, out[i].Name, out[i].Sequence)
		}
	}
	return out, nil
}

// CheckUpdaters refuses updaters that share a sequence number, naming both
// (the CRD refuses them too, without names).
func CheckUpdaters(ups []updatev1.Updater) error {
	seen := map[int32]string{}
	for _, u := range ups {
		if other, ok := seen[u.Sequence]; ok {
			return fmt.Errorf("updaters %s and %s share sequence %d: updaters on a node run one after another", other, u.Name, u.Sequence)
		}
		seen[u.Sequence] = u.Name
	}
	return nil
}
