package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"

	"github.com/drover-fleet/drover/bench/internal/benchproc"
)

// Image pushed to the in-process registry: layers × layerBytes of random data.
const (
	layers     = 3
	layerBytes = 1 << 20
)

type realNode struct {
	name, phase, action, reason, images string
}

type realResult struct {
	agents     int
	online     time.Duration
	image      string
	pushed     time.Duration
	wall       time.Duration
	phase      opsv1.JobPhase
	counts     opsv1.NodeTaskCounts
	writes     float64
	nodes      []realNode
	agentCPU   float64
	agentRSSKB int64
}

// runReal runs -real-agents real drover-agent processes (state dirs under
// the work directory), an in-process OCI registry on 127.0.0.1 with one
// random image, and one ImagePrePullJob of that image over those nodes.
func (r *runner) runReal(ctx context.Context) (*realResult, error) {
	rr := &realResult{agents: r.o.realAgents}
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	img, err := random.Image(layerBytes, layers)
	if err != nil {
		return nil, err
	}
	rr.image = host + "/bench/app:v1"
	ref, err := name.ParseReference(rr.image)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	if err := remote.Write(ref, img, remote.WithContext(ctx)); err != nil {
		return nil, fmt.Errorf("push %s: %w", rr.image, err)
	}
	rr.pushed = time.Since(t0)
	logf("real: pushed %s (%d × %d KiB random layers) in %s", rr.image, layers, layerBytes>>10, rr.pushed.Round(time.Millisecond))

	var agents []*benchproc.Proc
	began := time.Now()
	for i := range r.o.realAgents {
		node := fmt.Sprintf("real-%02d", i)
		p, err := r.start("drover-agent-"+node, r.agentBin, "--node", node, "--hub", r.hubAddr, "--token", r.token,
			"--ca-file", r.caFile, "--state-dir", filepath.Join(r.work, "agents", node), "--labels", benchLabel+"=real", "--log-level", "info")
		if err != nil {
			return nil, err
		}
		agents = append(agents, p)
	}
	for {
		if err := anyExited(agents); err != nil {
			return nil, err
		}
		online, _, err := r.countOnline(ctx, benchLabel, "real")
		if err == nil && online >= r.o.realAgents {
			break
		}
		if time.Since(began) > 5*time.Minute {
			return nil, fmt.Errorf("only %d of %d real agents Online after 5m", online, r.o.realAgents)
		}
		settle(ctx, time.Second)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	rr.online = time.Since(began)
	logf("real: %d drover-agent processes Online after %s", r.o.realAgents, rr.online.Round(time.Second))
	var cpu0 float64
	for _, p := range agents {
		u, _ := benchproc.ReadUsage(p.PID())
		cpu0 += u.CPU.Seconds()
	}

	job := &opsv1.ImagePrePullJob{
		ObjectMeta: metav1.ObjectMeta{Name: "bench-real-prepull"},
		Spec: opsv1.ImagePrePullJobSpec{
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{benchLabel: "real"}},
			Images:        []string{rr.image},
			JobExecution:  opsv1.JobExecution{Concurrency: int32(r.o.realAgents), TimeoutSeconds: 300},
		},
	}
	w0, err := r.apiSnap(ctx)
	if err != nil {
		return nil, err
	}
	t0 = time.Now()
	if err := r.c.Create(ctx, job); err != nil {
		return nil, err
	}
	var got opsv1.ImagePrePullJob
	for {
		if err := r.c.Get(ctx, client.ObjectKeyFromObject(job), &got); err == nil && got.Status.Phase.Final() {
			rr.wall = time.Since(t0)
			break
		}
		if time.Since(t0) > r.o.jobTimeout {
			return nil, fmt.Errorf("job %s not final after %v", job.Name, r.o.jobTimeout)
		}
		settle(ctx, 200*time.Millisecond)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	rr.phase, rr.counts = got.Status.Phase, got.Status.Counts
	w1, err := r.apiSnap(ctx)
	if err != nil {
		return nil, err
	}
	rr.writes = benchproc.Total(benchproc.Delta(w0, w1))
	for _, p := range agents {
		u, _ := benchproc.ReadUsage(p.PID())
		rr.agentCPU += u.CPU.Seconds()
		rr.agentRSSKB = max(rr.agentRSSKB, u.RSSKiB)
	}
	rr.agentCPU -= cpu0
	logf("real: %s %s in %s", job.Name, rr.phase, rr.wall.Round(time.Millisecond))

	var slices opsv1.NodeTaskSliceList
	if err := r.c.List(ctx, &slices, client.MatchingLabels{opsv1.LabelJobUID: string(got.UID)}); err != nil {
		return nil, err
	}
	for _, s := range slices.Items {
		for _, n := range s.Nodes {
			var ims []string
			for _, im := range n.ImageStatus {
				ims = append(ims, fmt.Sprintf("%s %s", im.Status, im.Reason))
			}
			rr.nodes = append(rr.nodes, realNode{name: n.NodeName, phase: string(n.Phase), action: n.Action, reason: n.Reason,
				images: strings.TrimSpace(strings.Join(ims, "; "))})
		}
	}
	sort.Slice(rr.nodes, func(i, j int) bool { return rr.nodes[i].name < rr.nodes[j].name })
	return rr, nil
}

func (rr *realResult) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "### %d real drover-agent processes, one ImagePrePullJob\n\n", rr.agents)
	fmt.Fprintf(&b, "Image `%s`: %d random layers of %d KiB in an in-process registry (go-containerregistry) on 127.0.0.1, pushed in %s. Agents Online %s after start.\n\n",
		rr.image, layers, layerBytes>>10, rr.pushed.Round(time.Millisecond), rr.online.Round(time.Second))
	fmt.Fprintf(&b, "| figure | measured |\n|---|---:|\n")
	fmt.Fprintf(&b, "| wall time, create → final (concurrency %d) | %s |\n", rr.agents, rr.wall.Round(time.Millisecond))
	fmt.Fprintf(&b, "| outcome | %s: %d of %d successful, %d failed, %d unknown |\n", rr.phase, rr.counts.Successful, rr.counts.Total, rr.counts.Failure, rr.counts.Unknown)
	fmt.Fprintf(&b, "| apiserver writes during the job | %.0f |\n", rr.writes)
	fmt.Fprintf(&b, "| agents' CPU during the job (all %d) | %.2f s |\n", rr.agents, rr.agentCPU)
	fmt.Fprintf(&b, "| largest agent RSS after the job | %.1f MiB |\n\n", float64(rr.agentRSSKB)/1024)
	b.WriteString("| node | phase | last action | reason | image |\n|---|---|---|---|---|\n")
	for _, n := range rr.nodes {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", n.name, n.phase, n.action, n.reason, n.images)
	}
	b.WriteString("\n")
	return b.String()
}
