package gen

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// cases returns the base names of testdata/*.ctrlkit.
func cases(t *testing.T) []string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("testdata", "*.ctrlkit"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no test cases in testdata/: %v", err)
	}
	names := make([]string, len(paths))
	for i, p := range paths {
		names[i] = strings.TrimSuffix(filepath.Base(p), ".ctrlkit")
	}
	return names
}

// generateCase generates testdata/<name>.ctrlkit into package <name>.
func generateCase(t *testing.T, name string) []byte {
	t.Helper()
	path := filepath.Join("testdata", name+".ctrlkit")
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out, err := GenerateFile(path, src, Options{Package: name})
	if err != nil {
		t.Fatalf("GenerateFile(%s) = %v", path, err)
	}
	return out
}

func TestGolden(t *testing.T) {
	for _, name := range cases(t) {
		t.Run(name, func(t *testing.T) {
			got := generateCase(t, name)
			golden := filepath.Join("testdata", name+".go.golden")
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("GenerateFile(%s.ctrlkit) differs from %s (run go test -update to accept):\n%s", name, golden, diff(string(want), string(got)))
			}
		})
	}
}

// diff shows the first differing lines; enough to see what changed.
func diff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return "line " + strconv.Itoa(i+1) + ":\n- " + wl + "\n+ " + gl
		}
	}
	return "(no line differs)"
}
