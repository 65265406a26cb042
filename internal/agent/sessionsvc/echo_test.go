package sessionsvc

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/agent/cgroup"
	"github.com/drover-fleet/drover/internal/agent/instance"
	"github.com/drover-fleet/drover/internal/agent/taskexec"
	"github.com/drover-fleet/drover/internal/serverless/actor"
)

// buildEcho builds examples/echo-session into dir.
func buildEcho(t *testing.T, dir string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out := filepath.Join(dir, "echo-session")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, "build", "-o", out, "../../../examples/echo-session")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build examples/echo-session: %v\n%s", err, b)
	}
	if err := os.Chmod(out, 0o755); err != nil {
		t.Fatal(err)
	}
	return out
}

// echoRuntime is an instance runtime with cgroups and examples/echo-session
// built into shared, a dir every user reaches; or a skip where there are no
// cgroups or no root.
func echoRuntime(t *testing.T) (rt *instance.Runtime, prog, shared, mode string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (cgroups, the freezer, an unprivileged instance user)")
	}
	cg, err := cgroup.New(cgroup.Options{})
	if err != nil {
		t.Skipf("needs cgroups: %v", err)
	}
	shared, err = os.MkdirTemp("", "ss-echo-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(shared) })
	if err := os.Chmod(shared, 0o755); err != nil {
		t.Fatal(err)
	}
	prog = buildEcho(t, shared)
	d, err := taskexec.New(taskexec.Options{StateDir: t.TempDir(), WorkDir: filepath.Join(shared, "work"), Cgroups: cg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	if rt, err = instance.New(instance.Options{Driver: d}); err != nil {
		t.Fatal(err)
	}
	return rt, prog, shared, cg.Mode()
}

// line reads one line from r within testTimeout.
func line(t *testing.T, c net.Conn, r *bufio.Reader) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(testTimeout))
	s, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("read from the instance: %v", err)
	}
	return strings.TrimSpace(s)
}

// TestEchoSession runs examples/echo-session as an instance: started, live,
// frozen (standby), thawed (activated), a session opened through the
// session service, answered on the instance's port, and closed.
func TestEchoSession(t *testing.T) {
	rt, prog, shared, mode := echoRuntime(t)
	rec := newRecorder()
	svc, err := New(Options{Dir: filepath.Join(shared, "s"), Handler: rec.handle})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()

	const name, uid = "echo-1", 65534
	// The socket is served before the instance exists (its path is in the
	// instance's environment); the member check finds the instance later.
	var started atomic.Pointer[instance.Instance]
	member := func(pid int) bool { i := started.Load(); return i != nil && i.Member(pid) }
	sock, err := svc.Serve(name, Owner{UID: uid, GID: uid, Member: member})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*testTimeout)
	defer cancel()
	u := int64(uid)
	t0 := time.Now()
	inst, err := rt.Start(ctx, instance.Spec{Name: name, Namespace: "ns", Application: "echo", Command: []string{prog},
		RunAsUser: &u, RunAsGroup: &u, SessionSocket: sock})
	if err != nil {
		t.Fatal(err)
	}
	started.Store(inst)
	defer func() {
		if err := inst.Stop(ctx, 5*time.Second); err != nil {
			t.Error(err)
		}
		if st := inst.Status(); st.Result != nil {
			t.Logf("instance ended: %s; output:\n%s", st.Result.Phase, st.Result.Report.OutputTail)
		}
	}()
	if err := inst.WaitLive(ctx, &instance.Probe{TCP: true}, nil, 0); err != nil {
		t.Fatal(err)
	}
	t.Logf("start until live: %v", time.Since(t0))
	froze, err := inst.Freeze(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := inst.Alive(); err != nil {
		t.Fatal(err)
	}

	// Activate: thaw, then SessionStart; open returns at SessionReady.
	opened := time.Now()
	thawed, err := inst.Thaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Start(name, "s1", map[string]string{"user": "ada"}); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, event{name, "s1", actor.ReadyCallback{}})
	t.Logf("freeze %v, thaw %v, thaw to SessionReady %v (cgroup mode %s)", froze, thawed, time.Since(opened), mode)

	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(inst.Port())), testTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if got := line(t, c, r); got != "session s1" {
		t.Fatalf("greeting %q", got)
	}
	fmt.Fprintln(c, "hello")
	if got := line(t, c, r); got != "hello" {
		t.Fatalf("echo %q", got)
	}
	client := c.LocalAddr().String()
	rec.wait(t, event{name, "s1", actor.ClientJoin{Client: client}})

	if err := svc.CloseSession(name, "s1"); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, event{name, "s1", actor.EvacuatedCallback{}})
	rec.wait(t, event{name, "s1", actor.ClosedCallback{}})
	_ = c.SetReadDeadline(time.Now().Add(testTimeout))
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("the client of a closed session is still connected")
	}
	svc.Forget(name, "s1")
}
