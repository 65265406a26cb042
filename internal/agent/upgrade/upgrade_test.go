package upgrade

import (
	"archive/tar"
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
	"github.com/drover-fleet/drover/internal/store"
	"github.com/drover-fleet/drover/internal/testenv"
	"github.com/drover-fleet/drover/internal/testkit"
)

const (
	oldVersion = "v1.0.0"
	newVersion = "v2.0.0"
	versionVar = "-X github.com/drover-fleet/drover/internal/agent/cmd.Version="
	failVar    = "-X github.com/drover-fleet/drover/internal/agent/cmd.failAtStart=true"
	// testTimeout bounds each test's context: builds are cached by testenv,
	// so the flows themselves take seconds.
	testTimeout = 2 * time.Minute
	// shortHealth is the health window of tests where the new agent must fail.
	shortHealth = 300 * time.Millisecond
)

// bin is a real drover-agent build.
type bin struct {
	path, sha string
}

func build(t *testing.T, ldflags ...string) bin {
	t.Helper()
	p := testenv.Binary(t, "./cmd/drover-agent", ldflags...)
	sum, err := fileSHA256(p)
	if err != nil {
		t.Fatal(err)
	}
	return bin{p, sum}
}

var (
	binsOnce sync.Once
	bins     struct{ old, new, broken bin }
)

// agents builds (once per package run) v1.0.0, v2.0.0, and a v2.0.0 that
// exits 1 at start.
func agents(t *testing.T) (old, new, broken bin) {
	t.Helper()
	binsOnce.Do(func() {
		bins.old = build(t, versionVar+oldVersion)
		bins.new = build(t, versionVar+newVersion)
		bins.broken = build(t, versionVar+newVersion, failVar)
	})
	if bins.old.path == "" || bins.new.path == "" || bins.broken.path == "" {
		t.Fatal("agent builds failed in an earlier test")
	}
	return bins.old, bins.new, bins.broken
}

// serve serves files by URL path.
func serve(t *testing.T, files map[string]string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		http.ServeFile(w, r, p)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

type sent struct {
	phase string
	rep   nodejobwire.Report
}

// recorder is a Reporter that keeps what it was sent.
type recorder struct {
	mu   sync.Mutex
	list []sent
}

func (rc *recorder) report(_ context.Context, phase string, r nodejobwire.Report) error {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.list = append(rc.list, sent{phase, r})
	return nil
}

// forUID is the per-uid reporter Resume wants: every uid into rc.
func (rc *recorder) forUID(string) Reporter { return rc.report }

func (rc *recorder) count() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.list)
}

func (rc *recorder) take() []sent {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	l := rc.list
	rc.list = nil
	return l
}

// execCall is one recorded re-exec.
type execCall struct {
	argv0 string
	argv  []string
}

// node is one machine: its installed agent binary, state dir and DB.
type node struct {
	t     *testing.T
	exe   string
	state string
	db    *store.Store
	execs []execCall
	rec   recorder
}

func newNode(t *testing.T, installed bin) *node {
	t.Helper()
	dir := t.TempDir()
	n := &node{t: t, exe: filepath.Join(dir, "bin", "drover-agent"), state: filepath.Join(dir, "state")}
	if err := install(installed.path, n.exe, 0o755); err != nil {
		t.Fatal(err)
	}
	db, err := store.Open(context.Background(), filepath.Join(n.state, "agent.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	n.db = db
	return n
}

// runner is the agent process at version v on n.
func (n *node) runner(v string) *Runner {
	return &Runner{
		StateDir:       n.state,
		Executable:     n.exe,
		CurrentVersion: v,
		DB:             n.db,
		Args:           []string{n.exe, "--hub", "hub:7443"},
		Exec: func(argv0 string, argv, _ []string) error {
			n.execs = append(n.execs, execCall{argv0, argv})
			return nil
		},
		HealthTimeout: time.Minute,
	}
}

// installed returns the sha256 of the binary in place and what it prints
// for --version (run for real).
func (n *node) installed() (sha, version string) {
	n.t.Helper()
	sha, err := fileSHA256(n.exe)
	if err != nil {
		n.t.Fatal(err)
	}
	out, _ := exec.Command(n.exe, "--version").Output()
	return sha, strings.TrimSpace(string(out))
}

func spec(t *testing.T, s nodejobwire.UpgradeSpec) []byte {
	t.Helper()
	if s.Version == "" {
		s.Version = newVersion
	}
	b, err := jsonMarshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// wantReports compares the actions, outcomes and phases of got with want
// ("Check ok Running").
func wantReports(t *testing.T, got []sent, want ...string) {
	t.Helper()
	var g []string
	for _, s := range got {
		res := "failed"
		if s.rep.Success {
			res = "ok"
		}
		if s.rep.Running {
			res = "waiting"
		}
		g = append(g, s.rep.Action+" "+res+" "+s.phase)
	}
	if strings.Join(g, "; ") != strings.Join(want, "; ") {
		t.Errorf("reports = %q\nwant      %q", g, want)
		for _, s := range got {
			t.Logf("  %s: %+v", s.phase, s.rep)
		}
	}
}

func TestUpgradeSwapsRestartsAndConfirms(t *testing.T) {
	old, new, _ := agents(t)
	ctx := testCtx(t)
	url := serve(t, map[string]string{"/drover-agent": new.path})
	n := newNode(t, old)

	phase, reason := n.runner(oldVersion).Run(ctx, "job-1", spec(t, nodejobwire.UpgradeSpec{URL: url + "/drover-agent", SHA256: new.sha}), n.rec.report)
	if phase != nodejobwire.PhaseRunning || reason != "restarting as "+newVersion {
		t.Fatalf("Run() = %s, %q; want Running, restarting as %s", phase, reason, newVersion)
	}
	wantReports(t, n.rec.take(), "Check ok Running", "BackUp ok Running")
	if len(n.execs) != 1 || n.execs[0].argv0 != n.exe || strings.Join(n.execs[0].argv, " ") != n.exe+" --hub hub:7443" {
		t.Fatalf("exec calls = %+v, want one of %s with the same argv", n.execs, n.exe)
	}
	if sha, v := n.installed(); sha != new.sha || v != newVersion {
		t.Fatalf("installed binary = %s (prints %q), want the new one", sha, v)
	}
	backup := filepath.Join(n.state, "backup", "drover-agent-"+oldVersion)
	if sha, _ := fileSHA256(backup); sha != old.sha {
		t.Errorf("backup %s has sha %s, want the old binary's", backup, sha)
	}

	// The new process starts: Resume finds the pending upgrade, waits for
	// the hub connection, and ends the nodejobwire.
	r2 := n.runner(newVersion)
	r2.Connected = func(context.Context) error { return nil }
	if uids, _ := r2.Interrupted(ctx); len(uids) != 1 || uids[0] != "job-1" {
		t.Fatalf("Interrupted() = %v, want [job-1]", uids)
	}
	res, err := r2.Resume(ctx, n.rec.forUID)
	if err != nil || len(res) != 1 || res[0] != (Result{"job-1", nodejobwire.PhaseSucceeded, "upgraded from v1.0.0 to v2.0.0"}) {
		t.Fatalf("Resume() = %+v, %v; want job-1 Succeeded", res, err)
	}
	got := n.rec.take()
	wantReports(t, got, "Upgrade ok Succeeded")
	if got[0].rep.CurrentVersion != newVersion || got[0].rep.HistoricVersion != oldVersion {
		t.Errorf("Upgrade report versions = %q from %q, want %s from %s", got[0].rep.CurrentVersion, got[0].rep.HistoricVersion, newVersion, oldVersion)
	}

	// Idempotent: nothing pending, and a re-run only returns the end.
	if res, _ := r2.Resume(ctx, n.rec.forUID); len(res) != 0 {
		t.Errorf("second Resume() = %+v, want nothing", res)
	}
	phase, _ = r2.Run(ctx, "job-1", spec(t, nodejobwire.UpgradeSpec{URL: url + "/drover-agent", SHA256: new.sha}), n.rec.report)
	if phase != nodejobwire.PhaseSucceeded || len(n.rec.take()) != 0 || len(n.execs) != 1 {
		t.Errorf("Run() after the end = %s, want Succeeded with no new report or exec", phase)
	}
}

func TestUpgradeFailuresBeforeTheSwapRollBack(t *testing.T) {
	old, new, broken := agents(t)
	url := serve(t, map[string]string{"/new": new.path, "/broken": broken.path})
	tests := []struct {
		name       string
		s          nodejobwire.UpgradeSpec
		wantReason []string // in the flow's reason
	}{
		{"digest mismatch", nodejobwire.UpgradeSpec{URL: url + "/new", SHA256: old.sha},
			[]string{"digest mismatch: want " + old.sha + " got " + new.sha}},
		{"binary that cannot start", nodejobwire.UpgradeSpec{URL: url + "/broken", SHA256: broken.sha},
			[]string{"probe v2.0.0", "exit status 1", "cannot start"}},
		{"download not found", nodejobwire.UpgradeSpec{URL: url + "/nowhere", SHA256: new.sha},
			[]string{"download v2.0.0 from " + url + "/nowhere: HTTP 404"}},
		{"binary of another version", nodejobwire.UpgradeSpec{Version: "v3.0.0", URL: url + "/new", SHA256: new.sha},
			[]string{`probe v3.0.0`, `printed "v2.0.0"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testCtx(t)
			n := newNode(t, old)
			phase, reason := n.runner(oldVersion).Run(ctx, "job", spec(t, tt.s), n.rec.report)
			ver := tt.s.Version
			if ver == "" {
				ver = newVersion
			}
			want := append([]string{"upgrade to " + ver + " failed: "}, tt.wantReason...)
			want = append(want, "; rolled back to v1.0.0")
			if phase != nodejobwire.PhaseFailed {
				t.Errorf("Run() phase = %s, want Failed", phase)
			}
			for _, w := range want {
				if !strings.Contains(reason, w) {
					t.Errorf("Run() reason = %q, want it to contain %q", reason, w)
				}
			}
			got := n.rec.take()
			wantReports(t, got, "Check ok Running", "BackUp ok Running", "Upgrade failed Running", "RollBack ok Failed")
			if len(got) == 4 && got[3].rep.CurrentVersion != oldVersion {
				t.Errorf("RollBack report current version = %q, want %s", got[3].rep.CurrentVersion, oldVersion)
			}
			if sha, v := n.installed(); sha != old.sha || v != oldVersion {
				t.Errorf("installed binary = %s (prints %q), want the old one untouched", sha, v)
			}
			if len(n.execs) != 0 {
				t.Errorf("exec calls = %+v, want none", n.execs)
			}
		})
	}
}

func TestUnhealthyNewVersionRollsBackAndRestartsTheOld(t *testing.T) {
	old, new, _ := agents(t)
	ctx := testCtx(t)
	url := serve(t, map[string]string{"/new": new.path})
	n := newNode(t, old)
	r1 := n.runner(oldVersion)
	r1.HealthTimeout = shortHealth
	if phase, _ := r1.Run(ctx, "job", spec(t, nodejobwire.UpgradeSpec{URL: url + "/new", SHA256: new.sha}), n.rec.report); phase != nodejobwire.PhaseRunning {
		t.Fatalf("Run() = %s, want Running (restarting)", phase)
	}
	n.rec.take()

	// The new process never reaches a hub.
	r2 := n.runner(newVersion)
	r2.HealthTimeout = shortHealth
	r2.Connected = func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	began := time.Now()
	res, err := r2.Resume(ctx, n.rec.forUID)
	if err != nil || len(res) != 1 || res[0].Phase != nodejobwire.PhaseRunning || res[0].Reason != "restarting as v1.0.0" {
		t.Fatalf("Resume() as the new version = %+v, %v; want Running, restarting as v1.0.0", res, err)
	}
	if d := time.Since(began); d > shortHealth+5*time.Second {
		t.Errorf("Resume() took %s, want about the health timeout %s", d, shortHealth)
	}
	wantReports(t, n.rec.take(), "Upgrade failed Running")
	if len(n.execs) != 2 || n.execs[1].argv0 != n.exe {
		t.Fatalf("exec calls = %+v, want a second one of %s", n.execs, n.exe)
	}
	if sha, v := n.installed(); sha != old.sha || v != oldVersion {
		t.Fatalf("installed binary after the rollback = %s (prints %q), want the old one", sha, v)
	}

	// The old process starts again and ends the nodejobwire.
	r3 := n.runner(oldVersion)
	res, err = r3.Resume(ctx, n.rec.forUID)
	want := "upgrade to v2.0.0 failed: v2.0.0 did not connect to a hub within 300ms: context deadline exceeded; rolled back to v1.0.0"
	if err != nil || len(res) != 1 || res[0] != (Result{"job", nodejobwire.PhaseFailed, want}) {
		t.Fatalf("Resume() as the old version = %+v, %v; want Failed, %q", res, err, want)
	}
	got := n.rec.take()
	wantReports(t, got, "RollBack ok Failed")
	if len(got) == 1 && (got[0].rep.CurrentVersion != oldVersion || got[0].rep.Reason != want) {
		t.Errorf("RollBack report = %+v, want current version %s and reason %q", got[0].rep, oldVersion, want)
	}
	if len(n.execs) != 2 {
		t.Errorf("exec calls = %d, want no third", len(n.execs))
	}
}

// testConfirmPoll keeps Confirm's DB polling fast.
const testConfirmPoll = 20 * time.Millisecond

// waitFor waits until cond holds, what being what it waits for.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testkit.Eventually(t, testTimeout, func() string {
		if !cond() {
			return "still waiting: " + what
		}
		return ""
	})
}

func TestConfirmationHoldsTheFlow(t *testing.T) {
	old, new, _ := agents(t)
	ctx := testCtx(t)
	url := serve(t, map[string]string{"/new": new.path})
	n := newNode(t, old)
	r := n.runner(oldVersion)
	r.ConfirmPoll = testConfirmPoll
	s := spec(t, nodejobwire.UpgradeSpec{URL: url + "/new", SHA256: new.sha, RequireConfirmation: true})
	if _, err := n.db.PutWork(ctx, store.Work{UID: "job", Type: nodejobwire.TypeUpgrade, Spec: s}); err != nil {
		t.Fatal(err)
	}

	// The agent stops while the job waits: no end is recorded, and a
	// waiting flow is not a crash for Resume.
	stopCtx, stop := context.WithCancel(ctx)
	type ran struct{ phase, reason string }
	done := make(chan ran, 1)
	go func() { p, why := r.Run(stopCtx, "job", s, n.rec.report); done <- ran{p, why} }()
	waitFor(t, "the waiting report", func() bool { return n.rec.count() == 2 })
	stop()
	if got := <-done; got.phase != nodejobwire.PhaseFailed || got.reason != "Confirm interrupted: context canceled" {
		t.Fatalf("Run(stopped while waiting) = %+v, want Failed, Confirm interrupted", got)
	}
	wantReports(t, n.rec.take(), "Check ok Running", "Confirm waiting Running")
	if uids, _ := r.Interrupted(ctx); len(uids) != 0 {
		t.Errorf("Interrupted() while waiting = %v, want none (waiting is not a crash)", uids)
	}

	// Run again: it waits again (Check is not repeated) until the hub's
	// confirmation item is stored.
	go func() { p, why := r.Run(ctx, "job", s, n.rec.report); done <- ran{p, why} }()
	waitFor(t, "the second waiting report", func() bool { return n.rec.count() == 1 })
	select {
	case got := <-done:
		t.Fatalf("Run() = %+v before the confirmation, want it to wait", got)
	case <-time.After(5 * testConfirmPoll):
	}
	if _, err := n.db.PutWork(ctx, store.Work{UID: nodejobwire.ConfirmUID("job"), Type: nodejobwire.TypeConfirm, Spec: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	if got := <-done; got.phase != nodejobwire.PhaseRunning || len(n.execs) != 1 {
		t.Fatalf("Run(confirmed) = %+v with %d execs, want Running after one exec", got, len(n.execs))
	}
	wantReports(t, n.rec.take(), "Confirm waiting Running", "Confirm ok Running", "BackUp ok Running")
}

func TestConfirmationTimesOut(t *testing.T) {
	old, new, _ := agents(t)
	ctx := testCtx(t)
	n := newNode(t, old)
	r := n.runner(oldVersion)
	r.ConfirmPoll, r.ConfirmTimeout = testConfirmPoll, 5*testConfirmPoll
	phase, reason := r.Run(ctx, "job", spec(t, nodejobwire.UpgradeSpec{URL: "http://example.invalid/a", SHA256: new.sha, RequireConfirmation: true}), n.rec.report)
	if phase != nodejobwire.PhaseFailed || reason != "not confirmed within 100ms" {
		t.Fatalf("Run() = %s, %q; want Failed, not confirmed within 100ms", phase, reason)
	}
	wantReports(t, n.rec.take(), "Check ok Running", "Confirm waiting Running", "Confirm failed Failed")
	if sha, _ := n.installed(); sha != old.sha {
		t.Error("the installed binary changed")
	}
}

func TestUpgradeFromAnOCIArtifact(t *testing.T) {
	old, new, _ := agents(t)
	// A registry that wants alice's password for every request.
	inner := registry.New()
	reg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "alice" || p != "s3cret" {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(reg.Close)
	host := strings.TrimPrefix(reg.URL, "http://")
	alice := map[string]nodejobwire.Credential{host: {Username: "alice", Password: "s3cret"}}
	content, err := os.ReadFile(new.path)
	if err != nil {
		t.Fatal(err)
	}
	var tarred bytes.Buffer
	tw := tar.NewWriter(&tarred)
	_ = tw.WriteHeader(&tar.Header{Name: "drover-agent", Mode: 0o755, Size: int64(len(content)), Typeflag: tar.TypeReg})
	_, _ = tw.Write(content)
	_ = tw.Close()
	push := func(repo string, layer []byte) string {
		img, err := mutate.AppendLayers(empty.Image, static.NewLayer(layer, types.OCILayer))
		if err != nil {
			t.Fatal(err)
		}
		ref, err := name.ParseReference(host + "/" + repo + ":" + newVersion)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(ref, img, remote.WithAuth(&authn.Basic{Username: "alice", Password: "s3cret"})); err != nil {
			t.Fatal(err)
		}
		return ref.String()
	}
	raw, tarOfOne := push("agent-raw", content), push("agent-tar", tarred.Bytes())
	tests := []struct {
		name, image string
		auth        map[string]nodejobwire.Credential
		wantReason  string // "" = the upgrade goes on (Running, restarting)
	}{
		{"raw binary layer", raw, alice, ""},
		{"tar of one file", tarOfOne, alice, ""},
		{"no credentials for the registry", raw, nil,
			"registry " + host + " requires credentials (401 Unauthorized); the job gives none for it"},
		{"credentials of another registry only", raw, map[string]nodejobwire.Credential{"elsewhere.example:5000": {Username: "alice", Password: "s3cret"}},
			"registry " + host + " requires credentials (401 Unauthorized); the job gives none for it"},
		{"wrong password", raw, map[string]nodejobwire.Credential{host: {Username: "alice", Password: "nope"}},
			"registry " + host + ` refused the credentials of user "alice" (401 Unauthorized)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testCtx(t)
			n := newNode(t, old)
			phase, reason := n.runner(oldVersion).Run(ctx, "job", spec(t, nodejobwire.UpgradeSpec{Image: tt.image, SHA256: new.sha, Auth: tt.auth}), n.rec.report)
			if tt.wantReason != "" {
				if phase != nodejobwire.PhaseFailed || !strings.Contains(reason, tt.wantReason) || !strings.Contains(reason, "rolled back to "+oldVersion) {
					t.Errorf("Run(%s) = %s, %q; want Failed, rolled back, with %q", tt.image, phase, reason, tt.wantReason)
				}
				if sha, _ := n.installed(); sha != old.sha {
					t.Errorf("installed binary = %s, want the old one %s untouched", sha, old.sha)
				}
				return
			}
			if phase != nodejobwire.PhaseRunning {
				t.Fatalf("Run(%s) = %s, %q; want Running (restarting)", tt.image, phase, reason)
			}
			if sha, _ := n.installed(); sha != new.sha {
				t.Errorf("installed binary = %s, want the new one %s", sha, new.sha)
			}
		})
	}
}

// TestResumeAfterACrash leaves the DB and files as a crash at each point
// would, then starts the agent again.
func TestResumeAfterACrash(t *testing.T) {
	old, new, _ := agents(t)
	ctx := testCtx(t)
	tests := []struct {
		name string
		// running is the version the restarted agent runs; installed is
		// what the crash left in place.
		running   string
		installed bin
		rows      func(n *node, backup string) []store.Action
		want      Result
		reports   []string
	}{
		{
			name: "during the download", running: oldVersion, installed: old,
			rows: func(n *node, backup string) []store.Action {
				p := pending{From: oldVersion, To: newVersion, Backup: backup, Executable: n.exe}
				q := p
				q.Stage = stageDownload
				return []store.Action{
					{Action: nodejobwire.Check, State: store.ActionSucceeded, Reported: true},
					{Action: nodejobwire.BackUp, State: store.ActionSucceeded, Reported: true, Data: p.encode()},
					{Action: nodejobwire.Upgrade, State: store.ActionRunning, Data: q.encode()},
				}
			},
			want:    Result{"job", nodejobwire.PhaseFailed, "upgrade to v2.0.0 failed: the agent restarted during the upgrade to v2.0.0, before the new binary was in place; rolled back to v1.0.0"},
			reports: []string{"Upgrade failed Running", "RollBack ok Failed"},
		},
		{
			name: "after recording the swap, before the rename", running: oldVersion, installed: old,
			rows: func(n *node, backup string) []store.Action {
				p := pending{Stage: stageSwapped, From: oldVersion, To: newVersion, Backup: backup, Executable: n.exe, Deadline: time.Now().Add(time.Minute)}
				return []store.Action{
					{Action: nodejobwire.Check, State: store.ActionSucceeded, Reported: true},
					{Action: nodejobwire.BackUp, State: store.ActionSucceeded, Reported: true},
					{Action: nodejobwire.Upgrade, State: store.ActionRunning, Data: p.encode()},
				}
			},
			want:    Result{"job", nodejobwire.PhaseFailed, "upgrade to v2.0.0 failed: the agent restarted as v1.0.0, not v2.0.0; rolled back to v1.0.0"},
			reports: []string{"Upgrade failed Running", "RollBack ok Failed"},
		},
		{
			name: "after the swap, past the health deadline", running: newVersion, installed: new,
			rows: func(n *node, backup string) []store.Action {
				p := pending{Stage: stageSwapped, From: oldVersion, To: newVersion, Backup: backup, Executable: n.exe, Deadline: time.Now().Add(-time.Minute)}
				return []store.Action{
					{Action: nodejobwire.Check, State: store.ActionSucceeded, Reported: true},
					{Action: nodejobwire.BackUp, State: store.ActionSucceeded, Reported: true},
					{Action: nodejobwire.Upgrade, State: store.ActionRunning, Data: p.encode()},
				}
			},
			want:    Result{"job", nodejobwire.PhaseRunning, "restarting as v1.0.0"},
			reports: []string{"Upgrade failed Running"},
		},
		{
			name: "after the Upgrade ended, before its report", running: newVersion, installed: new,
			rows: func(n *node, backup string) []store.Action {
				p := pending{Stage: stageSwapped, From: oldVersion, To: newVersion, Backup: backup, Executable: n.exe}
				return []store.Action{
					{Action: nodejobwire.Check, State: store.ActionSucceeded, Reported: true},
					{Action: nodejobwire.BackUp, State: store.ActionSucceeded, Reported: true},
					{Action: nodejobwire.Upgrade, State: store.ActionSucceeded, Reason: "upgraded from v1.0.0 to v2.0.0", Data: p.encode()},
				}
			},
			// Not interrupted (nothing Running): the core's Run call ends it.
			want:    Result{},
			reports: nil,
		},
		{
			name: "during the Check", running: oldVersion, installed: old,
			rows: func(n *node, backup string) []store.Action {
				return []store.Action{{Action: nodejobwire.Check, State: store.ActionRunning}}
			},
			want:    Result{"job", nodejobwire.PhaseFailed, "the agent restarted during this action"},
			reports: []string{"Check failed Failed"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newNode(t, tt.installed)
			backup := filepath.Join(n.state, "backup", "drover-agent-"+oldVersion)
			if err := install(old.path, backup, 0o755); err != nil {
				t.Fatal(err)
			}
			if _, err := n.db.PutWork(ctx, store.Work{UID: "job", Type: nodejobwire.TypeUpgrade, Spec: []byte(`{}`)}); err != nil {
				t.Fatal(err)
			}
			for _, a := range tt.rows(n, backup) {
				a.UID = "job"
				if err := n.db.SetAction(ctx, a); err != nil {
					t.Fatal(err)
				}
			}
			r := n.runner(tt.running)
			r.Connected = func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
			res, err := r.Resume(ctx, n.rec.forUID)
			if err != nil {
				t.Fatal(err)
			}
			if tt.want == (Result{}) {
				if len(res) != 0 {
					t.Errorf("Resume() = %+v, want nothing", res)
				}
			} else if len(res) != 1 || res[0] != tt.want {
				t.Errorf("Resume() = %+v\nwant %+v", res, tt.want)
			}
			wantReports(t, n.rec.take(), tt.reports...)
			if sha, _ := n.installed(); sha != old.sha && tt.want.Reason != "" {
				t.Errorf("installed binary = %s, want the old one (rolled back)", sha)
			}
		})
	}

	t.Run("a lost report is sent again, once, by the next Run", func(t *testing.T) {
		n := newNode(t, new)
		must := func(err error) {
			if err != nil {
				t.Fatal(err)
			}
		}
		p := pending{Stage: stageSwapped, From: oldVersion, To: newVersion}
		must(n.db.SetAction(ctx, store.Action{UID: "job", Action: nodejobwire.Check, State: store.ActionSucceeded, Reported: true}))
		must(n.db.SetAction(ctx, store.Action{UID: "job", Action: nodejobwire.BackUp, State: store.ActionSucceeded, Reported: true}))
		must(n.db.SetAction(ctx, store.Action{UID: "job", Action: nodejobwire.Upgrade, State: store.ActionSucceeded, Reason: "upgraded from v1.0.0 to v2.0.0", Data: p.encode()}))
		r := n.runner(newVersion)
		s := spec(t, nodejobwire.UpgradeSpec{URL: "http://example.invalid/a", SHA256: new.sha})
		for range 2 {
			if phase, reason := r.Run(ctx, "job", s, n.rec.report); phase != nodejobwire.PhaseSucceeded || reason != "upgraded from v1.0.0 to v2.0.0" {
				t.Fatalf("Run() = %s, %q; want Succeeded", phase, reason)
			}
		}
		wantReports(t, n.rec.take(), "Upgrade ok Succeeded")
	})
}

func TestInvalidSpecOrFailedCheckChangesNothing(t *testing.T) {
	old, _, _ := agents(t)
	tests := []struct {
		name string
		spec []byte
		want string
	}{
		{"invalid spec", []byte(`{"version":"1.0; rm -rf /","url":"http://x/a","sha256":"00"}`), "invalid spec: upgrade spec: version"},
		{"disk check over a 1% limit", spec(t, nodejobwire.UpgradeSpec{URL: "http://x/a", SHA256: strings.Repeat("0", 64),
			Checks: nodejobwire.Checks{Items: []string{"disk"}, DiskPercent: 1}}), "check disk: usage"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testCtx(t)
			n := newNode(t, old)
			r := n.runner(oldVersion)
			phase, reason := r.Run(ctx, "job", tt.spec, n.rec.report)
			if phase != nodejobwire.PhaseFailed || !strings.Contains(reason, tt.want) {
				t.Errorf("Run() = %s, %q; want Failed containing %q", phase, reason, tt.want)
			}
			wantReports(t, n.rec.take(), "Check failed Failed")
			if sha, _ := n.installed(); sha != old.sha {
				t.Error("the installed binary changed")
			}
		})
	}
}

func TestFileSafe(t *testing.T) {
	for in, want := range map[string]string{"v1.2.3-rc.1+b": "v1.2.3-rc.1+b", "../x y": ".._x_y", "dev": "dev"} {
		if got := fileSafe(in); got != want {
			t.Errorf("fileSafe(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestInterruptedDownloadRollsBackAtTheNextStart(t *testing.T) {
	old, new, _ := agents(t)
	ctx := testCtx(t)
	started := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100000000")
		_, _ = w.Write([]byte("partial"))
		w.(http.Flusher).Flush()
		close(started)
		<-r.Context().Done() // hold the download until the client gives up
	}))
	t.Cleanup(srv.Close)
	n := newNode(t, old)
	runCtx, stop := context.WithCancel(ctx)
	go func() {
		select {
		case <-started:
		case <-ctx.Done():
		}
		stop() // the agent is told to stop mid-download
	}()
	phase, reason := n.runner(oldVersion).Run(runCtx, "job", spec(t, nodejobwire.UpgradeSpec{URL: srv.URL + "/a", SHA256: new.sha}), n.rec.report)
	if phase != nodejobwire.PhaseFailed || reason != "Upgrade interrupted: context canceled" {
		t.Fatalf("Run(stopped mid-download) = %s, %q; want Failed, Upgrade interrupted", phase, reason)
	}
	wantReports(t, n.rec.take(), "Check ok Running", "BackUp ok Running")

	res, err := n.runner(oldVersion).Resume(ctx, n.rec.forUID)
	want := "upgrade to v2.0.0 failed: the agent restarted during the upgrade to v2.0.0, before the new binary was in place; rolled back to v1.0.0"
	if err != nil || len(res) != 1 || res[0] != (Result{"job", nodejobwire.PhaseFailed, want}) {
		t.Fatalf("Resume() = %+v, %v; want Failed, %q", res, err, want)
	}
	wantReports(t, n.rec.take(), "Upgrade failed Running", "RollBack ok Failed")
	if sha, _ := n.installed(); sha != old.sha {
		t.Error("the installed binary changed")
	}
	if _, err := os.Stat(filepath.Join(n.state, "download", "drover-agent-"+newVersion)); !os.IsNotExist(err) {
		t.Errorf("the partial download is still there (stat: %v)", err)
	}
}

// TestResumeItem is the agent core's view: one item found Running at start.
func TestResumeItem(t *testing.T) {
	old, _, _ := agents(t)
	ctx := testCtx(t)
	n := newNode(t, old)
	backup := filepath.Join(n.state, "backup", "drover-agent-"+oldVersion)
	if err := install(old.path, backup, 0o755); err != nil {
		t.Fatal(err)
	}
	p := pending{Stage: stageDownload, From: oldVersion, To: newVersion, Backup: backup, Executable: n.exe}
	rows := []store.Action{
		{UID: "waiting", Action: nodejobwire.Check, State: store.ActionSucceeded, Reported: true},
		{UID: "waiting", Action: nodejobwire.Confirm, State: store.ActionRunning},
		{UID: "cut", Action: nodejobwire.Check, State: store.ActionSucceeded, Reported: true},
		{UID: "cut", Action: nodejobwire.BackUp, State: store.ActionSucceeded, Reported: true, Data: p.encode()},
		{UID: "cut", Action: nodejobwire.Upgrade, State: store.ActionRunning, Data: p.encode()},
	}
	for _, a := range rows {
		if err := n.db.SetAction(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	r := n.runner(oldVersion)
	tests := []struct {
		uid, phase, reason string
		reports            []string
	}{
		{"waiting", nodejobwire.PhaseFailed, "the agent restarted while the upgrade was running, before it changed anything", nil},
		{"never-started", nodejobwire.PhaseFailed, "the agent restarted while the upgrade was running, before it changed anything", nil},
		{"cut", nodejobwire.PhaseFailed, "upgrade to v2.0.0 failed: the agent restarted during the upgrade to v2.0.0, before the new binary was in place; rolled back to v1.0.0",
			[]string{"Upgrade failed Running", "RollBack ok Failed"}},
	}
	for _, tt := range tests {
		phase, reason := r.ResumeItem(ctx, tt.uid, n.rec.report)
		if phase != tt.phase || reason != tt.reason {
			t.Errorf("ResumeItem(%s) = %s, %q; want %s, %q", tt.uid, phase, reason, tt.phase, tt.reason)
		}
		wantReports(t, n.rec.take(), tt.reports...)
	}
}
