package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/bootstrap"
	"github.com/drover-fleet/drover/internal/manager"
	"github.com/drover-fleet/drover/internal/testenv"
	"github.com/drover-fleet/drover/internal/testkit"
)

// Named timeouts: how long a thing may take before the test fails.
const (
	startTimeout   = 4 * time.Minute // cold start of the apiserver on a loaded 2-core machine
	defaultTimeout = testkit.DefaultTimeout
	// shutdownTimeout bounds a clean stop after SIGTERM.
	shutdownTimeout = 30 * time.Second
	// Short liveness settings so that Offline is observable in seconds.
	heartbeatInterval = time.Second
	offlineTimeout    = 5 * time.Second
)

// proc is a child process whose output is kept for failure messages.
type proc struct {
	name string
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
	err  error
}

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *proc) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// start runs bin with args; the process is killed at test cleanup.
func start(t testing.TB, name, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p, p
	// A child that outlives the process (an agent's instance goes on when
	// the agent stops) keeps the output pipe open: Wait gives up on it.
	p.cmd.WaitDelay = 15 * time.Second
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.stop(syscall.SIGTERM)
		if t.Failed() {
			t.Logf("--- output of %s:\n%s", name, tail(p.Output(), 60))
		}
	})
	return p
}

// stop signals the process and waits for it (SIGKILL after 10s).
func (p *proc) stop(sig syscall.Signal) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// exited waits for the process to end on its own and returns its exit code.
func (p *proc) exited(t testing.TB, within time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(within):
		t.Fatalf("%s still running after %v; output:\n%s", p.name, within, tail(p.Output(), 30))
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	return 0
}

// waitLine waits for a line of output matching re and returns its submatches.
func (p *proc) waitLine(t testing.TB, re *regexp.Regexp, within time.Duration) []string {
	t.Helper()
	var m []string
	exited := false
	why := testkit.Wait(context.Background(), within, func() string {
		sc := bufio.NewScanner(strings.NewReader(p.Output()))
		for sc.Scan() {
			if m = re.FindStringSubmatch(sc.Text()); m != nil {
				return ""
			}
		}
		select {
		case <-p.done:
			exited = true
			return ""
		default:
		}
		return fmt.Sprintf("%s did not print %q", p.name, re)
	})
	switch {
	case m != nil:
		return m
	case exited:
		t.Fatalf("%s exited (%v) before printing %q; output:\n%s", p.name, p.err, re, tail(p.Output(), 60))
	default:
		t.Fatalf("%s within %v; output:\n%s", why, within, tail(p.Output(), 60))
	}
	return nil
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// cluster is one `drover server` shared by the tests of this package.
type cluster struct {
	drover, agent string
	server        *proc
	kubeconfig    string
	hub           string
	ca            string
	client        client.Client
}

var readyRE = regexp.MustCompile(`^ready kubeconfig=(\S+) hub=(\S+) ca=(\S+)$`)

// startCluster builds the binaries (once per `go test` run) and starts a
// server with short liveness timeouts.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end: needs real drover processes and a kube-apiserver; run without -short")
	}
	c := &cluster{
		drover: testenv.Binary(t, "./cmd/drover"),
		agent:  testenv.Binary(t, "./cmd/drover-agent", "-X github.com/drover-fleet/drover/internal/agent/cmd.Version=v0.0.1-e2e"),
	}
	dir := t.TempDir()
	c.server = start(t, "drover server", c.drover, "server", "--data-dir", filepath.Join(dir, "server"),
		"--hub-listen", "127.0.0.1:0", "--mqtt-listen", "127.0.0.1:0", "--hub-name", "hub-main", "--metrics-bind-address", "0",
		"--heartbeat-interval", heartbeatInterval.String(), "--offline-timeout", offlineTimeout.String())
	m := c.server.waitLine(t, readyRE, startTimeout)
	c.kubeconfig, c.hub, c.ca = m[1], m[2], m[3]
	c.connect(t)
	// The server's tenancy webhook admits work only where a NodeGrant
	// allows it: these tests run theirs in any namespace, on any node.
	if err := c.client.Create(context.Background(), &fleetv1.NodeGrant{ObjectMeta: metav1.ObjectMeta{Name: "e2e"},
		Spec: fleetv1.NodeGrantSpec{NamespaceSelector: &metav1.LabelSelector{}}}); err != nil {
		t.Fatalf("grant the tests' namespaces every node: %v", err)
	}
	return c
}

// connect (re)creates the API client from c.kubeconfig.
func (c *cluster) connect(t testing.TB) {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c.client, err = client.New(cfg, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
}

// token creates a bootstrap token.
func (c *cluster) token(t testing.TB, autoApprove bool, ttl time.Duration) string {
	t.Helper()
	tok, err := bootstrap.Generate()
	if err != nil {
		t.Fatal(err)
	}
	tok.AutoApprove = autoApprove
	if ttl != 0 {
		exp := time.Now().Add(ttl)
		tok.Expires = &exp
	}
	if err := bootstrap.Create(context.Background(), c.client, "drover-system", tok); err != nil {
		t.Fatal(err)
	}
	return tok.String()
}

// startAgent runs drover-agent for node with stateDir. Its tasks run as
// nobody, so their dirs go beside stateDir (--work-dir's default), which
// they reach only if stateDir's parent lets every user through: t.TempDir's
// parents do not.
func (c *cluster) startAgent(t testing.TB, node, stateDir string, args ...string) *proc {
	t.Helper()
	base := []string{"--node", node, "--state-dir", stateDir, "--ca-file", c.ca, "--heartbeat-interval", heartbeatInterval.String(), "--log-level", "debug",
		"--work-dir", filepath.Join(openDir(t), "work")}
	return start(t, "drover-agent "+node, c.agent, append(base, args...)...)
}

// openDir is a fresh dir every user may use, 1777 as /tmp is (a task runs
// as nobody), removed at the test's end.
func openDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "drover-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o1777); err != nil {
		t.Fatal(err)
	}
	return dir
}

// cli runs `drover ARGS` against the cluster and returns its output.
func (c *cluster) cli(t testing.TB, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(c.drover, append([]string{"--kubeconfig", c.kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// node reads a FleetNode; ok is false if it does not exist.
func (c *cluster) node(t testing.TB, name string) (fleetv1.FleetNode, bool) {
	t.Helper()
	var n fleetv1.FleetNode
	err := c.client.Get(context.Background(), client.ObjectKey{Name: name}, &n)
	if apierrors.IsNotFound(err) {
		return n, false
	}
	if err != nil {
		t.Fatalf("get node %s: %v", name, err)
	}
	return n, true
}

func (c *cluster) waitPhase(t testing.TB, node string, want fleetv1.FleetNodePhase, within time.Duration) fleetv1.FleetNode {
	t.Helper()
	var n fleetv1.FleetNode
	testkit.Eventually(t, within, func() string {
		var ok bool
		n, ok = c.node(t, node)
		if !ok {
			return fmt.Sprintf("node %s does not exist", node)
		}
		if n.Status.Phase != want {
			return fmt.Sprintf("node %s phase = %q, want %q (status %+v)", node, n.Status.Phase, want, n.Status)
		}
		return ""
	})
	return n
}
