package testenv

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// BuildTimeout bounds one `go build` of a binary. A cold build of cmd/drover
// (kube-apiserver linked in) takes about 7 minutes on 2 cores.
const BuildTimeout = 20 * time.Minute

// Binary returns the path of a binary built from pkg (relative to the
// repository root, e.g. "./cmd/drover" or "./cmd/drover-agent"), with
// optional -ldflags (joined by spaces). It fails t if the build fails.
//
// The binary is built at most once per `go test` run across all test
// packages: builds are serialized by a lock file in a cache directory keyed
// by repository, package and ldflags, and a stamp naming the `go test`
// process that last built it lets the other test packages of the same run
// reuse it without calling the go command. In a later run `go build` runs
// again; it reuses the Go build cache and leaves the binary alone when
// nothing changed.
func Binary(t testing.TB, pkg string, ldflags ...string) string {
	t.Helper()
	path, err := buildBinary(pkg, ldflags, t.Logf)
	if err != nil {
		t.Fatalf("build %s: %v", pkg, err)
	}
	return path
}

// buildBinary is Binary without a testing.TB, for TestMain.
func buildBinary(pkg string, ldflags []string, logf func(string, ...any)) (string, error) {
	root, err := findRepoRoot()
	if err != nil {
		return "", err
	}
	dir, err := cacheDir(root)
	if err != nil {
		return "", err
	}
	key := sha256.Sum256([]byte(pkg + "\x00" + strings.Join(ldflags, " ")))
	name := strings.Trim(filepath.Base(filepath.Clean(pkg)), ".") + "-" + hex.EncodeToString(key[:6])
	if name[0] == '-' {
		name = "bin" + name
	}
	out := filepath.Join(dir, name)
	if runtime.GOOS == "windows" {
		out += ".exe"
	}

	unlock, err := lockFile(out + ".lock")
	if err != nil {
		return "", err
	}
	defer unlock()

	run := runID()
	stamp := out + ".stamp"
	if run != "" {
		if b, err := os.ReadFile(stamp); err == nil && string(b) == run {
			if _, err := os.Stat(out); err == nil {
				return out, nil
			}
		}
	}

	// Static and -trimpath, as .ci/run builds the agent and
	// internal/imagebuild builds the images: one compile of every package
	// serves the tests, CI's agent build and the image test (a build with
	// other flags compiles the whole of Kubernetes again).
	args := []string{"build", "-trimpath", "-o", out}
	if len(ldflags) > 0 {
		args = append(args, "-ldflags", strings.Join(ldflags, " "))
	}
	args = append(args, pkg)
	ctx, cancel := context.WithTimeout(context.Background(), BuildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, goCommand(), args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var output bytes.Buffer
	cmd.Stdout = &output
	cmd.Stderr = &output
	began := time.Now()
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("not done after %s", BuildTimeout)
		}
		return "", fmt.Errorf("go %s (in %s): %w\n%s", strings.Join(args, " "), root, err, output.String())
	}
	logf("testenv: go build %s took %s", pkg, time.Since(began).Round(time.Millisecond))
	if run != "" {
		if err := os.WriteFile(stamp, []byte(run), 0o644); err != nil {
			return "", fmt.Errorf("write build stamp: %w", err)
		}
	}
	return out, nil
}

// cacheDir returns a directory for built binaries of the repository at root.
// It lives in the user cache dir (so that `go build` finds last run's binary
// and need not relink it), falling back to the temp dir.
func cacheDir(root string) (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	sum := sha256.Sum256([]byte(root))
	dir := filepath.Join(base, "drover-testenv", hex.EncodeToString(sum[:6]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create binary cache dir: %w", err)
	}
	return dir, nil
}

func goCommand() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	if root := os.Getenv("GOROOT"); root != "" {
		return filepath.Join(root, "bin", "go")
	}
	return "go" // fails with "executable file not found", which says what to fix
}

// RepoRoot returns the root of this repository: the nearest directory at or
// above the working directory (a test's package directory) holding go.mod.
func RepoRoot(t testing.TB) string {
	t.Helper()
	root, err := findRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func findRepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find repository root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		} else if !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("find repository root: %w", err)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("find repository root: no go.mod at or above the working directory")
		}
		dir = parent
	}
}
