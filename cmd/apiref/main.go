// Command apiref writes docs/reference/api.md from the CRDs in
// config/crd/bases. `go generate ./...` runs it after controller-gen (the
// api package sorts before cmd), so the reference follows the Go types.
//
//	go run ./cmd/apiref -crds config/crd/bases -out docs/reference/api.md
package main

//go:generate go run . -crds ../../config/crd/bases -out ../../docs/reference/api.md

import (
	"flag"
	"fmt"
	"os"

	"github.com/drover-fleet/drover/internal/apiref"
)

func main() {
	crds := flag.String("crds", "config/crd/bases", "directory of the CustomResourceDefinition YAML files")
	out := flag.String("out", "docs/reference/api.md", "Markdown file to write")
	flag.Parse()
	if err := run(*crds, *out); err != nil {
		fmt.Fprintln(os.Stderr, "apiref:", err)
		os.Exit(1)
	}
}

func run(crdDir, out string) error {
	crds, err := apiref.Load(crdDir)
	if err != nil {
		return err
	}
	md := apiref.Render(crds, apiref.Options{Generator: "cmd/apiref from config/crd/bases (go generate ./...)"})
	if old, err := os.ReadFile(out); err == nil && string(old) == string(md) {
		return nil // unchanged: leave the file's time alone
	}
	if err := os.WriteFile(out, md, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	return nil
}
