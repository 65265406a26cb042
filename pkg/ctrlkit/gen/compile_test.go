package gen

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// TestGoldenOutputsCompile builds (and vets) every golden case in one
// throwaway module that depends on this repository, so that a generator
// change producing code that does not compile fails here, not in a
// controller. It is the slowest test of the package; -short skips it.
func TestGoldenOutputsCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds generated code with the go command")
	}
	root := repoRoot(t)
	dir := t.TempDir()

	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	// Keep the repository's requirements and replaces (a dependent module
	// would not inherit the replaces), as a module that imports the repo.
	gomod = regexp.MustCompile(`(?m)^module .*$`).ReplaceAll(gomod, []byte("module ctrlkitgolden"))
	gomod = append(gomod, []byte("\nrequire github.com/drover-fleet/drover v0.0.0\n\nreplace github.com/drover-fleet/drover => "+root+"\n")...)
	writeFile(t, filepath.Join(dir, "go.mod"), gomod)
	gosum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "go.sum"), gosum)

	for _, name := range cases(t) {
		golden, err := os.ReadFile(filepath.Join("testdata", name+".go.golden"))
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, name, "zz_generated.ctrlkit.go"), golden)
	}

	cmd := exec.Command("go", "vet", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("go vet ./... on the generated golden cases: %v\n%s", err, out.Bytes())
	}
}

// repoRoot finds the repository's go.mod above the test's directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(data, []byte("module github.com/drover-fleet/drover\n")) {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("repository root (go.mod of github.com/drover-fleet/drover) not found")
		}
		dir = parent
	}
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}
