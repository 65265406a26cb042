package prepull

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
	"github.com/drover-fleet/drover/internal/store"
)

// testTimeout bounds each test: pulls from an in-process registry take
// milliseconds.
const testTimeout = time.Minute

// testBackoff keeps retries fast.
const testBackoff = 10 * time.Millisecond

// reg is an in-process registry, optionally behind basic auth and with
// manifest GETs that fail a number of times first.
type reg struct {
	host       string
	user, pass string
	failGets   atomic.Int32 // manifest GETs to answer 503 before serving
	gets       atomic.Int32 // manifest GETs seen
}

func newReg(t *testing.T, user, pass string) *reg {
	t.Helper()
	g := &reg{user: user, pass: pass}
	inner := registry.New()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g.user != "" {
			u, p, ok := r.BasicAuth()
			if !ok || u != g.user || p != g.pass {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
				return
			}
		}
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/manifests/") {
			g.gets.Add(1)
			if g.failGets.Add(-1) >= 0 {
				http.Error(w, "try later", http.StatusServiceUnavailable)
				return
			}
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	g.host = strings.TrimPrefix(srv.URL, "http://")
	return g
}

// push puts a random image at repo:tag and returns its reference.
func (g *reg) push(t *testing.T, repo string) string {
	t.Helper()
	img, err := random.Image(512, 2)
	if err != nil {
		t.Fatal(err)
	}
	ref := g.host + "/" + repo + ":v1"
	n, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	auth := authn.Anonymous
	if g.user != "" {
		auth = authn.FromConfig(authn.AuthConfig{Username: g.user, Password: g.pass})
	}
	if err := remote.Write(n, img, remote.WithAuth(auth)); err != nil {
		t.Fatal(err)
	}
	return ref
}

type sent struct {
	phase string
	rep   nodejobwire.Report
}

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

func newRunner(t *testing.T) *Runner {
	t.Helper()
	dir := t.TempDir()
	db, err := store.Open(context.Background(), filepath.Join(dir, "agent.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return &Runner{StoreDir: filepath.Join(dir, "images"), DB: db, Backoff: testBackoff}
}

func specJSON(t *testing.T, s nodejobwire.PrePullSpec) []byte {
	t.Helper()
	s.Job = "j"
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// stored lists the references in the layout's index.
func stored(t *testing.T, dir string) []string {
	t.Helper()
	lp, err := layout.FromPath(dir)
	if err != nil {
		return nil
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var refs []string
	for _, d := range m.Manifests {
		refs = append(refs, d.Annotations[refAnnotation])
	}
	return refs
}

func TestPrePull(t *testing.T) {
	open := newReg(t, "", "")
	a, b := open.push(t, "app/a"), open.push(t, "app/b")
	locked := newReg(t, "alice", "s3cret")
	c := locked.push(t, "private/c")

	tests := []struct {
		name       string
		s          nodejobwire.PrePullSpec
		failGets   int32
		wantPhase  string
		wantOK     []bool   // per image
		wantReason []string // in the flow's reason
		wantStored []string
		wantGets   int32 // manifest GETs on open, when > 0
	}{
		{name: "two images", s: nodejobwire.PrePullSpec{Images: []string{a, b}},
			wantPhase: nodejobwire.PhaseSucceeded, wantOK: []bool{true, true}, wantReason: []string{"pulled 2 images"}, wantStored: []string{a, b}},
		{name: "a missing image fails the pull, not the others", s: nodejobwire.PrePullSpec{Images: []string{a, open.host + "/app/missing:v1"}, RetryTimes: 3},
			wantPhase: nodejobwire.PhaseFailed, wantOK: []bool{true, false},
			wantReason: []string{"1 of 2 images failed: " + open.host + "/app/missing:v1: not found"}, wantStored: []string{a},
			wantGets: 2}, // the missing image is not retried
		{name: "credentials from the spec", s: nodejobwire.PrePullSpec{Images: []string{c},
			Auth: map[string]nodejobwire.Credential{locked.host: {Username: "alice", Password: "s3cret"}}},
			wantPhase: nodejobwire.PhaseSucceeded, wantOK: []bool{true}, wantStored: []string{c}},
		{name: "a wrong password", s: nodejobwire.PrePullSpec{Images: []string{c}, RetryTimes: 2,
			Auth: map[string]nodejobwire.Credential{locked.host: {Username: "alice", Password: "wrong"}}},
			wantPhase: nodejobwire.PhaseFailed, wantOK: []bool{false},
			wantReason: []string{"registry " + locked.host + ` refused the credentials of user "alice" (401 Unauthorized)`}},
		{name: "no credentials", s: nodejobwire.PrePullSpec{Images: []string{c}},
			wantPhase: nodejobwire.PhaseFailed, wantOK: []bool{false},
			wantReason: []string{"registry " + locked.host + " requires credentials (401 Unauthorized); the job gives none for it"}},
		{name: "retries outlast a flaky registry", s: nodejobwire.PrePullSpec{Images: []string{a}, RetryTimes: 2}, failGets: 2,
			wantPhase: nodejobwire.PhaseSucceeded, wantOK: []bool{true}, wantStored: []string{a}, wantGets: 3},
		{name: "too few retries", s: nodejobwire.PrePullSpec{Images: []string{a}, RetryTimes: 1}, failGets: 2,
			wantPhase: nodejobwire.PhaseFailed, wantOK: []bool{false}, wantReason: []string{"503 Service Unavailable", "(after 2 attempts)"}, wantGets: 2},
		{name: "an invalid spec", s: nodejobwire.PrePullSpec{Images: []string{"a;b"}},
			wantPhase: nodejobwire.PhaseFailed, wantReason: []string{"invalid spec: pre-pull spec: image \"a;b\""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			open.failGets.Store(tt.failGets)
			open.gets.Store(0)
			r := newRunner(t)
			var rec recorder
			phase, reason := r.Run(ctx, "uid", specJSON(t, tt.s), rec.report)
			if phase != tt.wantPhase {
				t.Errorf("Run() = %s, %q; want %s", phase, reason, tt.wantPhase)
			}
			for _, w := range tt.wantReason {
				if !strings.Contains(reason, w) {
					t.Errorf("Run() reason = %q, want it to contain %q", reason, w)
				}
			}
			if tt.wantGets > 0 {
				if got := open.gets.Load(); got != tt.wantGets {
					t.Errorf("manifest GETs = %d, want %d", got, tt.wantGets)
				}
			}
			if tt.wantOK == nil { // the Check failed
				if len(rec.list) != 1 || rec.list[0].rep.Action != nodejobwire.Check || rec.list[0].rep.Success {
					t.Errorf("reports = %+v, want one failed Check", rec.list)
				}
				return
			}
			if len(rec.list) != 2 || rec.list[0].rep.Action != nodejobwire.Check || !rec.list[0].rep.Success || rec.list[0].phase != nodejobwire.PhaseRunning {
				t.Fatalf("reports = %+v, want Check succeeded (Running) then Pull", rec.list)
			}
			pull := rec.list[1]
			if pull.rep.Action != nodejobwire.Pull || pull.phase != tt.wantPhase || pull.rep.Success != (tt.wantPhase == nodejobwire.PhaseSucceeded) {
				t.Errorf("Pull report = %s %+v, want phase %s", pull.phase, pull.rep, tt.wantPhase)
			}
			if len(pull.rep.Images) != len(tt.wantOK) {
				t.Fatalf("Pull report images = %+v, want %d", pull.rep.Images, len(tt.wantOK))
			}
			for i, ok := range tt.wantOK {
				im := pull.rep.Images[i]
				if im.Image != tt.s.Images[i] || im.Success != ok || (ok != (im.Reason == "")) {
					t.Errorf("image %d = %+v, want %s success=%v with a reason iff failed", i, im, tt.s.Images[i], ok)
				}
			}
			if got := stored(t, r.StoreDir); strings.Join(got, " ") != strings.Join(tt.wantStored, " ") {
				t.Errorf("image store holds %q, want %q", got, tt.wantStored)
			}
			if strings.Contains(reason, "s3cret") || strings.Contains(reason, "wrong") {
				t.Errorf("reason %q leaks a password", reason)
			}
		})
	}
}

func TestRunAgainRepeatsNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	g := newReg(t, "", "")
	a := g.push(t, "app/a")
	r := newRunner(t)
	var rec recorder
	spec := specJSON(t, nodejobwire.PrePullSpec{Images: []string{a}})
	if phase, _ := r.Run(ctx, "uid", spec, rec.report); phase != nodejobwire.PhaseSucceeded {
		t.Fatalf("Run() = %s, want Succeeded", phase)
	}
	g.gets.Store(0)
	if phase, reason := r.Run(ctx, "uid", spec, rec.report); phase != nodejobwire.PhaseSucceeded || reason != "pulled 1 images" {
		t.Fatalf("second Run() = %s, %q; want Succeeded", phase, reason)
	}
	if n := g.gets.Load(); n != 0 || len(rec.list) != 2 {
		t.Errorf("second Run() made %d manifest GETs and left %d reports, want 0 and 2", n, len(rec.list))
	}

	// An interrupted Pull (Running in the DB) runs again; the layout keeps
	// one entry for the image.
	if err := r.DB.SetAction(ctx, store.Action{UID: "uid2", Action: nodejobwire.Check, State: store.ActionSucceeded, Reported: true}); err != nil {
		t.Fatal(err)
	}
	if err := r.DB.SetAction(ctx, store.Action{UID: "uid2", Action: nodejobwire.Pull, State: store.ActionRunning}); err != nil {
		t.Fatal(err)
	}
	if phase, _ := r.Run(ctx, "uid2", spec, rec.report); phase != nodejobwire.PhaseSucceeded {
		t.Fatalf("Run() after an interrupted Pull = %s, want Succeeded", phase)
	}
	if got := stored(t, r.StoreDir); len(got) != 1 {
		t.Errorf("image store holds %q, want the image once", got)
	}
	if len(rec.list) != 3 || rec.list[2].rep.Action != nodejobwire.Pull {
		t.Errorf("reports = %+v, want only the resumed Pull added", rec.list)
	}
}

// TestImportAfterPull: with a container runtime, each image pulled into the
// store is handed on to it (drover-containerd import, whose own test runs a
// real containerd); a failing import fails that image's attempt, is
// retried with it, and is reported.
func TestImportAfterPull(t *testing.T) {
	open := newReg(t, "", "")
	a, b := open.push(t, "app/a"), open.push(t, "app/b")
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	r := newRunner(t)
	var mu sync.Mutex
	var imported []string
	fails := map[string]int{b: 1} // b's first import fails
	r.Import = func(_ context.Context, image string) error {
		mu.Lock()
		defer mu.Unlock()
		if fails[image] > 0 {
			fails[image]--
			return errors.New("containerd is restarting")
		}
		if l := stored(t, r.StoreDir); !slices.Contains(l, image) {
			return fmt.Errorf("import of %s before it is in the store (%v)", image, l)
		}
		imported = append(imported, image)
		return nil
	}
	var rec recorder
	phase, reason := r.Run(ctx, "uid", specJSON(t, nodejobwire.PrePullSpec{Images: []string{a, b}, RetryTimes: 1}), rec.report)
	if phase != nodejobwire.PhaseSucceeded || !strings.Contains(reason, "imported 2 into containerd") {
		t.Fatalf("Run() = %s, %q", phase, reason)
	}
	if strings.Join(imported, " ") != a+" "+b {
		t.Errorf("imported %v, want %s then %s", imported, a, b)
	}

	// A node without a runtime (no socket, no companion) pulls only.
	r3 := newRunner(t)
	r3.Import = func(context.Context, string) error {
		return fmt.Errorf("%w: containerd's socket is missing", ErrNoRuntime)
	}
	phase, reason = r3.Run(ctx, "uid3", specJSON(t, nodejobwire.PrePullSpec{Images: []string{a}}), rec.report)
	if phase != nodejobwire.PhaseSucceeded || strings.Contains(reason, "imported") {
		t.Fatalf("Run() without a runtime = %s, %q, want pulled only", phase, reason)
	}

	r2 := newRunner(t)
	r2.Import = func(context.Context, string) error { return errors.New("no space left on device") }
	phase, reason = r2.Run(ctx, "uid2", specJSON(t, nodejobwire.PrePullSpec{Images: []string{a}}), rec.report)
	if phase != nodejobwire.PhaseFailed || !strings.Contains(reason, "pulled, but not imported into containerd: no space left on device") {
		t.Fatalf("Run() with a failing import = %s, %q", phase, reason)
	}
}
