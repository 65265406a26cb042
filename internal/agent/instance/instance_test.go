package instance

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/agent/cgroup"
	"github.com/drover-fleet/drover/internal/agent/taskexec"
)

// testTimeout bounds every wait across processes (a loaded 2-core CI).
const testTimeout = 60 * time.Second

func TestPorts(t *testing.T) {
	p, err := NewPorts(40000, 40002)
	if err != nil {
		t.Fatal(err)
	}
	const busy = 40000 // something else on the node listens there
	p.free = func(port int) bool { return port != busy }
	seen := map[int]bool{}
	for _, owner := range []string{"a", "b"} {
		port, err := p.Allocate(owner)
		if err != nil {
			t.Fatal(err)
		}
		if port == busy || seen[port] {
			t.Fatalf("%s got port %d: busy %d, seen %v", owner, port, busy, seen)
		}
		seen[port] = true
		if again, _ := p.Allocate(owner); again != port {
			t.Fatalf("%s: allocated twice: %d then %d", owner, port, again)
		}
	}
	if _, err := p.Allocate("c"); err == nil {
		t.Fatal("a full range allocated a port")
	}
	aPort, _ := p.Allocate("a")
	p.Release("a")
	if got, err := p.Allocate("c"); err != nil || got != aPort {
		t.Fatalf("a released port was not reused: %d, %v", got, err)
	}
	if err := p.Reserve("d", aPort); err == nil {
		t.Fatal("reserved a port c holds")
	}
	if err := p.Reserve("c", aPort); err != nil {
		t.Fatalf("c cannot reserve its own port again: %v", err)
	}
	for _, r := range [][2]int{{10, 5}, {0, 5}, {1, 70000}} {
		if _, err := NewPorts(r[0], r[1]); err == nil {
			t.Errorf("range %v was accepted", r)
		}
	}

	// The real check: a port something listens on is not given out.
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port
	one, _ := NewPorts(taken, taken)
	if port, err := one.Allocate("x"); err == nil {
		t.Fatalf("allocated port %d, which is listened on", port)
	}
	k, _ := NewPorts(0, 0)
	a, err1 := k.Allocate("a")
	b, err2 := k.Allocate("b")
	if err1 != nil || err2 != nil || a == b {
		t.Fatalf("kernel ports: %d %v, %d %v", a, err1, b, err2)
	}
}

// sharedDir is a fresh dir every user reaches (instances run as nobody).
func sharedDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "instance-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// program copies the test binary where an instance's user may run it.
func program(t *testing.T, dir string) string {
	t.Helper()
	src, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "program")
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}

// newRuntime is a runtime with cgroups, or a skip where there are none.
func newRuntime(t *testing.T) (*Runtime, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("instance tests need root (cgroups, the freezer)")
	}
	m, err := cgroup.New(cgroup.Options{})
	if err != nil {
		t.Skipf("instance tests need cgroups: %v", err)
	}
	shared := sharedDir(t)
	d, err := taskexec.New(taskexec.Options{StateDir: t.TempDir(), WorkDir: filepath.Join(shared, "work"), Cgroups: m})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	rt, err := New(Options{Driver: d})
	if err != nil {
		t.Fatal(err)
	}
	return rt, program(t, shared)
}

func start(t *testing.T, rt *Runtime, prog, name, mode string) *Instance {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	i, err := rt.Start(ctx, Spec{Name: name, Namespace: "ns", Application: "app", Command: []string{prog}, Env: []string{modeEnv + "=" + mode}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		if err := i.Stop(ctx, time.Second); err != nil {
			t.Error(err)
		}
	})
	return i
}

// roundTrip sends a line to the echo instance and reads it back within d.
func roundTrip(i *Instance, line string, d time.Duration) error {
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(i.Port())), d)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(d))
	if _, err := fmt.Fprintln(c, line); err != nil {
		return err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(got) != line {
		return fmt.Errorf("echo answered %q to %q", got, line)
	}
	return nil
}

// TestStandbyActivateStop: an instance started, live (TCP and exec
// probes), frozen (standby), thawed (activated), and stopped, with its
// session metadata file.
func TestStandbyActivateStop(t *testing.T) {
	rt, prog := newRuntime(t)
	i := start(t, rt, prog, "echo-1", "echo")
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := i.WaitLive(ctx, &Probe{TCP: true}, &Probe{Exec: []string{"/bin/true"}, Timeout: 10 * time.Second}, 0); err != nil {
		t.Fatal(err)
	}
	if err := roundTrip(i, "hello", testTimeout); err != nil {
		t.Fatal(err)
	}

	took, err := i.Freeze(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("freeze took %v (cgroup mode %s)", took, cgroupMode(t))
	if !i.Frozen() {
		t.Fatal("not frozen after Freeze")
	}
	if err := i.Alive(); err != nil {
		t.Fatalf("a frozen instance is alive: %v", err)
	}
	if err := i.Probe(ctx, Probe{TCP: true}); err == nil {
		t.Fatal("a frozen instance was probed")
	}
	// Frozen, it answers nothing (the kernel accepts the connection).
	if err := roundTrip(i, "frozen", 300*time.Millisecond); err == nil {
		t.Fatal("a frozen instance answered")
	}
	if st := i.Status(); !st.Frozen || st.Ended || st.Port != i.Port() {
		t.Fatalf("status of a frozen instance: %+v", st)
	}

	took, err = i.Thaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("thaw took %v", took)
	if err := roundTrip(i, "thawed", testTimeout); err != nil {
		t.Fatalf("a thawed instance does not answer: %v", err)
	}

	meta := SessionMetadata{Instance: i.Name(), Application: "ns/app", Sessions: []SessionData{{Name: "s1", Data: map[string]string{"user": "ada"}}}}
	for range 2 { // written, then rewritten
		if err := i.WriteSessionFile(meta); err != nil {
			t.Fatal(err)
		}
		meta.Sessions = append(meta.Sessions, SessionData{Name: "s2"})
	}
	name := filepath.Join(i.Dir(), SessionFileName)
	st, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o444 || st.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Fatalf("session file %s: mode %v uid %d, want 0444 and the agent's", name, st.Mode(), st.Sys().(*syscall.Stat_t).Uid)
	}
	var got SessionMetadata
	b, _ := os.ReadFile(name)
	if err := json.Unmarshal(b, &got); err != nil || len(got.Sessions) != 2 || got.Sessions[0].Data["user"] != "ada" {
		t.Fatalf("session file: %s (%v)", b, err)
	}
	// The instance runs as nobody: it cannot write the file.
	if dirUID := i.cred; dirUID == nil || dirUID.Uid == 0 {
		t.Fatalf("the instance runs as root: %+v", i.cred)
	}

	// Frozen again, then stopped: Stop thaws first.
	if _, err := i.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	if err := i.Stop(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := i.Alive(); err == nil {
		t.Fatal("a stopped instance is alive")
	}
	if _, err := os.Stat(i.group.Dirs()[0]); err == nil {
		t.Fatal("the cgroup of a stopped instance is left")
	}
}

func cgroupMode(t *testing.T) string {
	m, err := cgroup.New(cgroup.Options{})
	if err != nil {
		return err.Error()
	}
	return m.Mode()
}

func TestProbes(t *testing.T) {
	rt, prog := newRuntime(t)
	i := start(t, rt, prog, "http-1", "http")
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := i.WaitLive(ctx, &Probe{HTTPPath: "/healthz", Timeout: 5 * time.Second}, nil, 0); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		p    Probe
		pass bool
	}{
		{Probe{HTTPPath: "/healthz", Timeout: 10 * time.Second}, true},
		{Probe{HTTPPath: "/other", Timeout: 10 * time.Second}, false},
		{Probe{TCP: true, Timeout: 10 * time.Second}, true},
		{Probe{Exec: []string{"/bin/true"}, Timeout: 10 * time.Second}, true},
		{Probe{Exec: []string{"/bin/false"}, Timeout: 10 * time.Second}, false},
		{Probe{Exec: []string{"/usr/bin/sleep", "60"}, Timeout: 200 * time.Millisecond}, false},
		{Probe{Exec: []string{"no-such-probe"}}, false},
		{Probe{}, false},
		{Probe{TCP: true, HTTPPath: "/x"}, false},
	} {
		err := i.Probe(ctx, tt.p)
		if (err == nil) != tt.pass {
			t.Errorf("probe %+v: %v, want pass %v", tt.p, err, tt.pass)
		}
	}
}

// TestCrash: an instance that exits is seen to end (the pod actor's
// Exited), and a liveness wait says so.
func TestCrash(t *testing.T) {
	rt, prog := newRuntime(t)
	i := start(t, rt, prog, "exit-1", "exit")
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := i.WaitLive(ctx, &Probe{TCP: true}, nil, 0); err == nil {
		t.Fatal("an instance that exits became live")
	}
	select {
	case <-i.Done():
	case <-ctx.Done():
		t.Fatal("the crash was not seen")
	}
	if err := i.Alive(); err == nil {
		t.Fatal("a crashed instance is alive")
	}
	if st := i.Status(); !st.Ended || st.Result == nil || st.Result.Report.ExitCode == nil || *st.Result.Report.ExitCode != 3 {
		t.Fatalf("status of a crashed instance: %+v", st)
	}
}
