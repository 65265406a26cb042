package v1alpha1_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	opsv1 "github.com/drover-fleet/drover/api/operations/v1alpha1"
	"github.com/drover-fleet/drover/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := opsv1.AddToScheme(s); err != nil {
		panic(err)
	}
	var stop func()
	env, stop = testenv.StartMain(testenv.Options{Scheme: s})
	code := m.Run()
	stop()
	os.Exit(code)
}

const digest = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func upgradeJob(name string, mutate func(*opsv1.NodeUpgradeJob)) *opsv1.NodeUpgradeJob {
	j := &opsv1.NodeUpgradeJob{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: opsv1.NodeUpgradeJobSpec{
			NodeNames: []string{"edge-1", "edge-2"},
			Version:   "v1.2.3",
			Artifact:  opsv1.AgentArtifact{URL: "https://downloads.example.com/drover-agent/v1.2.3/linux-amd64", SHA256: digest},
		},
	}
	if mutate != nil {
		mutate(j)
	}
	return j
}

func prePullJob(name string, mutate func(*opsv1.ImagePrePullJob)) *opsv1.ImagePrePullJob {
	j := &opsv1.ImagePrePullJob{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: opsv1.ImagePrePullJobSpec{
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"site": "berlin"}},
			Images:        []string{"nginx", "registry.example.com:5000/team/app:v1", "ghcr.io/org/img@sha256:" + digest},
		},
	}
	if mutate != nil {
		mutate(j)
	}
	return j
}

// TestSchemaValidation creates each object against a real apiserver: the
// API must refuse every injection-shaped or out-of-range value with a message
// naming the field, and accept the valid ones with their defaults.
func TestSchemaValidation(t *testing.T) {
	env := testenv.Require(t, env)
	ctx := context.Background()
	injections := []string{"v1.2.3; rm -rf /", "v1.2.3$(reboot)", "v1.2.3`id`", "v1.2.3\nv2", "v1.2.3 && true"}
	type tc struct {
		name    string
		obj     client.Object
		wantErr string // substring of the error; "" = accepted
	}
	var tests []tc
	add := func(name string, obj client.Object, wantErr string) { tests = append(tests, tc{name, obj, wantErr}) }

	add("valid upgrade by URL", upgradeJob("", nil), "")
	add("valid upgrade by OCI image", upgradeJob("", func(j *opsv1.NodeUpgradeJob) {
		j.Spec.Artifact = opsv1.AgentArtifact{Image: "localhost:5000/drover/agent:v1.2.3", SHA256: digest}
	}), "")
	add("valid upgrade by OCI image with credentials", upgradeJob("", func(j *opsv1.NodeUpgradeJob) {
		j.Spec.Artifact = opsv1.AgentArtifact{Image: "localhost:5000/drover/agent:v1.2.3", SHA256: digest,
			ImageSecretRef: &corev1.SecretReference{Namespace: "default", Name: "pull"}}
	}), "")
	add("credentials with a url", upgradeJob("", func(j *opsv1.NodeUpgradeJob) {
		j.Spec.Artifact.ImageSecretRef = &corev1.SecretReference{Namespace: "default", Name: "pull"}
	}), "imageSecretRef is for an image artifact")
	add("valid pre-pull by labels", prePullJob("", nil), "")
	add("pre-pull credentials without a namespace", prePullJob("", func(j *opsv1.ImagePrePullJob) {
		j.Spec.ImageSecretRef = &corev1.SecretReference{Name: "pull"}
	}), "imageSecretRef needs a name and a namespace")
	add("upgrade credentials without a namespace", upgradeJob("", func(j *opsv1.NodeUpgradeJob) {
		j.Spec.Artifact = opsv1.AgentArtifact{Image: "localhost:5000/drover/agent:v1.2.3", SHA256: digest,
			ImageSecretRef: &corev1.SecretReference{Name: "pull"}}
	}), "imageSecretRef needs a name and a namespace")
	add("pre-pull credentials with a namespace", prePullJob("", func(j *opsv1.ImagePrePullJob) {
		j.Spec.ImageSecretRef = &corev1.SecretReference{Name: "pull", Namespace: "default"}
	}), "")
	for i, v := range injections {
		add(fmt.Sprintf("version injection %d", i), upgradeJob("", func(j *opsv1.NodeUpgradeJob) { j.Spec.Version = v }), "spec.version")
		add(fmt.Sprintf("image injection %d", i), prePullJob("", func(j *opsv1.ImagePrePullJob) { j.Spec.Images = []string{"nginx:" + strings.TrimPrefix(v, "v")} }), "spec.images")
		add(fmt.Sprintf("url injection %d", i), upgradeJob("", func(j *opsv1.NodeUpgradeJob) { j.Spec.Artifact.URL = "https://example.com/" + v }), "spec.artifact.url")
	}
	add("url must be http(s)", upgradeJob("", func(j *opsv1.NodeUpgradeJob) { j.Spec.Artifact.URL = "file:///etc/passwd" }), "spec.artifact.url")
	add("digest must be 64 hex", upgradeJob("", func(j *opsv1.NodeUpgradeJob) { j.Spec.Artifact.SHA256 = "abc" }), "spec.artifact.sha256")
	add("digest is required", upgradeJob("", func(j *opsv1.NodeUpgradeJob) { j.Spec.Artifact.SHA256 = "" }), "spec.artifact.sha256")
	add("url and image are exclusive", upgradeJob("", func(j *opsv1.NodeUpgradeJob) { j.Spec.Artifact.Image = "nginx" }), "exactly one of url and image")
	add("neither url nor image", upgradeJob("", func(j *opsv1.NodeUpgradeJob) { j.Spec.Artifact.URL = "" }), "exactly one of url and image")
	add("nodeNames and labelSelector are exclusive", upgradeJob("", func(j *opsv1.NodeUpgradeJob) {
		j.Spec.LabelSelector = &metav1.LabelSelector{}
	}), "exactly one of nodeNames and labelSelector")
	add("no target", prePullJob("", func(j *opsv1.ImagePrePullJob) { j.Spec.LabelSelector = nil }), "exactly one of nodeNames and labelSelector")
	add("bad node name", upgradeJob("", func(j *opsv1.NodeUpgradeJob) { j.Spec.NodeNames = []string{"Edge_1"} }), "spec.nodeNames")
	for _, ft := range []string{"1.5", "-0.1", "2", "abc", "0.5;", "1e-1"} {
		add("failureTolerate "+ft, upgradeJob("", func(j *opsv1.NodeUpgradeJob) { j.Spec.FailureTolerate = ft }), "spec.failureTolerate")
	}
	for _, ft := range []string{"0", "0.25", "1", "1.0", ".5"} {
		add("failureTolerate "+ft+" ok", upgradeJob("", func(j *opsv1.NodeUpgradeJob) { j.Spec.FailureTolerate = ft }), "")
	}
	add("concurrency 0", prePullJob("", func(j *opsv1.ImagePrePullJob) { j.Spec.Concurrency = -1 }), "spec.concurrency")
	add("unknown check item", prePullJob("", func(j *opsv1.ImagePrePullJob) { j.Spec.CheckItems = []opsv1.CheckItem{"gpu"} }), "spec.checkItems")
	add("no images", prePullJob("", func(j *opsv1.ImagePrePullJob) { j.Spec.Images = nil }), "spec.images")
	add("retryTimes too high", prePullJob("", func(j *opsv1.ImagePrePullJob) { j.Spec.RetryTimes = 11 }), "spec.retryTimes")

	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.obj.SetName(fmt.Sprintf("v-%d", i))
			err := env.Client.Create(ctx, tt.obj)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("create: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("create accepted an object with %s; want an error naming %q", tt.name, tt.wantErr)
			}
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("create: %v; want Invalid naming %q", err, tt.wantErr)
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	env := testenv.Require(t, env)
	ctx := context.Background()
	j := upgradeJob("defaults", nil)
	if err := env.Client.Create(ctx, j); err != nil {
		t.Fatal(err)
	}
	if j.Spec.Concurrency != 1 || j.Spec.TimeoutSeconds != 300 {
		t.Errorf("defaults: concurrency=%d timeoutSeconds=%d, want 1 and 300", j.Spec.Concurrency, j.Spec.TimeoutSeconds)
	}
}

func TestImmutableAndAbort(t *testing.T) {
	env := testenv.Require(t, env)
	ctx := context.Background()
	j := upgradeJob("immutable", nil)
	if err := env.Client.Create(ctx, j); err != nil {
		t.Fatal(err)
	}
	changed := j.DeepCopy()
	changed.Spec.Version = "v9.9.9"
	if err := env.Client.Update(ctx, changed); err == nil || !strings.Contains(err.Error(), "version is immutable") {
		t.Errorf("changing the version of a job: %v; want 'version is immutable'", err)
	}
	// Confirming and aborting are the allowed changes.
	j.Spec.Confirmed = &opsv1.Confirmation{NodeNames: []string{"edge-1"}}
	j.Spec.Abort = true
	if err := env.Client.Update(ctx, j); err != nil {
		t.Fatalf("confirm and abort: %v", err)
	}
	j.Spec.Abort = false
	if err := env.Client.Update(ctx, j); err == nil || !strings.Contains(err.Error(), "cannot be resumed") {
		t.Errorf("un-aborting a job: %v; want 'cannot be resumed'", err)
	}
}
