package nodejobctl_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	"github.com/drover-fleet/drover/internal/nodejob/nodejobctl"
	"github.com/drover-fleet/drover/internal/testenv"
)

var (
	env    *testenv.Env
	scheme = runtime.NewScheme()
)

const (
	waitTimeout = 30 * time.Second
	digest      = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, fleetv1.AddToScheme, opsv1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	var stop func()
	env, stop = testenv.StartMain(testenv.Options{Scheme: scheme})
	code := m.Run()
	stop()
	os.Exit(code)
}

// startManager runs the two node job controllers until the test ends.
func startManager(t *testing.T) {
	t.Helper()
	skip := true // each test runs its own manager with the same controllers
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: &skip}})
	if err != nil {
		t.Fatal(err)
	}
	up := &nodejobctl.Reconciler[*opsv1.NodeUpgradeJob]{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder("test"),
		New: func() *opsv1.NodeUpgradeJob { return &opsv1.NodeUpgradeJob{} }}
	pp := &nodejobctl.Reconciler[*opsv1.ImagePrePullJob]{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder("test"),
		New: func() *opsv1.ImagePrePullJob { return &opsv1.ImagePrePullJob{} }}
	if err := up.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	if err := pp.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
}

// node creates a FleetNode in phase (Online nodes are on hub-x).
func node(t *testing.T, name string, phase fleetv1.FleetNodePhase, labels map[string]string) {
	t.Helper()
	ctx := context.Background()
	n := &fleetv1.FleetNode{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: fleetv1.FleetNodeSpec{Approved: phase != fleetv1.FleetNodePending}}
	if err := env.Client.Create(ctx, n); err != nil {
		t.Fatal(err)
	}
	n.Status.Phase = phase
	if phase == fleetv1.FleetNodeOnline {
		n.Status.Hub = "hub-x"
	}
	if err := env.Client.Status().Update(ctx, n); err != nil {
		t.Fatal(err)
	}
}

func upgrade(name string, nodes []string, mutate func(*opsv1.NodeUpgradeJob)) *opsv1.NodeUpgradeJob {
	j := &opsv1.NodeUpgradeJob{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: opsv1.NodeUpgradeJobSpec{
		NodeNames: nodes, Version: "v1.2.3",
		Artifact: opsv1.AgentArtifact{URL: "https://example.com/drover-agent", SHA256: digest},
	}}
	if mutate != nil {
		mutate(j)
	}
	return j
}

// entries returns the job's node tasks by node name, read from its slices.
func entries(t *testing.T, uid string) map[string]opsv1.NodeTaskStatus {
	t.Helper()
	var l opsv1.NodeTaskSliceList
	if err := env.Client.List(context.Background(), &l, client.MatchingLabels{opsv1.LabelJobUID: uid}); err != nil {
		t.Fatal(err)
	}
	out := map[string]opsv1.NodeTaskStatus{}
	for _, s := range l.Items {
		for _, e := range s.Nodes {
			out[e.NodeName] = e
		}
	}
	return out
}

func phases(m map[string]opsv1.NodeTaskStatus) string {
	var s []string
	for n, e := range m {
		s = append(s, n+"="+string(e.Phase))
	}
	sort.Strings(s)
	return strings.Join(s, " ")
}

// report plays a hub: it sets node's task to phase with action.
func report(t *testing.T, uid, nodeName string, phase opsv1.NodeTaskPhase, action, reason string) {
	t.Helper()
	ctx := context.Background()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var l opsv1.NodeTaskSliceList
		if err := env.Client.List(ctx, &l, client.MatchingLabels{opsv1.LabelJobUID: uid}); err != nil {
			return err
		}
		for _, s := range l.Items {
			for i := range s.Nodes {
				if s.Nodes[i].NodeName == nodeName {
					now := metav1.NowMicro()
					s.Nodes[i].Phase, s.Nodes[i].Action, s.Nodes[i].Reason, s.Nodes[i].UpdateTime = phase, action, reason, &now
					return env.Client.Update(ctx, &s)
				}
			}
		}
		return fmt.Errorf("node %s not in any slice", nodeName)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func waitJob[T opsv1.NodeJob](t *testing.T, job T, what string, ok func(T) bool) T {
	t.Helper()
	testenv.Eventually(t, waitTimeout, what, func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(job), job); err != nil {
			return false, err
		}
		return ok(job), nil
	})
	return job
}

func phaseIs[T opsv1.NodeJob](p opsv1.JobPhase) func(T) bool {
	return func(j T) bool { return j.JobStatus().Phase == p }
}

func TestUpgradeJobRunsWithinConcurrencyToAFinalPhase(t *testing.T) {
	testenv.Require(t, env)
	startManager(t)
	for _, n := range []string{"cc-a", "cc-b", "cc-c"} {
		node(t, n, fleetv1.FleetNodeOnline, nil)
	}
	node(t, "cc-off", fleetv1.FleetNodeOffline, nil)
	tests := []struct {
		name     string
		tolerate string
		want     opsv1.JobPhase
		reason   string
	}{
		{"strict", "", opsv1.JobPhaseFailure, opsv1.ReasonFailureToleranceExceeded},
		{"tolerant", "0.5", opsv1.JobPhaseCompleted, opsv1.ReasonWithinFailureTolerance},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			job := upgrade("cc-"+tt.name, []string{"cc-a", "cc-b", "cc-c", "cc-off", "cc-missing"}, func(j *opsv1.NodeUpgradeJob) {
				j.Spec.Concurrency = 2
				j.Spec.FailureTolerate = tt.tolerate
			})
			if err := env.Client.Create(ctx, job); err != nil {
				t.Fatal(err)
			}
			uid := string(job.UID)
			waitJob(t, job, "InProgress", phaseIs[*opsv1.NodeUpgradeJob](opsv1.JobPhaseInProgress))
			testenv.Eventually(t, waitTimeout, "two admitted, the unfit failed", func(context.Context) (bool, error) {
				if got := phases(entries(t, uid)); got != "cc-a=InProgress cc-b=InProgress cc-c=Pending cc-missing=Failure cc-off=Failure" {
					return false, fmt.Errorf("entries: %s", got)
				}
				return true, nil
			})
			e := entries(t, uid)
			if !strings.Contains(e["cc-off"].Reason, "Offline") || !strings.Contains(e["cc-missing"].Reason, "does not exist") {
				t.Errorf("reasons: off=%q missing=%q", e["cc-off"].Reason, e["cc-missing"].Reason)
			}
			report(t, uid, "cc-a", opsv1.NodeTaskPhaseSuccessful, "Upgrade", "")
			testenv.Eventually(t, waitTimeout, "cc-c admitted once cc-a finished", func(context.Context) (bool, error) {
				return entries(t, uid)["cc-c"].Phase == opsv1.NodeTaskPhaseInProgress, nil
			})
			report(t, uid, "cc-b", opsv1.NodeTaskPhaseSuccessful, "Upgrade", "")
			report(t, uid, "cc-c", opsv1.NodeTaskPhaseSuccessful, "Upgrade", "")
			job = waitJob(t, job, "final", func(j *opsv1.NodeUpgradeJob) bool { return j.Status.Phase.Final() })
			if job.Status.Phase != tt.want {
				t.Fatalf("phase = %s, want %s; status %+v", job.Status.Phase, tt.want, job.Status)
			}
			c := job.Status.Counts
			if c.Total != 5 || c.Successful != 3 || c.Failure != 2 || len(job.Status.Failures) != 2 || job.Status.CompletionTime == nil {
				t.Errorf("status = %+v", job.Status)
			}
			if cond := meta.FindStatusCondition(job.Status.Conditions, opsv1.ConditionFailed); cond == nil || cond.Reason != tt.reason {
				t.Errorf("Failed condition = %+v, want reason %s", cond, tt.reason)
			}
			// Final is final: a late report changes the detail, not the phase.
			report(t, uid, "cc-a", opsv1.NodeTaskPhaseFailure, "RollBack", "late")
			testenv.Never(t, 2*time.Second, "a finished job changes phase", func(ctx context.Context) (bool, error) {
				// A read cut short by the end of the watch is not an answer.
				err := env.Client.Get(ctx, client.ObjectKeyFromObject(job), job)
				return err == nil && job.Status.Phase != tt.want, nil
			})
		})
	}
}

func TestNoMatchingNodesFails(t *testing.T) {
	testenv.Require(t, env)
	startManager(t)
	job := &opsv1.ImagePrePullJob{ObjectMeta: metav1.ObjectMeta{Name: "nomatch"}, Spec: opsv1.ImagePrePullJobSpec{
		LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"site": "atlantis"}}, Images: []string{"nginx"}}}
	if err := env.Client.Create(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	job = waitJob(t, job, "Failure", phaseIs[*opsv1.ImagePrePullJob](opsv1.JobPhaseFailure))
	if c := meta.FindStatusCondition(job.Status.Conditions, opsv1.ConditionFailed); c == nil || c.Reason != opsv1.ReasonNoMatchingNodes {
		t.Errorf("Failed condition = %+v", c)
	}
}

func TestSilentNodeGoesUnknownAndAbortEndsTheJob(t *testing.T) {
	testenv.Require(t, env)
	startManager(t)
	for _, n := range []string{"ab-a", "ab-b", "ab-c"} {
		node(t, n, fleetv1.FleetNodeOnline, map[string]string{"abort-test": "yes"})
	}
	ctx := context.Background()
	job := &opsv1.ImagePrePullJob{ObjectMeta: metav1.ObjectMeta{Name: "silent"}, Spec: opsv1.ImagePrePullJobSpec{
		LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"abort-test": "yes"}}, Images: []string{"nginx"},
		JobExecution: opsv1.JobExecution{Concurrency: 1, TimeoutSeconds: 1}}}
	if err := env.Client.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	uid := string(job.UID)
	// Nobody reports: each node in turn times out to Unknown, and the job
	// is not wedged by them.
	waitJob(t, job, "Failure after every node timed out", phaseIs[*opsv1.ImagePrePullJob](opsv1.JobPhaseFailure))
	e := entries(t, uid)
	if phases(e) != "ab-a=Unknown ab-b=Unknown ab-c=Unknown" || !strings.Contains(e["ab-a"].Reason, "no report within 1s") {
		t.Errorf("entries = %s, reason %q", phases(e), e["ab-a"].Reason)
	}

	// Abort: the node in flight finishes, the others never start.
	job2 := &opsv1.ImagePrePullJob{ObjectMeta: metav1.ObjectMeta{Name: "aborted"}, Spec: opsv1.ImagePrePullJobSpec{
		LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"abort-test": "yes"}}, Images: []string{"nginx"},
		JobExecution: opsv1.JobExecution{Concurrency: 1, TimeoutSeconds: 600}}}
	if err := env.Client.Create(ctx, job2); err != nil {
		t.Fatal(err)
	}
	uid2 := string(job2.UID)
	testenv.Eventually(t, waitTimeout, "one node admitted", func(context.Context) (bool, error) {
		return entries(t, uid2)["ab-a"].Phase == opsv1.NodeTaskPhaseInProgress, nil
	})
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(job2), job2); err != nil {
			return err
		}
		job2.Spec.Abort = true
		return env.Client.Update(ctx, job2)
	}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "pending nodes failed by the abort", func(context.Context) (bool, error) {
		return phases(entries(t, uid2)) == "ab-a=InProgress ab-b=Failure ab-c=Failure", nil
	})
	if got := waitJob(t, job2, "still running", func(*opsv1.ImagePrePullJob) bool { return true }); got.Status.Phase.Final() {
		t.Fatalf("aborted job final while a node still runs: %s", got.Status.Phase)
	}
	report(t, uid2, "ab-a", opsv1.NodeTaskPhaseSuccessful, "Pull", "")
	job2 = waitJob(t, job2, "Failure", phaseIs[*opsv1.ImagePrePullJob](opsv1.JobPhaseFailure))
	if c := meta.FindStatusCondition(job2.Status.Conditions, opsv1.ConditionFailed); c == nil || c.Reason != opsv1.ReasonAborted {
		t.Errorf("Failed condition = %+v, want %s", c, opsv1.ReasonAborted)
	}
}

func TestRecreatedJobStartsClean(t *testing.T) {
	testenv.Require(t, env)
	startManager(t)
	node(t, "rc-a", fleetv1.FleetNodeOnline, nil)
	ctx := context.Background()
	first := upgrade("recreate", []string{"rc-a"}, nil)
	if err := env.Client.Create(ctx, first); err != nil {
		t.Fatal(err)
	}
	waitJob(t, first, "InProgress", phaseIs[*opsv1.NodeUpgradeJob](opsv1.JobPhaseInProgress))
	report(t, string(first.UID), "rc-a", opsv1.NodeTaskPhaseFailure, "Check", "disk full")
	if err := env.Client.Delete(ctx, first); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "the deleted job's slices are gone", func(context.Context) (bool, error) {
		return len(entries(t, string(first.UID))) == 0, nil
	})
	second := upgrade("recreate", []string{"rc-a"}, nil)
	if err := env.Client.Create(ctx, second); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "the new job admits the node afresh", func(context.Context) (bool, error) {
		e := entries(t, string(second.UID))["rc-a"]
		return e.Phase == opsv1.NodeTaskPhaseInProgress && e.Reason != "disk full", nil
	})
}

func TestSlicesAreCreatedWithTheFirstAdmission(t *testing.T) {
	testenv.Require(t, env)
	startManager(t)
	for _, n := range []string{"fa-a", "fa-b", "fa-c"} {
		node(t, n, fleetv1.FleetNodeOnline, nil)
	}
	ctx := context.Background()
	job := upgrade("first-admission", []string{"fa-a", "fa-b", "fa-c", "fa-missing"}, func(j *opsv1.NodeUpgradeJob) { j.Spec.Concurrency = 2 })
	if err := env.Client.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	var l opsv1.NodeTaskSliceList
	testenv.Eventually(t, waitTimeout, "the job's slice", func(ctx context.Context) (bool, error) {
		err := env.Client.List(ctx, &l, client.MatchingLabels{opsv1.LabelJobUID: string(job.UID)})
		return err == nil && len(l.Items) == 1, err
	})
	// Generation 1: the admission is in the slice as created, not a
	// second write to it.
	s := l.Items[0]
	got := map[string]opsv1.NodeTaskPhase{}
	for _, e := range s.Nodes {
		got[e.NodeName] = e.Phase
	}
	want := map[string]opsv1.NodeTaskPhase{"fa-a": "InProgress", "fa-b": "InProgress", "fa-c": "Pending", "fa-missing": "Failure"}
	if s.Generation != 1 || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("slice generation %d, entries %v; want generation 1 and %v", s.Generation, got, want)
	}
}
