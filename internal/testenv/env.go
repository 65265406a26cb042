package testenv

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const (
	// StartTimeout bounds the wait for the "ready" line of `drover
	// controlplane`: a cold start on a loaded 2-core machine plus CRD
	// installation.
	StartTimeout = 3 * time.Minute
	// StopTimeout is how long Stop waits after SIGTERM before SIGKILL.
	StopTimeout = 30 * time.Second

	// SkipReason is why Start skips under -short.
	SkipReason = "needs a real kube-apiserver; run without -short"

	// OutputFile is the file in the data dir that receives the control
	// plane process's stdout and stderr. The apiserver's and etcd's own
	// logs are apiserver.log and etcd.log beside it.
	OutputFile = "controlplane.out"

	readyPrefix = "ready kubeconfig="
)

// Options configure Start and StartMain.
type Options struct {
	// Scheme is the scheme of Env.Client. Nil means client-go's scheme
	// (built-in kinds only); pass one with Drover's API types added to use
	// them.
	Scheme *runtime.Scheme

	// DataDir holds the control plane's state. Empty means a new temporary
	// directory (t.TempDir for Start; removed by StartMain's stop). Pass the
	// same DataDir to a second Start to test a restart.
	DataDir string

	// CRDDir is the directory whose *.yaml CRDs are installed before Start
	// returns. Empty means <repo>/config/crd/bases if it exists.
	CRDDir string
}

// Env is a running control plane.
type Env struct {
	// Kubeconfig is the path of the admin kubeconfig.
	Kubeconfig string
	// Config is the admin rest.Config, with client-side rate limits raised
	// for tests (QPS 1000, burst 2000).
	Config *rest.Config
	// Client is a controller-runtime client (no cache) with Options.Scheme.
	Client client.Client
	// DataDir is the control plane's data directory.
	DataDir string

	cmd      *exec.Cmd
	exited   chan struct{} // closed when cmd.Wait returns
	exitErr  error         // set before exited is closed
	stopOnce sync.Once
	stopErr  error
}

// Start starts `drover controlplane` with the data dir and CRDs of opts,
// waits until it is ready, and stops it when t ends. Under -short it skips t.
// On failure it prints the tail of the control plane's output.
func Start(t testing.TB, opts Options) *Env {
	t.Helper()
	if testing.Short() {
		t.Skip(SkipReason)
	}
	bin := Binary(t, "./cmd/drover")
	if opts.DataDir == "" {
		opts.DataDir = t.TempDir()
	}
	env, err := start(bin, opts, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop control plane: %v", err)
		}
		if t.Failed() {
			t.Logf("control plane output (%s), last lines:\n%s", env.OutputPath(), tail(env.OutputPath(), 30))
		}
	})
	return env
}

// StartMain starts a control plane for a whole test package, from TestMain.
// stop stops it and removes a temporary data dir. Under -short it starts
// nothing and returns a nil *Env and a no-op stop; tests then call Require,
// which skips them. On failure it prints why and exits the process.
//
//	var env *testenv.Env
//
//	func TestMain(m *testing.M) {
//		var stop func()
//		env, stop = testenv.StartMain(testenv.Options{Scheme: scheme})
//		code := m.Run()
//		stop()
//		os.Exit(code)
//	}
func StartMain(opts Options) (*Env, func()) {
	if !flag.Parsed() {
		flag.Parse()
	}
	if testing.Short() {
		return nil, func() {}
	}
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	fail := func(err error) {
		fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
		os.Exit(1)
	}
	bin, err := buildBinary("./cmd/drover", nil, logf)
	if err != nil {
		fail(fmt.Errorf("build ./cmd/drover: %w", err))
	}
	removeDir := false
	if opts.DataDir == "" {
		dir, err := os.MkdirTemp("", "drover-testenv-")
		if err != nil {
			fail(err)
		}
		opts.DataDir, removeDir = dir, true
	}
	env, err := start(bin, opts, logf)
	if err != nil {
		fail(err)
	}
	return env, func() {
		if err := env.Stop(); err != nil {
			logf("testenv: stop control plane: %v", err)
		}
		if removeDir {
			os.RemoveAll(opts.DataDir)
		}
	}
}

// Require skips t when e is nil (StartMain under -short) and returns e.
func Require(t testing.TB, e *Env) *Env {
	t.Helper()
	if e == nil {
		t.Skip(SkipReason)
	}
	return e
}

// OutputPath is the file holding the control plane process's output.
func (e *Env) OutputPath() string { return filepath.Join(e.DataDir, OutputFile) }

// Stop sends SIGTERM to the control plane, waits up to StopTimeout for it to
// exit, then kills it. It is safe to call more than once; later calls return
// the first result.
func (e *Env) Stop() error {
	e.stopOnce.Do(func() {
		select {
		case <-e.exited:
			e.stopErr = fmt.Errorf("control plane had already exited: %v", e.exitErr)
			return
		default:
		}
		_ = e.cmd.Process.Signal(syscall.SIGTERM)
		timer := time.NewTimer(StopTimeout)
		defer timer.Stop()
		select {
		case <-e.exited:
			if e.exitErr != nil {
				e.stopErr = fmt.Errorf("control plane exited with %v after SIGTERM; see %s", e.exitErr, e.OutputPath())
			}
		case <-timer.C:
			_ = e.cmd.Process.Kill()
			<-e.exited
			e.stopErr = fmt.Errorf("control plane still running %s after SIGTERM; killed", StopTimeout)
		}
	})
	return e.stopErr
}

func start(bin string, opts Options, logf func(string, ...any)) (*Env, error) {
	dataDir, err := filepath.Abs(opts.DataDir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	crdDir := opts.CRDDir
	if crdDir == "" {
		root, err := findRepoRoot()
		if err != nil {
			return nil, err
		}
		if st, err := os.Stat(filepath.Join(root, "config", "crd", "bases")); err == nil && st.IsDir() {
			crdDir = filepath.Join(root, "config", "crd", "bases")
		}
	}

	outPath := filepath.Join(dataDir, OutputFile)
	out, err := os.OpenFile(outPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open control plane output: %w", err)
	}
	args := []string{"controlplane", "--data-dir", dataDir}
	if crdDir != "" {
		args = append(args, "--crd-dir", crdDir)
	}
	fmt.Fprintf(out, "=== %s %s %s\n", time.Now().Format(time.RFC3339), bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Stderr = out
	cmd.SysProcAttr = childAttrs()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		out.Close()
		return nil, err
	}
	began := time.Now()
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}

	e := &Env{DataDir: dataDir, cmd: cmd, exited: make(chan struct{})}
	ready := make(chan string, 1)
	copied := make(chan struct{})
	go func() {
		// Copy stdout into the output file, watching for the ready line.
		defer close(copied)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(out, line)
			if path, ok := strings.CutPrefix(line, readyPrefix); ok {
				// `drover server` prints more fields after the path.
				path, _, _ = strings.Cut(strings.TrimSpace(path), " hub=")
				select {
				case ready <- path:
				default:
				}
			}
		}
		_, _ = io.Copy(out, stdout)
	}()
	go func() {
		<-copied // Wait closes stdout: read it all first
		e.exitErr = cmd.Wait()
		out.Close()
		close(e.exited)
	}()

	timer := time.NewTimer(StartTimeout)
	defer timer.Stop()
	var kubeconfig string
	select {
	case kubeconfig = <-ready:
	case <-e.exited:
		return nil, fmt.Errorf("drover controlplane exited before it was ready (%v); last lines of %s:\n%s",
			e.exitErr, outPath, tail(outPath, 40))
	case <-timer.C:
		_ = e.Stop()
		return nil, fmt.Errorf("drover controlplane not ready after %s; last lines of %s:\n%s",
			StartTimeout, outPath, tail(outPath, 40))
	}
	logf("testenv: control plane ready in %s (data dir %s)", time.Since(began).Round(time.Millisecond), dataDir)

	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		_ = e.Stop()
		return nil, fmt.Errorf("load kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 1000, 2000
	scheme := opts.Scheme
	if scheme == nil {
		scheme = clientgoscheme.Scheme
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		_ = e.Stop()
		return nil, fmt.Errorf("client for %s: %w", kubeconfig, err)
	}
	e.Kubeconfig, e.Config, e.Client = kubeconfig, cfg, c
	return e, nil
}

// tail returns the last n lines of the file at path, or why it cannot.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "(no output)"
		}
		return fmt.Sprintf("(read %s: %v)", path, err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
