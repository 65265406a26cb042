package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	"github.com/drover-fleet/drover/internal/testenv"
	"github.com/drover-fleet/drover/internal/testkit"
)

// jobTimeout bounds a node job end to end: download, swap, re-exec,
// reconnect, report.
const jobTimeout = 90 * time.Second

// copyBinary copies a cached test build to dir: an upgrade replaces the
// file it runs from, and the cache must stay as it was.
func copyBinary(t *testing.T, src, dir string) string {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "drover-agent")
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}

func sha256File(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func waitJobPhase(t *testing.T, c *cluster, job opsv1.NodeJob, within time.Duration) opsv1.NodeJob {
	t.Helper()
	testkit.Eventually(t, within, func() string {
		if err := c.client.Get(context.Background(), client.ObjectKeyFromObject(job), job); err != nil {
			return err.Error()
		}
		if !job.JobStatus().Phase.Final() {
			out, _ := c.cli(t, "describe", strings.ToLower(job.JobKind()), job.GetName())
			return fmt.Sprintf("job %s not final:\n%s", job.GetName(), out)
		}
		return ""
	})
	return job
}

// TestNodeJobs upgrades a real drover-agent in place to another real build,
// and pre-pulls images from a registry, through `drover server`.
func TestNodeJobs(t *testing.T) {
	c := startCluster(t)
	v2 := testenv.Binary(t, "./cmd/drover-agent", "-X github.com/drover-fleet/drover/internal/agent/cmd.Version=v0.0.2-e2e")
	srv := httptest.NewServer(http.FileServer(http.Dir(filepath.Dir(v2))))
	t.Cleanup(srv.Close)

	t.Run("an agent upgrades itself in place and reports the new version", func(t *testing.T) {
		dir := t.TempDir()
		bin := copyBinary(t, c.agent, dir)
		a := start(t, "drover-agent edge-up", bin, "--node", "edge-up", "--state-dir", filepath.Join(dir, "state"), "--ca-file", c.ca,
			"--heartbeat-interval", heartbeatInterval.String(), "--hub", c.hub, "--token", c.token(t, true, time.Hour), "--labels", "ring=up")
		c.waitPhase(t, "edge-up", fleetv1.FleetNodeOnline, defaultTimeout)
		job := &opsv1.NodeUpgradeJob{ObjectMeta: metav1.ObjectMeta{Name: "up-v2"}, Spec: opsv1.NodeUpgradeJobSpec{
			NodeNames: []string{"edge-up"}, Version: "v0.0.2-e2e",
			Artifact: opsv1.AgentArtifact{URL: srv.URL + "/" + filepath.Base(v2), SHA256: sha256File(t, v2)},
		}}
		if err := c.client.Create(context.Background(), job); err != nil {
			t.Fatal(err)
		}
		waitJobPhase(t, c, job, jobTimeout)
		out, _ := c.cli(t, "describe", "nuj", "up-v2")
		if job.Status.Phase != opsv1.JobPhaseCompleted {
			t.Fatalf("upgrade job ended %s:\n%s\nagent output:\n%s", job.Status.Phase, out, tail(a.Output(), 40))
		}
		if !regexp.MustCompile(`edge-up\s+Successful\s+Upgrade\s+v0.0.1-e2e → v0.0.2-e2e`).MatchString(out) {
			t.Errorf("describe does not show the versions:\n%s", out)
		}
		if got := sha256File(t, bin); got != sha256File(t, v2) {
			t.Error("the binary on disk is not the new version")
		}
		testkit.Eventually(t, defaultTimeout, func() string {
			n, _ := c.node(t, "edge-up")
			if n.Status.AgentVersion != "v0.0.2-e2e" || n.Status.Phase != fleetv1.FleetNodeOnline {
				return fmt.Sprintf("node version %q phase %s", n.Status.AgentVersion, n.Status.Phase)
			}
			return ""
		})
	})

	t.Run("a corrupt download fails the node, which keeps its version", func(t *testing.T) {
		dir := t.TempDir()
		bin := copyBinary(t, c.agent, dir)
		start(t, "drover-agent edge-bad", bin, "--node", "edge-bad", "--state-dir", filepath.Join(dir, "state"), "--ca-file", c.ca,
			"--heartbeat-interval", heartbeatInterval.String(), "--hub", c.hub, "--token", c.token(t, true, time.Hour))
		c.waitPhase(t, "edge-bad", fleetv1.FleetNodeOnline, defaultTimeout)
		job := &opsv1.NodeUpgradeJob{ObjectMeta: metav1.ObjectMeta{Name: "up-corrupt"}, Spec: opsv1.NodeUpgradeJobSpec{
			NodeNames: []string{"edge-bad"}, Version: "v0.0.2-e2e",
			Artifact: opsv1.AgentArtifact{URL: srv.URL + "/" + filepath.Base(v2), SHA256: strings.Repeat("0", 64)},
		}}
		if err := c.client.Create(context.Background(), job); err != nil {
			t.Fatal(err)
		}
		waitJobPhase(t, c, job, jobTimeout)
		out, _ := c.cli(t, "describe", "nuj", "up-corrupt")
		if job.Status.Phase != opsv1.JobPhaseFailure || !strings.Contains(out, "digest mismatch") || !strings.Contains(out, "v0.0.1-e2e") {
			t.Errorf("corrupt upgrade: phase %s, describe:\n%s", job.Status.Phase, out)
		}
		if sha256File(t, bin) != sha256File(t, c.agent) {
			t.Error("a corrupt download changed the binary")
		}
	})

	t.Run("a new binary that cannot start is rolled back", func(t *testing.T) {
		broken := testenv.Binary(t, "./cmd/drover-agent", "-X github.com/drover-fleet/drover/internal/agent/cmd.Version=v0.0.3-e2e",
			"-X github.com/drover-fleet/drover/internal/agent/cmd.failAtStart=true")
		bsrv := httptest.NewServer(http.FileServer(http.Dir(filepath.Dir(broken))))
		t.Cleanup(bsrv.Close)
		dir := t.TempDir()
		bin := copyBinary(t, c.agent, dir)
		start(t, "drover-agent edge-rb", bin, "--node", "edge-rb", "--state-dir", filepath.Join(dir, "state"), "--ca-file", c.ca,
			"--heartbeat-interval", heartbeatInterval.String(), "--hub", c.hub, "--token", c.token(t, true, time.Hour))
		c.waitPhase(t, "edge-rb", fleetv1.FleetNodeOnline, defaultTimeout)
		job := &opsv1.NodeUpgradeJob{ObjectMeta: metav1.ObjectMeta{Name: "up-broken"}, Spec: opsv1.NodeUpgradeJobSpec{
			NodeNames: []string{"edge-rb"}, Version: "v0.0.3-e2e",
			Artifact: opsv1.AgentArtifact{URL: bsrv.URL + "/" + filepath.Base(broken), SHA256: sha256File(t, broken)},
		}}
		if err := c.client.Create(context.Background(), job); err != nil {
			t.Fatal(err)
		}
		waitJobPhase(t, c, job, jobTimeout)
		out, _ := c.cli(t, "describe", "nuj", "up-broken")
		if job.Status.Phase != opsv1.JobPhaseFailure || !regexp.MustCompile(`edge-rb\s+Failure\s+RollBack`).MatchString(out) || !strings.Contains(out, "v0.0.1-e2e") {
			t.Errorf("broken upgrade: phase %s, describe:\n%s", job.Status.Phase, out)
		}
		if sha256File(t, bin) != sha256File(t, c.agent) {
			t.Error("the running binary is not the old version after the rollback")
		}
		if n, _ := c.node(t, "edge-rb"); n.Status.AgentVersion != "v0.0.1-e2e" || n.Status.Phase != fleetv1.FleetNodeOnline {
			t.Errorf("node after rollback: version %q phase %s", n.Status.AgentVersion, n.Status.Phase)
		}
	})

	t.Run("images are pre-pulled from a registry", func(t *testing.T) {
		reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
		t.Cleanup(reg.Close)
		host := strings.TrimPrefix(reg.URL, "http://")
		img, err := random.Image(1024, 2)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := name.ParseReference(host + "/team/app:v1")
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(ref, img); err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		start(t, "drover-agent edge-pull", c.agent, "--node", "edge-pull", "--state-dir", filepath.Join(dir, "state"), "--ca-file", c.ca,
			"--heartbeat-interval", heartbeatInterval.String(), "--hub", c.hub, "--token", c.token(t, true, time.Hour))
		c.waitPhase(t, "edge-pull", fleetv1.FleetNodeOnline, defaultTimeout)
		job := &opsv1.ImagePrePullJob{ObjectMeta: metav1.ObjectMeta{Name: "warm"}, Spec: opsv1.ImagePrePullJobSpec{
			NodeNames: []string{"edge-pull"}, Images: []string{host + "/team/app:v1", host + "/team/missing:v1"},
			JobExecution: opsv1.JobExecution{FailureTolerate: "1"},
		}}
		if err := c.client.Create(context.Background(), job); err != nil {
			t.Fatal(err)
		}
		waitJobPhase(t, c, job, jobTimeout)
		out, _ := c.cli(t, "describe", "ippj", "warm")
		if !regexp.MustCompile(`image \S+/team/app:v1\s+True`).MatchString(out) || !regexp.MustCompile(`image \S+/team/missing:v1\s+False`).MatchString(out) {
			t.Errorf("per-image results missing:\n%s", out)
		}
		if _, err := os.Stat(filepath.Join(dir, "state", "images", "index.json")); err != nil {
			t.Errorf("no OCI layout in the agent's state dir: %v", err)
		}
	})
}
