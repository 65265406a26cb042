package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestControlPlaneOptionsValidate(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a.yaml")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		opts controlPlaneOptions
		want string
	}{
		{name: "data dir only", opts: controlPlaneOptions{dataDir: dir}},
		{name: "with a CRD dir", opts: controlPlaneOptions{dataDir: dir, crdDir: dir}},
		{name: "no data dir", opts: controlPlaneOptions{}, want: "--data-dir is required"},
		{name: "port out of range", opts: controlPlaneOptions{dataDir: dir, port: 65536}, want: "--port 65536"},
		{name: "missing CRD dir", opts: controlPlaneOptions{dataDir: dir, crdDir: filepath.Join(dir, "nope")}, want: "--crd-dir"},
		{name: "CRD dir is a file", opts: controlPlaneOptions{dataDir: dir, crdDir: file}, want: "not a directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.opts.Validate()
			if tt.want == "" {
				if err != nil {
					t.Errorf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestReadManifestsTakesYAMLFilesInNameOrder(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{"b.yaml": "B", "a.yaml": "A", "notes.txt": "skip", "c.yml": "skip"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := readManifests(dir)
	if err != nil {
		t.Fatalf("readManifests() = %v", err)
	}
	var bodies []string
	for _, b := range got {
		bodies = append(bodies, string(b))
	}
	if strings.Join(bodies, ",") != "A,B" {
		t.Errorf("readManifests() = %v, want [A B]", bodies)
	}
	if got, err := readManifests(""); err != nil || got != nil {
		t.Errorf(`readManifests("") = %v, %v; want nothing`, got, err)
	}
}

func TestControlPlaneCommandIsHidden(t *testing.T) {
	cmd := newControlPlaneCommand()
	if !cmd.Hidden {
		t.Error("controlplane command is visible, want it hidden (it is for tests)")
	}
	for _, f := range []string{"data-dir", "port", "crd-dir"} {
		if cmd.Flags().Lookup(f) == nil {
			t.Errorf("flag --%s missing", f)
		}
	}
}
