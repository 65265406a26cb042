package apiref

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.md.golden from the generator's output (read the diff first)")

// TestRenderGolden renders the small test CRD and compares the page with its
// golden file.
func TestRenderGolden(t *testing.T) {
	crds, err := Load("testdata")
	if err != nil {
		t.Fatal(err)
	}
	got := Render(crds, Options{Generator: "apiref test"})
	golden := filepath.Join("testdata", "widgets.md.golden")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./internal/apiref -update to create it)", err)
	}
	if string(got) != string(want) {
		t.Errorf("Render(testdata) differs from %s (go test ./internal/apiref -update rewrites it); got:\n%s", golden, got)
	}
	if again := Render(crds, Options{Generator: "apiref test"}); string(again) != string(got) {
		t.Errorf("two renders of the same CRDs differ")
	}
}

// TestReferenceUpToDate checks docs/reference/api.md against the CRDs it is
// generated from, so that a plain go test says what CI's stale-file check
// would.
func TestReferenceUpToDate(t *testing.T) {
	crds, err := Load(filepath.Join("..", "..", "config", "crd", "bases"))
	if err != nil {
		t.Fatal(err)
	}
	got := Render(crds, Options{Generator: "cmd/apiref from config/crd/bases (go generate ./...)"})
	want, err := os.ReadFile(filepath.Join("..", "..", "docs", "reference", "api.md"))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("docs/reference/api.md is stale: run go generate ./cmd/apiref (or go generate ./...) and commit it")
	}
	if len(crds) < 10 {
		t.Errorf("read %d CRDs from config/crd/bases, want every Drover kind", len(crds))
	}
}

func TestLoadRefusesOtherKinds(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "x.yaml"), []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err == nil {
		t.Errorf("Load(a ConfigMap) = nil error, want a refusal")
	}
	if _, err := Load(t.TempDir()); err == nil {
		t.Errorf("Load(empty dir) = nil error, want a refusal")
	}
}
