package taskexec

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/drover-fleet/drover/internal/task/taskwire"
)

// requireRoot skips a test that switches users: only root can.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("running tasks as other users needs root")
	}
}

func id64(v int64) *int64 { return &v }

// ids runs `id -u; id -g; id -G` as attempt id of spec and returns its output.
func ids(t *testing.T, d *Driver, id string, spec taskwire.Spec) string {
	t.Helper()
	spec.Command = []string{"sh", "-c", "id -u; id -g; id -G"}
	r := run(t, d, id, &spec)
	if r.Phase != taskwire.PhaseSucceeded {
		t.Fatalf("%s: result %+v", id, r)
	}
	return r.Report.OutputTail
}

func owner(t *testing.T, name string) string {
	t.Helper()
	fi, err := os.Lstat(name)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return fmt.Sprintf("%d:%d", st.Uid, st.Gid)
}

// A task whose spec names no user runs as nobody, with nobody's group
// only; one that names a user and group runs as those, with no other group.
func TestRunsAsItsUser(t *testing.T) {
	requireRoot(t)
	nobody, err := LookupUser(DefaultTaskUser)
	if err != nil {
		t.Fatal(err)
	}
	if nobody.UID != 65534 {
		t.Fatalf("nobody is uid %d here, want 65534", nobody.UID)
	}
	d := newDriver(t, Options{})
	for _, tt := range []struct {
		id   string
		spec taskwire.Spec
		want string
	}{
		{"task-user-1", taskwire.Spec{}, fmt.Sprintf("65534\n%d\n%d\n", nobody.GID, nobody.GID)},
		{"task-user-2", taskwire.Spec{RunAsUser: id64(1234), RunAsGroup: id64(1234)}, "1234\n1234\n1234\n"},
		{"task-user-3", taskwire.Spec{RunAsUser: id64(1234)}, "1234\n1234\n1234\n"},
		{"task-user-4", taskwire.Spec{RunAsUser: id64(1234), RunAsGroup: id64(4321)}, "1234\n4321\n4321\n"},
		{"task-user-5", taskwire.Spec{RunAsGroup: id64(4321)}, "65534\n4321\n4321\n"},
	} {
		if got := ids(t, d, tt.id, tt.spec); got != tt.want {
			t.Errorf("%s (%s): id -u, -g, -G = %q, want %q", tt.id, asked(&tt.spec), got, tt.want)
		}
	}
	// Its own dir is its, and no one else's.
	fi, err := os.Stat(d.WorkDir("task-user-2"))
	if err != nil || fi.Mode().Perm() != 0o700 || owner(t, d.WorkDir("task-user-2")) != "1234:1234" {
		t.Errorf("attempt dir %v (%v), owner %s; want 0700, 1234:1234", fi.Mode(), err, owner(t, d.WorkDir("task-user-2")))
	}
}

// Root is refused unless the agent allows it.
func TestRootRefused(t *testing.T) {
	requireRoot(t)
	d := newDriver(t, Options{})
	for i, spec := range []taskwire.Spec{{RunAsUser: id64(0)}, {RunAsGroup: id64(0)}, {RunAsUser: id64(0), RunAsGroup: id64(1234)}} {
		spec.Command = []string{"id"}
		id := fmt.Sprintf("task-root-%d", i+1)
		_, err := d.Prepare(context.Background(), id, &spec)
		var e *Error
		if !errors.As(err, &e) || e.Reason != taskwire.ReasonRunAs || !strings.Contains(err.Error(), "--allow-root-tasks") {
			t.Errorf("Prepare(%s) = %v, want a %s error naming --allow-root-tasks", id, err, taskwire.ReasonRunAs)
		}
		if _, err := os.Stat(d.WorkDir(id)); !os.IsNotExist(err) {
			t.Errorf("%s: the refused attempt has a dir (%v)", id, err)
		}
	}
	allowed := newDriver(t, Options{AllowRoot: true})
	if got := ids(t, allowed, "task-root-ok-1", taskwire.Spec{RunAsUser: id64(0)}); got != "0\n0\n0\n" {
		t.Errorf("with AllowRoot: id = %q, want root's", got)
	}
	if _, err := New(Options{StateDir: t.TempDir(), TaskUser: &User{}}); err == nil || !strings.Contains(err.Error(), "--allow-root-tasks") {
		t.Errorf("New with a root task user = %v, want an error naming --allow-root-tasks", err)
	}
}

// An agent that is not root cannot switch users: tasks run as it, and a
// task asking for another user fails saying so.
func TestUnprivilegedAgent(t *testing.T) {
	d := &Driver{taskUser: User{UID: 1000, GID: 1000}}
	if u, err := d.runAs(&taskwire.Spec{}); err != nil || u != d.taskUser {
		t.Errorf("runAs(no securityContext) = %v, %v; want the agent's own 1000:1000", u, err)
	}
	if u, err := d.runAs(&taskwire.Spec{RunAsUser: id64(1000)}); err != nil || u != d.taskUser {
		t.Errorf("runAs(the agent's own uid) = %v, %v; want it", u, err)
	}
	for _, spec := range []taskwire.Spec{{RunAsUser: id64(0)}, {RunAsUser: id64(1234)}, {RunAsGroup: id64(5)}} {
		_, err := d.runAs(&spec)
		if err == nil || !strings.Contains(err.Error(), "runs unprivileged as uid 1000") {
			t.Errorf("runAs(%s) = %v, want a refusal saying the agent runs unprivileged as uid 1000", asked(&spec), err)
		}
	}
	if d.credential(User{UID: 5}) != nil {
		t.Error("an unprivileged agent sets a credential")
	}
}

// The attack of issue #15: a task reads the agent's DB and keys, other
// tasks' logs and working dirs. Each read fails with permission denied.
func TestTaskCannotReadAgentState(t *testing.T) {
	requireRoot(t)
	base := sharedDir(t)
	state := filepath.Join(base, "state")
	if err := os.Mkdir(state, 0o700); err != nil { // as the agent makes it
		t.Fatal(err)
	}
	for _, f := range []string{"agent.db", "registration.key"} {
		if err := os.WriteFile(filepath.Join(state, f), []byte("secret"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	d := newDriver(t, Options{StateDir: state, WorkDir: filepath.Join(base, "work")})
	// Another tenant's attempt, as another user, with a file and a log.
	if r := run(t, d, "task-other-1", &taskwire.Spec{RunAsUser: id64(1234),
		Command: []string{"sh", "-c", "echo other-secret > mine; echo other-log"}}); r.Phase != taskwire.PhaseSucceeded {
		t.Fatalf("result %+v", r)
	}
	tries := map[string][]string{
		"the agent DB":              {"cat", filepath.Join(state, "agent.db")},
		"the registration key":      {"cat", filepath.Join(state, "registration.key")},
		"the state dir":             {"ls", state},
		"another task's log":        {"cat", filepath.Join(d.TaskDir("task-other-1"), StdoutFile)},
		"the work root's listing":   {"ls", d.opts.WorkDir},
		"another task's dir":        {"ls", d.WorkDir("task-other-1")},
		"another task's file":       {"cat", filepath.Join(d.WorkDir("task-other-1"), "mine")},
		"its own log (the agent's)": {"cat", filepath.Join(d.TaskDir("task-peek-0"), StdoutFile)},
	}
	i := 0
	for what, argv := range tries {
		i++
		id := fmt.Sprintf("task-peek-%d", i)
		if what == "its own log (the agent's)" {
			id = "task-peek-0"
		}
		r := run(t, d, id, &taskwire.Spec{Command: argv})
		if r.Phase != taskwire.PhaseFailed || exitCode(r) == "0" || !strings.Contains(r.Report.OutputTail, "Permission denied") {
			t.Errorf("reading %s (%q) as the task: %s, exit code %s, output %q; want a non-zero exit, permission denied",
				what, argv, r.Phase, exitCode(r), r.Report.OutputTail)
		}
		if strings.Contains(r.Report.OutputTail, "secret") || strings.Contains(r.Report.OutputTail, "other-log") {
			t.Errorf("reading %s: the task saw %q", what, r.Report.OutputTail)
		}
	}
	// Its own dir it can use.
	if r := run(t, d, "task-own-1", &taskwire.Spec{Command: []string{"sh", "-c", "echo hi > f; cat f; ls $HOME"}}); r.Report.OutputTail != "hi\nf\n" {
		t.Errorf("the task in its own dir: %+v", r)
	}
}

// A relative working dir is made inside the attempt's dir, the task
// user's; one through a symlink out of it is refused.
func TestRelativeWorkingDir(t *testing.T) {
	requireRoot(t)
	d := newDriver(t, Options{})
	r := run(t, d, "task-rel-1", &taskwire.Spec{Command: []string{"sh", "-c", "pwd; touch here"}, WorkingDir: "build/out"})
	want := filepath.Join(d.WorkDir("task-rel-1"), "build", "out")
	if r.Phase != taskwire.PhaseSucceeded || r.Report.OutputTail != want+"\n" {
		t.Fatalf("result %+v, want it run in %s", r, want)
	}
	nobody, _ := LookupUser(DefaultTaskUser)
	for _, p := range []string{filepath.Dir(want), want, filepath.Join(want, "here")} {
		if got := owner(t, p); got != nobody.String() {
			t.Errorf("%s is %s's, want the task user %s's", p, got, nobody)
		}
	}

	// An attempt prepared again (an agent restart) finds what its task
	// left: a symlink out of its dir is not followed.
	outside := sharedDir(t)
	attempt := d.WorkDir("task-rel-2")
	if err := os.Mkdir(attempt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(attempt, "build")); err != nil {
		t.Fatal(err)
	}
	_, err := d.Prepare(context.Background(), "task-rel-2", &taskwire.Spec{Command: []string{"true"}, WorkingDir: "build/out"})
	var e *Error
	if !errors.As(err, &e) || e.Reason != taskwire.ReasonStartError {
		t.Errorf("Prepare through a symlink out = %v, want a StartError", err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("Prepare wrote outside the attempt's dir: %v", entries)
	}
}

// Artifacts belong to the task's user, and the dirs made for them too.
func TestArtifactsOwnedByTheTask(t *testing.T) {
	requireRoot(t)
	body := []byte("data")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write(body) }))
	defer srv.Close()
	sum := sha256.Sum256(body)
	d := newDriver(t, Options{})
	spec := &taskwire.Spec{RunAsUser: id64(1234), Command: []string{"sh", "-c", "echo more >> in/data && cat in/data"},
		Artifacts: []taskwire.Artifact{{URL: srv.URL, SHA256: hex.EncodeToString(sum[:]), Path: "in/data"}}}
	if r := run(t, d, "task-artown-1", spec); r.Phase != taskwire.PhaseSucceeded || r.Report.OutputTail != "datamore\n" {
		t.Fatalf("the task could not write its artifact: %+v", r)
	}
	for _, p := range []string{"in", "in/data"} {
		if got := owner(t, filepath.Join(d.WorkDir("task-artown-1"), p)); got != "1234:1234" {
			t.Errorf("%s is %s's, want 1234:1234", p, got)
		}
	}
}

// A work root the task user cannot reach fails the attempt saying why.
func TestUnreachableWorkDir(t *testing.T) {
	requireRoot(t)
	d := newDriver(t, Options{WorkDir: filepath.Join(t.TempDir(), "work")}) // t.TempDir's parent is root's, 0700
	_, err := d.Prepare(context.Background(), "task-far-1", &taskwire.Spec{Command: []string{"true"}})
	if err == nil || !strings.Contains(err.Error(), "--work-dir") {
		t.Errorf("Prepare = %v, want an error naming --work-dir", err)
	}
}

func TestLookupUser(t *testing.T) {
	for in, want := range map[string]User{"1234": {1234, 1234}, "1234:99": {1234, 99}, "0": {0, 0}} {
		if got, err := LookupUser(in); err != nil || got != want {
			t.Errorf("LookupUser(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "no-such-user-here", "1:x", "-1", "4294967295"} {
		if u, err := LookupUser(in); err == nil {
			t.Errorf("LookupUser(%q) = %v, want an error", in, u)
		}
	}
}
