package ctrd_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/drover-fleet/drover/internal/ctrdtest"
)

// TestImportFromPrePullStore: an image in the pre-pull store (an OCI
// layout, named by its ref annotation) is imported into containerd and
// runs; one that is not there is refused, saying so.
func TestImportFromPrePullStore(t *testing.T) {
	const ref = "drover.test/prepulled:1"
	prog, err := os.ReadFile(testprog(t))
	if err != nil {
		t.Fatal(err)
	}
	var archive bytes.Buffer
	if err := ctrdtest.WriteImage(&archive, ref, prog); err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag(ref)
	img, err := tarball.Image(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(archive.Bytes())), nil }, &tag)
	if err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(t.TempDir(), "images")
	lp, err := layout.Write(store, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref})); err != nil {
		t.Fatal(err)
	}

	out, err := exec.Command(os.Args[0], "import", "--address", daemon.Address, "--layout", store, "--image", ref).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "imported "+ref) {
		t.Fatalf("import: %v\n%s", err, out)
	}
	code, stdout, stderr, res := companion(t, "run", "--id", "imported-run", "--image", ref, "--user", "1:1", "--", "/testprog", "echo", "from the store")
	if code != 0 || stdout != "from the store\n" || !res.Ran {
		t.Fatalf("run of the imported image: code %d, stdout %q, result %+v; stderr: %s", code, stdout, res, stderr)
	}

	out, err = exec.Command(os.Args[0], "import", "--address", daemon.Address, "--layout", store, "--image", "drover.test/absent:1").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "is not in the image store") {
		t.Fatalf("import of an absent image: %v\n%s", err, out)
	}
}

// testprog builds the test image's program.
func testprog(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "testprog")
	build := exec.CommandContext(context.Background(), "go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "github.com/drover-fleet/drover/internal/ctrdtest/testprog")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build testprog: %v: %s", err, out)
	}
	return bin
}
