package inplace

import (
	"crypto/sha256"
	"encoding/hex"
	"reflect"
	"strings"
	"testing"

	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
)

func sum(s string) string { b := sha256.Sum256([]byte(s)); return hex.EncodeToString(b[:]) }

var tmpl = updatev1.NodeTemplate{AgentVersion: "v2", Files: []updatev1.ConfigFile{{Path: "/etc/app.conf", Content: "a=1"}}}

func TestPoolChangeSet(t *testing.T) {
	atTarget := NodeFacts{AgentVersion: "v2", Files: map[string]string{"/etc/app.conf": sum("a=1")}}
	old := NodeFacts{AgentVersion: "v1", Files: map[string]string{"/etc/app.conf": sum("a=0")}}
	tests := []struct {
		name      string
		nodes     map[string]NodeFacts
		wantNodes []string
		wantPaths []string
	}{
		{"every node at the target: empty change set, the request ends updated", map[string]NodeFacts{"a": atTarget, "b": atTarget}, nil, nil},
		{"some updated, some not: only the rest update", map[string]NodeFacts{"a": atTarget, "b": old, "c": old}, []string{"b", "c"}, []string{"/files/etc/app.conf", "/spec/agentVersion"}},
		{"a file whose digest is unknown counts as changed", map[string]NodeFacts{"a": {AgentVersion: "v2"}}, []string{"a"}, []string{"/files/etc/app.conf"}},
		{"no nodes: nothing to do", nil, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pc := PoolChangeSet(tmpl, tt.nodes)
			var paths []string
			for _, c := range pc.Changes {
				paths = append(paths, c.Path)
			}
			if !reflect.DeepEqual(pc.Nodes, tt.wantNodes) || !reflect.DeepEqual(paths, tt.wantPaths) {
				t.Errorf("PoolChangeSet = nodes %v paths %v, want %v %v", pc.Nodes, paths, tt.wantNodes, tt.wantPaths)
			}
			if pc.Empty() != (len(tt.wantNodes) == 0) {
				t.Errorf("Empty() = %v", pc.Empty())
			}
		})
	}
}

func TestRevisionChangesWithTemplate(t *testing.T) {
	other := tmpl
	other.AgentVersion = "v3"
	if Revision(tmpl) == Revision(other) || Revision(tmpl) != Revision(tmpl) {
		t.Error("Revision must be stable and differ between templates")
	}
}

func TestClaim(t *testing.T) {
	changes := ChangeSet(tmpl, NodeFacts{})
	ver := Answer{UpdaterName: "version", Status: "accept", Responsibilities: []string{PathAgentVersion}, Sequence: 2}
	files := Answer{UpdaterName: "files", Status: "accept", Responsibilities: []string{"/files/etc/app.conf"}, Sequence: 1}
	tests := []struct {
		name    string
		answers []Answer
		want    []string // updater names in order
		wantErr string
	}{
		{"each change claimed: updaters by sequence", []Answer{ver, files}, []string{"files", "version"}, ""},
		{"an unclaimed change fails naming the path", []Answer{ver}, nil, "no updater claims /files/etc/app.conf"},
		{"a rejecting updater claims nothing", []Answer{ver, {UpdaterName: "files", Status: "reject", Responsibilities: []string{"/files/etc/app.conf"}}}, nil, "no updater claims /files/etc/app.conf"},
		{"two updaters claiming one path are refused with both names", []Answer{ver, files, {UpdaterName: "other", Status: "accept", Responsibilities: []string{PathAgentVersion}, Sequence: 3}}, nil, "claimed by updaters version and other"},
		{"two updaters with one sequence are refused", []Answer{ver, {UpdaterName: "files", Status: "accept", Responsibilities: []string{"/files/etc/app.conf"}, Sequence: 2}}, nil, "share sequence 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Claim(changes, tt.answers)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Claim() error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, u := range got {
				names = append(names, u.Name)
			}
			if !reflect.DeepEqual(names, tt.want) {
				t.Errorf("Claim() = %v, want %v", names, tt.want)
			}
		})
	}
}

func TestFindOverlaps(t *testing.T) {
	got := FindOverlaps(map[string][]string{"edge": {"n1", "n2"}, "arm": {"n2", "n3"}, "lab": {"n4"}})
	want := []Overlap{{PoolA: "arm", PoolB: "edge", Node: "n2"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("FindOverlaps = %v, want %v", got, want)
	}
	if msg := got[0].Error(); !strings.Contains(msg, "arm and edge") {
		t.Errorf("message %q must name both pools", msg)
	}
}

func TestCheckUpdatersNamesBoth(t *testing.T) {
	err := CheckUpdaters([]updatev1.Updater{{Name: "os", Sequence: 1}, {Name: "ntp", Sequence: 1}})
	if err == nil || !strings.Contains(err.Error(), "os and ntp share sequence 1") {
		t.Errorf("CheckUpdaters() = %v", err)
	}
}
