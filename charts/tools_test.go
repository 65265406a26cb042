package charts

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/drover-fleet/drover/internal/testenv"
)

// toolTimeout bounds one build of helm and kustomize from tools/go.mod: a
// cold build of helm takes minutes on a loaded 2-core machine; a warm one
// (Go's build cache) seconds.
const toolTimeout = 20 * time.Minute

// kubeVersion is the Kubernetes version helm template renders for: the
// chart's minimum (its Chart.yaml kubeVersion).
const kubeVersion = "v1.30.0"

// runTimeout bounds one helm or kustomize run.
const runTimeout = 2 * time.Minute

// tools are helm and kustomize, built once per test binary.
type tools struct {
	helm, kustomize string
	// home is HELM_*_HOME: nothing from the user's helm setup is read.
	home string
}

var buildTools = sync.OnceValues(func() (*tools, error) {
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	// A fixed place in the user's cache, so that a later run's `go build`
	// finds the binaries up to date and leaves them alone.
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	// One directory per checkout: two worktrees' tests never write the same
	// binary at once.
	sum := sha256.Sum256([]byte(root))
	dir := filepath.Join(cache, "drover-test-tools", hex.EncodeToString(sum[:6]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	tl := &tools{helm: filepath.Join(dir, "helm"), kustomize: filepath.Join(dir, "kustomize"), home: filepath.Join(dir, "helm-home")}
	ctx, cancel := context.WithTimeout(context.Background(), toolTimeout)
	defer cancel()
	start := time.Now()
	// tools/ is its own module: its go.mod pins the versions, and none of
	// helm's dependencies reach the main module's graph. One go build for
	// both shares the work between them; -o DIR/ names the binaries helm
	// and kustomize.
	ldflags, err := helmKubeVersion(filepath.Join(root, "tools", "go.mod"))
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, goCommand(), "build", "-ldflags", ldflags, "-o", dir+string(filepath.Separator),
		"helm.sh/helm/v3/cmd/helm", "sigs.k8s.io/kustomize/kustomize/v5")
	cmd.Dir = filepath.Join(root, "tools")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build helm and kustomize in tools/: %w\n%s", err, b)
	}
	fmt.Fprintf(os.Stderr, "charts: go build of helm and kustomize (tools/go.mod) took %s\n", time.Since(start).Round(time.Second))
	return tl, nil
})

// helmKubeVersion returns the -ldflags that helm's Makefile sets: the
// Kubernetes version helm assumes without a cluster (`helm install
// --dry-run=client`, lint's deprecation rules) is that of its client-go,
// not 1.20.
func helmKubeVersion(gomod string) (string, error) {
	b, err := os.ReadFile(gomod)
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`(?m)^\s*k8s\.io/client-go v0\.(\d+)\.`).FindSubmatch(b)
	if m == nil {
		return "", fmt.Errorf("%s: no k8s.io/client-go v0.N requirement", gomod)
	}
	var flags []string
	for _, pkg := range []string{"helm.sh/helm/v3/pkg/chartutil", "helm.sh/helm/v3/pkg/lint/rules"} {
		flags = append(flags, "-X", pkg+".k8sVersionMajor=1", "-X", pkg+".k8sVersionMinor="+string(m[1]))
	}
	return strings.Join(flags, " "), nil
}

// needTools builds the tools (once) or fails t; under -short it skips t.
func needTools(t *testing.T) *tools {
	t.Helper()
	if testing.Short() {
		t.Skip("builds helm and kustomize; run without -short")
	}
	tl, err := buildTools()
	if err != nil {
		t.Fatal(err)
	}
	return tl
}

func goCommand() string {
	if p := filepath.Join(os.Getenv("GOROOT"), "bin", "go"); os.Getenv("GOROOT") != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "go"
}

func repoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	// The test runs in charts/.
	root := filepath.Dir(wd)
	if _, err := os.Stat(filepath.Join(root, "tools", "go.mod")); err != nil {
		return "", fmt.Errorf("tools/go.mod not found above %s: %w", wd, err)
	}
	return root, nil
}

// run runs bin (helm or kustomize) with args from the repository root
// and returns its stdout; anything on stderr fails t.
func (tl *tools) run(t *testing.T, bin string, args ...string) string {
	t.Helper()
	out, err := tl.try(bin, args...)
	if err != nil {
		t.Fatalf("%s %s: %v", filepath.Base(bin), strings.Join(args, " "), err)
	}
	return out
}

func (tl *tools) try(bin string, args ...string) (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(tl.home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(tl.home, "config"),
		"HELM_DATA_HOME="+filepath.Join(tl.home, "data"),
		// No cluster: helm would warn about a group-readable kubeconfig.
		"KUBECONFIG="+filepath.Join(tl.home, "no-kubeconfig"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%w\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	if stderr.Len() > 0 {
		// helm and kustomize warn on stderr (deprecated fields, …).
		return stdout.String(), fmt.Errorf("wrote to stderr:\n%s", stderr.String())
	}
	return stdout.String(), nil
}

// helmTemplate renders the chart as release "drover" in ns, with --set
// for each of set ("values:FILE" for a values file).
func (tl *tools) helmTemplate(t *testing.T, ns string, set ...string) []*unstructured.Unstructured {
	t.Helper()
	// The chart's minimum Kubernetes (ValidatingAdmissionPolicy): it
	// renders there.
	args := []string{"template", "drover", "charts/drover", "--namespace", ns, "--include-crds", "--kube-version", kubeVersion}
	for _, s := range set {
		if file, ok := strings.CutPrefix(s, "values:"); ok {
			args = append(args, "--values", file)
		} else {
			args = append(args, "--set", s)
		}
	}
	return decode(t, tl.run(t, tl.helm, args...))
}

func (tl *tools) kustomizeBuild(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	return decode(t, tl.run(t, tl.kustomize, "build", "config/default"))
}

// decode splits a multi-document YAML stream into objects.
func decode(t *testing.T, s string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := decodeYAML([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func decodeYAML(b []byte) ([]*unstructured.Unstructured, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	var out []*unstructured.Unstructured
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		// Through JSON, so that numbers are int64 as the API's are.
		j, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, err
		}
		if s := string(bytes.TrimSpace(j)); s == "null" || s == "{}" {
			continue // a document of comments only
		}
		o := &unstructured.Unstructured{}
		if err := o.UnmarshalJSON(j); err != nil {
			return nil, fmt.Errorf("%w in:\n%s", err, doc)
		}
		out = append(out, o)
	}
}

// find returns the object of kind, namespace and name, or fails t.
func find(t *testing.T, objs []*unstructured.Unstructured, kind, ns, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetNamespace() == ns && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %s/%s among %d objects", kind, ns, name, len(objs))
	return nil
}

// sharedEnv is the package's control plane, started by the first test that
// needs one and stopped by TestMain.
var sharedEnv = struct {
	once sync.Once
	env  *testenv.Env
	stop func()
}{stop: func() {}}

func controlPlane(t *testing.T) *testenv.Env {
	t.Helper()
	if testing.Short() {
		t.Skip(testenv.SkipReason)
	}
	sharedEnv.once.Do(func() {
		sharedEnv.env, sharedEnv.stop = testenv.StartMain(testenv.Options{})
	})
	return testenv.Require(t, sharedEnv.env)
}

func TestMain(m *testing.M) {
	// testenv's controller-runtime client logs nothing worth seeing here.
	ctrllog.SetLogger(logr.Discard())
	code := m.Run()
	sharedEnv.stop()
	os.Exit(code)
}
