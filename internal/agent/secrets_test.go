package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
	"github.com/drover-fleet/drover/internal/store"
	"github.com/drover-fleet/drover/internal/testkit"
)

// password is the registry password of these tests: no byte of the agent
// DB may hold it.
const password = "pw-4f1c-never-on-disk"

// lockedRegistry is a registry behind basic auth (alice, password) holding
// one image; it returns the image's reference.
func lockedRegistry(t *testing.T) string {
	t.Helper()
	inner := registry.New()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "alice" || p != password {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	img, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	host := strings.TrimPrefix(srv.URL, "http://")
	ref, err := name.ParseReference(host + "/app:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, remote.WithAuth(authn.FromConfig(authn.AuthConfig{Username: "alice", Password: password}))); err != nil {
		t.Fatal(err)
	}
	return ref.String()
}

// prePullItem is a pre-pull work item of image with the registry's login.
func prePullItem(t *testing.T, uid, image string) *agentv1.WorkItem {
	t.Helper()
	host := strings.Split(image, "/")[0]
	spec, err := json.Marshal(nodejobwire.PrePullSpec{Job: "j", Images: []string{image},
		Auth: map[string]nodejobwire.Credential{host: {Username: "alice", Password: password}}})
	if err != nil {
		t.Fatal(err)
	}
	return &agentv1.WorkItem{Uid: uid, Type: nodejobwire.TypePrePull, Spec: spec}
}

// startWorkLoop gives a the node job runners and runs its work loop until
// the test ends.
func startWorkLoop(t *testing.T, a *Agent) {
	t.Helper()
	for typ, r := range a.nodeJobRunners(a.db) {
		a.opts.Runners[typ] = r
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.runWork(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("runWork: %v", err)
		}
	})
}

// waitEnd waits for uid's end status in the outbox.
func waitEnd(t *testing.T, a *Agent, uid string) *agentv1.WorkStatus {
	t.Helper()
	var end *agentv1.WorkStatus
	testkit.Eventually(t, testkit.DefaultTimeout, func() string {
		for _, e := range outbox(t, a) {
			if ws := e.GetStatus().GetWork(); ws.GetUid() == uid && terminal(ws.GetPhase()) {
				end = ws
				return ""
			}
		}
		return "no end status of " + uid
	})
	return end
}

// onDisk fails if the agent DB's files (the DB, its WAL and shared memory)
// hold the password.
func onDisk(t *testing.T, a *Agent) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(a.opts.StateDir, "agent.db*"))
	if len(files) == 0 {
		t.Fatal("no agent DB files")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(password)) {
			t.Errorf("%s holds the registry password", f)
		}
	}
}

// An image pre-pull with registry credentials pulls with them, and neither
// the DB nor its WAL ever holds the password; the agent forgets it once
// the item ended.
func TestCredentialsAreNotStored(t *testing.T) {
	image := lockedRegistry(t)
	a := newTestAgent(t, nil)
	startWorkLoop(t, a)
	item := prePullItem(t, "pull-1", image)
	tr := protocol.NewTracker(0)
	if err := a.handleBatch(context.Background(), &fakeHub{}, tr, []*agentv1.Envelope{protocol.NewDispatch("n1", 1, item)}); err != nil {
		t.Fatal(err)
	}
	if end := waitEnd(t, a, "pull-1"); end.GetPhase() != PhaseSucceeded {
		t.Fatalf("the pull ended %s/%s %s, want Succeeded (with the credentials)", end.GetPhase(), end.GetReason(), end.GetMessage())
	}
	w, ok, err := a.db.Work(context.Background(), "pull-1")
	if err != nil || !ok {
		t.Fatalf("work: %v %v", ok, err)
	}
	if !isRedacted(w.Spec) || bytes.Contains(w.Spec, []byte("alice")) {
		t.Errorf("stored spec %s, want it without its auth, marked", w.Spec)
	}
	if a.held.held("pull-1") {
		t.Error("the agent still holds the credentials of an ended item")
	}
	// The hub sends the item again (a later revision): it has ended, its
	// credentials are not kept.
	if err := a.handleBatch(context.Background(), &fakeHub{}, tr, []*agentv1.Envelope{protocol.NewDispatch("n1", 2, item)}); err != nil {
		t.Fatal(err)
	}
	if a.held.held("pull-1") {
		t.Error("the agent holds the credentials of an ended item sent again")
	}
	onDisk(t, a)
}

// After a restart the stored spec has no credentials: the runner waits for
// the hub's snapshot to bring them again, rather than pulling anonymously
// (which the registry refuses); a snapshot without them fails the item,
// saying why.
func TestCredentialsAfterARestart(t *testing.T) {
	image := lockedRegistry(t)
	ctx := context.Background()
	a := newTestAgent(t, nil)
	item := prePullItem(t, "pull-2", image)
	other := prePullItem(t, "pull-3", image)
	// What a dispatch before the restart left in the DB.
	for _, it := range []*agentv1.WorkItem{item, other} {
		stored, secret := redact(it.GetType(), it.GetSpec())
		if !secret {
			t.Fatal("the spec was not found to hold credentials")
		}
		if _, err := a.db.ApplyDispatch(ctx, 1, storeWork(it, stored)); err != nil {
			t.Fatal(err)
		}
	}
	startWorkLoop(t, a)
	a.schedule("pull-2")
	a.schedule("pull-3")
	// The hub's snapshot on the new stream: pull-2 with its credentials,
	// pull-3 (its Secret gone) without.
	otherSpec, _ := json.Marshal(nodejobwire.PrePullSpec{Job: "j", Images: []string{image}})
	snap := protocol.NewSnapshot("n1", 5, []*agentv1.WorkItem{item, {Uid: "pull-3", Type: nodejobwire.TypePrePull, Spec: otherSpec}})
	if err := a.handleBatch(ctx, &fakeHub{}, protocol.NewTracker(1), []*agentv1.Envelope{snap}); err != nil {
		t.Fatal(err)
	}
	if end := waitEnd(t, a, "pull-2"); end.GetPhase() != PhaseSucceeded {
		t.Errorf("pull-2 ended %s/%s %s, want Succeeded with the credentials the snapshot brought", end.GetPhase(), end.GetReason(), end.GetMessage())
	}
	if end := waitEnd(t, a, "pull-3"); end.GetPhase() != PhaseFailed || !strings.Contains(end.GetReason(), "credentials") {
		t.Errorf("pull-3 ended %s/%s, want Failed saying its credentials did not come again", end.GetPhase(), end.GetReason())
	}
	onDisk(t, a)
}

func TestRedact(t *testing.T) {
	spec := []byte(`{"job":"j","images":["r/a"],"auth":{"r":{"username":"u","password":"` + password + `"}},"checks":{}}`)
	stored, secret := redact(nodejobwire.TypePrePull, spec)
	if !secret || bytes.Contains(stored, []byte(password)) || !isRedacted(stored) {
		t.Errorf("redact = %s, %v; want the spec without auth, marked", stored, secret)
	}
	if s, err := nodejobwire.DecodePrePull(stored); err != nil || len(s.Images) != 1 {
		t.Errorf("the redacted spec no longer decodes: %v, %v", s, err)
	}
	for _, tc := range []struct{ typ, spec string }{
		{nodejobwire.TypePrePull, `{"job":"j","images":["r/a"]}`},
		{nodejobwire.TypePrePull, `{"job":"j","images":["r/a"],"auth":{}}`},
		{"task-exec", `{"auth":{"r":{"password":"x"}}}`},
	} {
		if got, secret := redact(tc.typ, []byte(tc.spec)); secret || string(got) != tc.spec {
			t.Errorf("redact(%s, %s) = %s, %v; want it unchanged", tc.typ, tc.spec, got, secret)
		}
	}
	if got, secret := redact(nodejobwire.TypeUpgrade, []byte(`not json `+password)); !secret || bytes.Contains(got, []byte(password)) {
		t.Errorf("redact(malformed) = %s, %v; want a bare mark", got, secret)
	}
}

func storeWork(it *agentv1.WorkItem, spec []byte) store.Work {
	return store.Work{UID: it.GetUid(), Type: it.GetType(), Spec: spec, Phase: PhasePending}
}
