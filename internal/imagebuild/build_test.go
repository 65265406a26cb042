package imagebuild

import (
	"context"
	"debug/elf"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// buildTimeout bounds the builds of this test: a cold static build of
// cmd/drover (kube-apiserver linked in) takes minutes on a loaded 2-core
// machine.
const buildTimeout = 20 * time.Minute

// moduleRoot is the Drover module's root: this package's directory is
// internal/imagebuild (internal/testenv knows the same, but would link the
// Kubernetes client into this test for it).
func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root: %v", err)
	}
	return root
}

// TestBuildAmd64Images builds the linux/amd64 images of drover and
// drover-agent as `drover-image build` does (CI's image build), reads them
// back from an OCI layout and checks them; a second build of the agent gives
// the same digest. The arm64 build of drover is a release step
// (docs/images.md): it would double the longest build of the suite.
func TestBuildAmd64Images(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: compiles cmd/drover and cmd/drover-agent")
	}
	root := moduleRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	// The version is left empty so that the agent's flags are those of
	// .ci/run's agent build ("-trimpath -ldflags '-s -w'"): its compile is a
	// cache hit there.
	meta := Meta{Revision: "test", Created: time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)}
	opts := Options{ModuleDir: root, BinDir: filepath.Join(t.TempDir(), "a"), Platforms: []v1.Platform{amd64}, Meta: meta, Logf: t.Logf}
	began := time.Now()
	results, err := Build(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built %d images in %s", len(results), time.Since(began).Round(time.Millisecond))
	if len(results) != 2 {
		t.Fatalf("Build returned %d images, want drover and drover-agent", len(results))
	}

	out := t.TempDir()
	for _, r := range results {
		bin := r.Binaries["linux/amd64"]
		checkStaticAmd64(t, bin)
		data, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(out, r.Spec.Name)
		if _, err := WriteLayout(dir, "test", r.Index); err != nil {
			t.Fatal(err)
		}
		idx, err := ReadLayout(dir)
		if err != nil {
			t.Fatal(err)
		}
		im, err := idx.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		if len(im.Manifests) != 1 || im.Manifests[0].Platform == nil || im.Manifests[0].Platform.Architecture != "amd64" {
			t.Fatalf("%s index manifests = %+v, want one linux/amd64 image", r.Spec.Name, im.Manifests)
		}
		img, err := idx.Image(im.Manifests[0].Digest)
		if err != nil {
			t.Fatal(err)
		}
		checkImage(t, img, r.Spec, amd64, data)

		// The same binary assembled again is the same image.
		again, err := Image(r.Spec, amd64, bin, meta)
		if err != nil {
			t.Fatal(err)
		}
		if digest(t, again) != digest(t, img) {
			t.Errorf("%s: assembling the same binary twice gave %s and %s", r.Spec.Name, digest(t, img), digest(t, again))
		}
	}

	// A second build from scratch (a fresh binary from go build) gives the
	// same image. The agent is used: relinking cmd/drover would cost
	// another minute for the same proof.
	opts.BinDir = filepath.Join(t.TempDir(), "b")
	opts.Specs = []Spec{Agent()}
	second, err := Build(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if d1, d2 := digest(t, results[1].Index), digest(t, second[0].Index); d1 != d2 {
		t.Errorf("drover-agent: two builds gave index digests %s and %s", d1, d2)
	}
}

// checkStaticAmd64 checks that the file is an x86-64 ELF executable with no
// program interpreter: a static binary, which an image with no libc needs.
func checkStaticAmd64(t *testing.T, path string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 || f.Type != elf.ET_EXEC {
		t.Errorf("%s: ELF machine %v type %v, want an x86-64 executable", path, f.Machine, f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s: has a program interpreter: not statically linked (CGO_ENABLED=0 missing?)", path)
		}
	}
}
