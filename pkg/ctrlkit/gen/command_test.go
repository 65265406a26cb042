package gen

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCommandGenCheckVerify(t *testing.T) {
	dir := t.TempDir()
	src, err := os.ReadFile(filepath.Join("testdata", "lists.ctrlkit"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "lists.ctrlkit"), src)
	writeFile(t, filepath.Join(dir, "doc.go"), []byte("package lists\n\n//go:generate go run github.com/drover-fleet/drover/cmd/ctrlkit gen -o zz_generated.ctrlkit.go lists.ctrlkit\n"))
	out := filepath.Join(dir, "zz_generated.ctrlkit.go")
	cmd := Command{Getenv: func(string) string { return "" }}

	if err := cmd.Run([]string{"check", "-o", out, filepath.Join(dir, "lists.ctrlkit")}); !errors.Is(err, ErrStale) {
		t.Fatalf("check before gen = %v, want ErrStale", err)
	}
	if err := cmd.Run([]string{"gen", "-o", out, filepath.Join(dir, "lists.ctrlkit")}); err != nil {
		t.Fatalf("gen = %v", err)
	}
	got, _ := os.ReadFile(out)
	golden, _ := os.ReadFile(filepath.Join("testdata", "lists.go.golden"))
	if !bytes.Equal(got, golden) {
		t.Errorf("gen wrote package %q output, want the golden lists case (package from doc.go)", firstLine(got, "package"))
	}
	if err := cmd.Run([]string{"check", "-o", out, filepath.Join(dir, "lists.ctrlkit")}); err != nil {
		t.Errorf("check after gen = %v, want nil", err)
	}
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	if err := cmd.Run([]string{"verify", dir}); err != nil {
		t.Errorf("verify = %v, want nil", err)
	}
	if !strings.Contains(stdout.String(), "1 generated file(s) checked, 0 stale") {
		t.Errorf("verify printed %q, want one file checked", stdout.String())
	}
	writeFile(t, filepath.Join(dir, "lists.ctrlkit"), append(src, []byte("decl Extra for Pod {\n}\n")...))
	if err := cmd.Run([]string{"verify", dir}); !errors.Is(err, ErrStale) {
		t.Errorf("verify after editing the DSL = %v, want ErrStale", err)
	}
}

func TestCommandGenLeavesNothingOnError(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "bad.ctrlkit"), []byte("bind v1\n"))
	out := filepath.Join(dir, "out.go")
	err := Command{}.Run([]string{"gen", "-package", "x", "-o", out, filepath.Join(dir, "bad.ctrlkit")})
	if err == nil || !strings.HasSuffix(err.Error(), "bad.ctrlkit:1:8: expected a Go package path after the group/version, found end of line") {
		t.Errorf("gen of a bad document = %v, want a file:line:col error", err)
	}
	if _, statErr := os.Stat(out); !errors.Is(statErr, os.ErrNotExist) {
		t.Errorf("gen of a bad document wrote %s", out)
	}
}

func firstLine(b []byte, prefix string) string {
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}
