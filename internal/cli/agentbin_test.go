package cli

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// An agent that replaced its copy (a NodeUpgradeJob) keeps it at the next
// `drover up`; a changed source reaches every copy again.
func TestAgentBinaryCopy(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "drover-agent")
	if err := os.WriteFile(src, []byte("v1"), 0o755); err != nil {
		t.Fatal(err)
	}
	copies := map[string]string{}
	for _, n := range []string{"node-1", "node-2"} {
		p, err := agentBinaryCopy(src, filepath.Join(dir, "agents", n, "bin"))
		if err != nil {
			t.Fatal(err)
		}
		copies[n] = p
	}
	if copies["node-1"] == copies["node-2"] {
		t.Fatalf("both agents run %s", copies["node-1"])
	}
	read := func(p string) string {
		t.Helper()
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for n, p := range copies {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := read(p); got != "v1" || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s's copy holds %q, mode %v; want v1, 0755", n, got, fi.Mode().Perm())
		}
	}

	// node-1 upgrades itself in place.
	if err := os.WriteFile(copies["node-1"], []byte("v2-upgraded"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := agentBinaryCopy(src, filepath.Dir(copies["node-1"])); err != nil {
		t.Fatal(err)
	}
	if got := read(copies["node-1"]); got != "v2-upgraded" {
		t.Errorf("after a restart with the same source, node-1 runs %q; want its upgrade kept", got)
	}
	if got := read(copies["node-2"]); got != "v1" {
		t.Errorf("node-1's upgrade changed node-2's binary to %q", got)
	}

	// The user rebuilds drover-agent: every node gets it.
	if err := os.WriteFile(src, []byte("v3"), 0o755); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(src, later, later); err != nil {
		t.Fatal(err)
	}
	for n, p := range copies {
		if _, err := agentBinaryCopy(src, filepath.Dir(p)); err != nil {
			t.Fatal(err)
		}
		if got := read(p); got != "v3" {
			t.Errorf("after the source changed, %s runs %q; want v3", n, got)
		}
	}
}
