// Command gen writes the parts of charts/drover that are copies of config/:
// the CRDs (crds/, byte for byte) and the RBAC and admission policy
// manifests (templates/rbac-*.yaml, templates/admission-*.yaml), with
// Drover's namespace replaced by the release's and the chart's labels
// added. Run by `go generate ./charts` from the charts directory.
package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

func main() {
	if err := run(".."); err != nil {
		fmt.Fprintf(os.Stderr, "charts/gen: %v\n", err)
		os.Exit(1)
	}
}

// run regenerates the chart's copies under root (the repository).
func run(root string) error {
	chart := filepath.Join(root, "charts", "drover")
	if err := syncDir(filepath.Join(root, "config", "crd", "bases"), filepath.Join(chart, "crds"), "", nil); err != nil {
		return fmt.Errorf("crds: %w", err)
	}
	tmpl := filepath.Join(chart, "templates")
	// 00_namespace.yaml is left out: Helm installs into an existing
	// namespace (helm install -n NS --create-namespace).
	skip := map[string]bool{"00_namespace.yaml": true}
	if err := syncDir(filepath.Join(root, "config", "rbac"), tmpl, "rbac-", skip); err != nil {
		return fmt.Errorf("rbac: %w", err)
	}
	if err := syncDir(filepath.Join(root, "config", "admission"), tmpl, "admission-", nil); err != nil {
		return fmt.Errorf("admission: %w", err)
	}
	return nil
}

// syncDir writes every *.yaml of src into dst as prefix+name, templated
// when prefix is set (copied as is otherwise), and removes the files of
// dst with that prefix that src no longer has.
func syncDir(src, dst, prefix string, skip map[string]bool) error {
	names, err := filepath.Glob(filepath.Join(src, "*.yaml"))
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return fmt.Errorf("no *.yaml in %s", src)
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	want := map[string]bool{}
	for _, n := range names {
		base := filepath.Base(n)
		if skip[base] {
			continue
		}
		b, err := os.ReadFile(n)
		if err != nil {
			return err
		}
		if prefix != "" {
			if b, err = Templatize(b, filepath.ToSlash(filepath.Join(filepath.Base(filepath.Dir(n)), base))); err != nil {
				return fmt.Errorf("%s: %w", n, err)
			}
		}
		out := prefix + base
		want[out] = true
		if old, err := os.ReadFile(filepath.Join(dst, out)); err == nil && bytes.Equal(old, b) {
			continue // leave the file's time alone
		}
		if err := os.WriteFile(filepath.Join(dst, out), b, 0o644); err != nil {
			return err
		}
	}
	existing, err := filepath.Glob(filepath.Join(dst, prefix+"*.yaml"))
	if err != nil {
		return err
	}
	for _, e := range existing {
		if !want[filepath.Base(e)] {
			if err := os.Remove(e); err != nil {
				return err
			}
		}
	}
	return nil
}

// namespaceUses are the ways config/ names Drover's namespace, and what
// they become in the chart. Any other use fails the generator, so that a
// new one is looked at rather than left pointing at drover-system.
var namespaceUses = []struct{ from, to string }{
	{"namespace: drover-system", "namespace: {{ .Release.Namespace }}"},
	{"resourceNames: [drover-system]", "resourceNames: [{{ .Release.Namespace | quote }}]"},
	{"system:serviceaccount:drover-system:", "system:serviceaccount:{{ .Release.Namespace }}:"},
}

// Templatize turns one config/ manifest into a chart template: the release's
// namespace for drover-system, the chart's labels on every object (merged
// with the object's own; app.kubernetes.io/part-of is the chart's too).
// Comments are kept. It reads the files' own layout (top-level metadata:,
// two-space indents), which is what config/ uses.
func Templatize(src []byte, from string) ([]byte, error) {
	if bytes.Contains(src, []byte("{{")) {
		return nil, errors.New("contains '{{', which Helm would read as a template")
	}
	var out strings.Builder
	fmt.Fprintf(&out, "{{/* Generated from config/%s by `go generate ./charts`: edit that file, not this one. */ -}}\n", from)
	lines := strings.Split(strings.TrimRight(string(src), "\n"), "\n")
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			for _, u := range namespaceUses {
				line = strings.ReplaceAll(line, u.from, u.to)
			}
			if strings.Contains(line, "drover-system") {
				return nil, fmt.Errorf("line %d: drover-system in an unknown place (teach charts/gen what it becomes): %s", i+1, lines[i])
			}
		}
		if line != "metadata:" {
			out.WriteString(line + "\n")
			continue
		}
		// The metadata block: its lines are indented.
		var block []string
		for i+1 < len(lines) && strings.HasPrefix(lines[i+1], " ") {
			i++
			l := lines[i]
			for _, u := range namespaceUses {
				l = strings.ReplaceAll(l, u.from, u.to)
			}
			block = append(block, l)
		}
		out.WriteString("metadata:\n")
		hasLabels := false
		for _, l := range block {
			if l == "  labels:" {
				hasLabels = true
			}
		}
		if !hasLabels {
			out.WriteString("  labels:\n    {{- include \"drover.labels\" . | nindent 4 }}\n")
		}
		for _, l := range block {
			if strings.TrimSpace(l) == "app.kubernetes.io/part-of: drover" {
				continue // the chart's labels have it
			}
			out.WriteString(l + "\n")
			if l == "  labels:" {
				out.WriteString("    {{- include \"drover.labels\" . | nindent 4 }}\n")
			}
		}
	}
	return []byte(out.String()), nil
}
