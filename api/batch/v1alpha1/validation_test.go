package v1alpha1_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/testenv"
	"github.com/drover-fleet/drover/internal/testkit"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := batchv1.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := fleetv1.AddToScheme(s); err != nil {
		panic(err)
	}
	var stop func()
	env, stop = testenv.StartMain(testenv.Options{Scheme: s})
	code := m.Run()
	stop()
	os.Exit(code)
}

const digest = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func task(name string, mutate func(*batchv1.Task)) *batchv1.Task {
	t := &batchv1.Task{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec:       batchv1.TaskSpec{Command: []string{"/bin/echo", "hello; rm -rf /"}},
	}
	if mutate != nil {
		mutate(t)
	}
	return t
}

func TestTaskValidation(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name    string
		task    *batchv1.Task
		wantErr string
	}{
		{"argv with shell characters is just data", task("ok-argv", nil), ""},
		{"full spec", task("ok-full", func(t *batchv1.Task) {
			t.Spec.Env = []batchv1.EnvVar{{Name: "MODE", Value: "$(not expanded)"}}
			t.Spec.WorkingDir = "/var/lib/work"
			t.Spec.Artifacts = []batchv1.Artifact{{URL: "https://example.com/a.tar", SHA256: digest, Path: "in/a.tar"}}
			t.Spec.Timeout = &metav1.Duration{Duration: time.Minute}
			t.Spec.RestartPolicy = batchv1.RestartOnFailure
		}), ""},
		{"empty command", task("bad-cmd", func(t *batchv1.Task) { t.Spec.Command = nil }), "command"},
		{"containerd with an image and no command", task("ok-ctr", func(t *batchv1.Task) {
			t.Spec.Driver, t.Spec.Image, t.Spec.Command = batchv1.DriverContainerd, "registry.example.com/a/b:1", nil
		}), ""},
		{"containerd without an image", task("bad-ctr", func(t *batchv1.Task) { t.Spec.Driver = batchv1.DriverContainerd }),
			"image is required with driver containerd"},
		{"an image with driver exec", task("bad-img", func(t *batchv1.Task) { t.Spec.Image = "a/b:1" }),
			"image is required with driver containerd, and only with it"},
		{"containerd with artifacts", task("bad-ctr-art", func(t *batchv1.Task) {
			t.Spec.Driver, t.Spec.Image = batchv1.DriverContainerd, "a/b:1"
			t.Spec.Artifacts = []batchv1.Artifact{{URL: "https://example.com/a.tar", SHA256: digest, Path: "a.tar"}}
		}), "artifacts are not supported with driver containerd"},
		{"empty program", task("bad-prog", func(t *batchv1.Task) { t.Spec.Command = []string{""} }), "command[0] must name a program"},
		{"env name with injection", task("bad-env", func(t *batchv1.Task) { t.Spec.Env = []batchv1.EnvVar{{Name: "A;B", Value: "x"}} }), "name"},
		{"relative working dir inside the attempt's", task("ok-wd", func(t *batchv1.Task) { t.Spec.WorkingDir = "out/build" }), ""},
		{"relative working dir leaving it", task("bad-wd", func(t *batchv1.Task) { t.Spec.WorkingDir = "out/../../etc" }), "no '..' segments"},
		{"relative working dir of ..", task("bad-wd2", func(t *batchv1.Task) { t.Spec.WorkingDir = ".." }), "no '..' segments"},
		{"run as a user and group", task("ok-runas", func(t *batchv1.Task) {
			u, g := int64(1000), int64(1000)
			t.Spec.SecurityContext = &batchv1.TaskSecurityContext{RunAsUser: &u, RunAsGroup: &g}
		}), ""},
		{"negative uid", task("bad-uid", func(t *batchv1.Task) {
			u := int64(-1)
			t.Spec.SecurityContext = &batchv1.TaskSecurityContext{RunAsUser: &u}
		}), "runAsUser"},
		{"artifact escaping the working dir", task("bad-art", func(t *batchv1.Task) {
			t.Spec.Artifacts = []batchv1.Artifact{{URL: "https://example.com/a", SHA256: digest, Path: "a/../../etc/passwd"}}
		}), "path"},
		{"artifact url with a backtick", task("bad-url", func(t *batchv1.Task) {
			t.Spec.Artifacts = []batchv1.Artifact{{URL: "https://example.com/`id`", SHA256: digest, Path: "a"}}
		}), "url"},
		{"short digest", task("bad-digest", func(t *batchv1.Task) {
			t.Spec.Artifacts = []batchv1.Artifact{{URL: "https://example.com/a", SHA256: "abc", Path: "a"}}
		}), "sha256"},
		{"unknown driver", task("bad-driver", func(t *batchv1.Task) { t.Spec.Driver = "docker" }), "driver"},
		{"zero attempts", task("bad-attempts", func(t *batchv1.Task) { t.Spec.MaxAttempts = -1 }), "maxAttempts"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := env.Client.Create(ctx, tt.task)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("create: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("create succeeded, want an error mentioning %q", tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %q does not mention %q", err, tt.wantErr)
			}
			if strings.Contains(err.Error(), "evaluating rule") {
				t.Errorf("a CEL rule failed to evaluate instead of saying what is wrong: %v", err)
			}
		})
	}
}

func TestTaskDefaultsAndImmutableNode(t *testing.T) {
	ctx := context.Background()
	tk := task("defaults", func(t *batchv1.Task) { t.Spec.NodeName = "edge-1" })
	if err := env.Client.Create(ctx, tk); err != nil {
		t.Fatal(err)
	}
	// restartPolicy and reschedulePolicy stay unset so that a FleetJob's can
	// fill them in; the manager reads unset as Never and OnNodeLost.
	if tk.Spec.Driver != "exec" || tk.Spec.RestartPolicy != "" || tk.Spec.ReschedulePolicy != "" || tk.Spec.MaxAttempts != 3 {
		t.Errorf("defaults = driver %q restart %q reschedule %q attempts %d", tk.Spec.Driver, tk.Spec.RestartPolicy, tk.Spec.ReschedulePolicy, tk.Spec.MaxAttempts)
	}
	tk.Spec.NodeName = "edge-2"
	if err := env.Client.Update(ctx, tk); err == nil || !strings.Contains(err.Error(), "nodeName cannot be changed") {
		t.Errorf("changing nodeName: err = %v, want refusal", err)
	}
}

func TestFleetJobValidation(t *testing.T) {
	ctx := context.Background()
	ok := &batchv1.FleetJob{
		ObjectMeta: metav1.ObjectMeta{Name: "survey", Namespace: "default"},
		Spec: batchv1.FleetJobSpec{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"site": "north"}},
			TaskGroups: []batchv1.TaskGroupTemplate{{Name: "scan", Count: 3,
				Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{Command: []string{"true"}}}}},
		},
	}
	if err := env.Client.Create(ctx, ok); err != nil {
		t.Fatalf("create: %v", err)
	}
	bad := ok.DeepCopy()
	bad.ResourceVersion = ""
	bad.Name = "bad-group"
	bad.Spec.TaskGroups[0].Name = "Scan_1"
	if err := env.Client.Create(ctx, bad); err == nil {
		t.Error("a group name that is no DNS label was accepted")
	}
	long := ok.DeepCopy()
	long.ResourceVersion = ""
	long.Name = strings.Repeat("j", 200)
	long.Spec.TaskGroups[0].Name = strings.Repeat("g", 60)
	if err := env.Client.Create(ctx, long); err == nil || !strings.Contains(err.Error(), "over 253 characters") {
		t.Errorf("a job whose task names would pass 253 characters: %v", err)
	}
	none := ok.DeepCopy()
	none.ResourceVersion = ""
	none.Name = "no-groups"
	none.Spec.TaskGroups = nil
	if err := env.Client.Create(ctx, none); err == nil {
		t.Error("a job without groups was accepted")
	}
}

// TestDurationValidation sends durations as a user's YAML would, as
// strings: one Go cannot parse must be refused by the API, or it would
// break every client's list and watch of Tasks.
func TestDurationValidation(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		field, value string
		wantErr      string
	}{
		{"timeout", "90s", ""},
		{"timeout", "1h30m", ""},
		{"timeout", "1d", "timeout must be a duration"},
		{"timeout", "5min", "timeout must be a duration"},
		{"timeout", "30", "timeout must be a duration"},
		{"timeout", "-5s", "from 1s"},
		{"timeout", "200ms", "from 1s"},
		{"killTimeout", "1s", ""},
		{"killTimeout", "0s", "from 1s to 1h"},
		{"timeout", "1h30m0s", ""}, // as Go's own client writes it
		{"timeout", "1.5s", ""},
		{"timeout", "9000h", "from 1s to 8760h"},
		{"killTimeout", "2h", "from 1s to 1h"},
		{"killTimeout", "ten", "killTimeout must be a duration"},
		{"backoff", "1m", ""},
		{"backoff", "-1s", "not negative"},
	}
	for i, tt := range tests {
		t.Run(tt.field+"="+tt.value, func(t *testing.T) {
			u := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": batchv1.GroupVersion.String(), "kind": "Task",
				"metadata": map[string]any{"name": fmt.Sprintf("dur-%d", i), "namespace": "default"},
				"spec":     map[string]any{"command": []any{"true"}, tt.field: tt.value},
			}}
			err := env.Client.Create(ctx, u)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("create: %v", err)
				}
				got := &batchv1.Task{}
				if err := env.Client.Get(ctx, client.ObjectKeyFromObject(u), got); err != nil {
					t.Fatalf("a Task the API accepted does not decode: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("%s %q accepted, want an error mentioning %q", tt.field, tt.value, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %q does not mention %q", err, tt.wantErr)
			}
		})
	}
}

// An empty argv is refused for what it is, not with a CEL evaluation error.
func TestEmptyCommand(t *testing.T) {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": batchv1.GroupVersion.String(), "kind": "Task",
		"metadata": map[string]any{"name": "empty-argv", "namespace": "default"},
		"spec":     map[string]any{"command": []any{}},
	}}
	err := env.Client.Create(context.Background(), u)
	if err == nil || !strings.Contains(err.Error(), "spec.command") || strings.Contains(err.Error(), "evaluating rule") {
		t.Errorf("command: [] gave %v; want a plain refusal", err)
	}
}

// TestNegativeResources checks the admission policy of
// config/admission/batch_resources.yaml, which `drover controlplane`
// installs with the CRDs: a negative quantity is refused on each kind,
// with the path of the one at fault, and nothing is stored.
func TestNegativeResources(t *testing.T) {
	ctx := context.Background()
	neg := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), "gpu": resource.MustParse("-500m")}
	spec := batchv1.TaskSpec{Command: []string{"true"}, Resources: neg}
	tests := []struct {
		obj  client.Object
		want string
	}{
		{&batchv1.Task{ObjectMeta: metav1.ObjectMeta{Name: "neg-task", Namespace: "default"}, Spec: spec},
			"spec.resources.gpu is negative"},
		{&batchv1.TaskGroup{ObjectMeta: metav1.ObjectMeta{Name: "neg-group", Namespace: "default"},
			Spec: batchv1.TaskGroupSpec{Count: 2, Template: batchv1.TaskTemplate{Spec: spec}}},
			"spec.template.spec.resources.gpu is negative"},
		{&batchv1.FleetJob{ObjectMeta: metav1.ObjectMeta{Name: "neg-job", Namespace: "default"},
			Spec: batchv1.FleetJobSpec{TaskGroups: []batchv1.TaskGroupTemplate{
				{Name: "fine", Count: 1, Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{Command: []string{"true"}}}},
				{Name: "scan", Count: 1, Template: batchv1.TaskTemplate{Spec: spec}},
			}}},
			"spec.taskGroups[scan].template.spec.resources.gpu is negative"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%T", tt.obj), func(t *testing.T) {
			// The apiserver enforces a policy about a second after it is
			// created; the control plane may have just started.
			var err error
			testkit.Wait(ctx, testkit.DefaultTimeout, func() string {
				if err = env.Client.Create(ctx, tt.obj.DeepCopyObject().(client.Object)); err != nil {
					return ""
				}
				if err := env.Client.Delete(ctx, tt.obj); err != nil {
					t.Fatalf("delete what was accepted before the policy was loaded: %v", err)
				}
				return "the policy is not enforced yet"
			})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("create with a negative quantity: %v; want an error saying %q", err, tt.want)
			}
		})
	}
	ok := &batchv1.Task{ObjectMeta: metav1.ObjectMeta{Name: "zero-task", Namespace: "default"},
		Spec: batchv1.TaskSpec{Command: []string{"true"}, Resources: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("0"), corev1.ResourceMemory: resource.MustParse("1Gi")}}}
	if err := env.Client.Create(ctx, ok); err != nil {
		t.Fatalf("zero and positive quantities: %v", err)
	}
}

func TestNULBytesRefused(t *testing.T) {
	ctx := context.Background()
	for name, mutate := range map[string]func(*batchv1.Task){
		"nul-arg": func(t *batchv1.Task) { t.Spec.Command = []string{"/bin/echo", "a\x00b"} },
		"nul-env": func(t *batchv1.Task) { t.Spec.Env = []batchv1.EnvVar{{Name: "A", Value: "x\x00y"}} },
	} {
		err := env.Client.Create(ctx, task(name, mutate))
		if err == nil || !strings.Contains(err.Error(), `^[^\x00]*$`) {
			t.Errorf("%s: %v; want a refusal naming the pattern", name, err)
		}
	}
}

// TestTaskSpecFrozenOnceScheduled: the attempt on a node runs the spec it
// was sent, so an edit afterwards would be shown but never run.
func TestTaskSpecFrozenOnceScheduled(t *testing.T) {
	ctx := context.Background()
	tk := task("frozen", nil)
	if err := env.Client.Create(ctx, tk); err != nil {
		t.Fatal(err)
	}
	tk.Spec.Command = []string{"/bin/echo", "edited while Pending"}
	if err := env.Client.Update(ctx, tk); err != nil {
		t.Fatalf("editing a task that is not scheduled yet: %v", err)
	}
	tk.Status.State = batchv1.TaskRunning
	if err := env.Client.Status().Update(ctx, tk); err != nil {
		t.Fatal(err)
	}
	edited := tk.DeepCopy()
	edited.Spec.Command = []string{"/bin/echo", "changed"}
	err := env.Client.Update(ctx, edited)
	if err == nil || !strings.Contains(err.Error(), "spec cannot change once the task is Running") {
		t.Errorf("editing a Running task's command: %v; want a refusal", err)
	}
	labelled := tk.DeepCopy()
	labelled.Labels = map[string]string{"team": "a"}
	if err := env.Client.Update(ctx, labelled); err != nil {
		t.Errorf("labelling a Running task: %v", err)
	}
}

// TestFleetJobNameRuleOnUpdate: a group added later must fit the names too,
// or the manager could never create its TaskGroup.
func TestFleetJobNameRuleOnUpdate(t *testing.T) {
	ctx := context.Background()
	j := &batchv1.FleetJob{
		ObjectMeta: metav1.ObjectMeta{Name: strings.Repeat("j", 200), Namespace: "default"},
		Spec: batchv1.FleetJobSpec{TaskGroups: []batchv1.TaskGroupTemplate{{Name: "a", Count: 1,
			Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{Command: []string{"true"}}}}}},
	}
	if err := env.Client.Create(ctx, j); err != nil {
		t.Fatal(err)
	}
	j.Spec.TaskGroups = append(j.Spec.TaskGroups, batchv1.TaskGroupTemplate{Name: strings.Repeat("g", 60), Count: 1,
		Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{Command: []string{"true"}}}})
	if err := env.Client.Update(ctx, j); err == nil || !strings.Contains(err.Error(), "over 253 characters") {
		t.Errorf("adding a group whose names would pass 253 characters: %v", err)
	}
}

func TestNodeGrantValidation(t *testing.T) {
	ctx := context.Background()
	grant := func(name string, mutate func(*fleetv1.NodeGrantSpec)) *fleetv1.NodeGrant {
		g := &fleetv1.NodeGrant{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: fleetv1.NodeGrantSpec{Namespaces: []string{"team-a"}}}
		if mutate != nil {
			mutate(&g.Spec)
		}
		return g
	}
	tests := []struct {
		name    string
		grant   *fleetv1.NodeGrant
		wantErr string
	}{
		{"every node to one namespace", grant("ok-all", nil), ""},
		{"full", grant("ok-full", func(s *fleetv1.NodeGrantSpec) {
			s.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"tenant": "a"}}
			s.NodeSelector = metav1.LabelSelector{MatchLabels: map[string]string{"pool": "a"}}
			s.RunAs = &fleetv1.RunAsPolicy{Users: []fleetv1.IDRange{{Min: 1000, Max: 1999}}, Groups: []fleetv1.IDRange{{Min: 1000, Max: 1000}}}
			s.HostDirs = []string{"/srv/data"}
		}), ""},
		{"no namespaces", grant("bad-ns", func(s *fleetv1.NodeGrantSpec) { s.Namespaces = nil }), "name the namespaces"},
		{"bad namespace name", grant("bad-ns-name", func(s *fleetv1.NodeGrantSpec) { s.Namespaces = []string{"Team A"} }), "namespaces"},
		{"range upside down", grant("bad-range", func(s *fleetv1.NodeGrantSpec) {
			s.RunAs = &fleetv1.RunAsPolicy{Users: []fleetv1.IDRange{{Min: 2000, Max: 1000}}}
		}), "min must not be above max"},
		{"relative host dir", grant("bad-dir", func(s *fleetv1.NodeGrantSpec) { s.HostDirs = []string{"srv"} }), "hostDirs"},
		{"host dir with ..", grant("bad-dir2", func(s *fleetv1.NodeGrantSpec) { s.HostDirs = []string{"/srv/../etc"} }), "no '..' segments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := env.Client.Create(ctx, tt.grant)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("create: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("create: %v, want an error mentioning %q", err, tt.wantErr)
			}
		})
	}
}

// TestResourceNames checks the admission policy's name rule: a name that
// is neither standard nor domain-prefixed is refused on each kind, naming
// the field; standard and extended names pass.
func TestResourceNames(t *testing.T) {
	ctx := context.Background()
	bad := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), "memroy": resource.MustParse("1Gi")}
	spec := batchv1.TaskSpec{Command: []string{"true"}, Resources: bad}
	tests := []struct {
		obj  client.Object
		want string
	}{
		{&batchv1.Task{ObjectMeta: metav1.ObjectMeta{Name: "typo-task", Namespace: "default"}, Spec: spec},
			"spec.resources[memroy]: not a resource name"},
		{&batchv1.TaskGroup{ObjectMeta: metav1.ObjectMeta{Name: "typo-group", Namespace: "default"},
			Spec: batchv1.TaskGroupSpec{Count: 1, Template: batchv1.TaskTemplate{Spec: spec}}},
			"spec.template.spec.resources[memroy]: not a resource name"},
		{&batchv1.FleetJob{ObjectMeta: metav1.ObjectMeta{Name: "typo-job", Namespace: "default"},
			Spec: batchv1.FleetJobSpec{TaskGroups: []batchv1.TaskGroupTemplate{
				{Name: "fine", Count: 1, Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{Command: []string{"true"}}}},
				{Name: "scan", Count: 1, Template: batchv1.TaskTemplate{Spec: spec}},
			}}},
			"spec.taskGroups[scan].template.spec.resources[memroy]: not a resource name"},
		{&batchv1.Task{ObjectMeta: metav1.ObjectMeta{Name: "reserved-task", Namespace: "default"},
			Spec: batchv1.TaskSpec{Command: []string{"true"}, Resources: corev1.ResourceList{"kubernetes.io/fpga": resource.MustParse("1")}}},
			"spec.resources[kubernetes.io/fpga]: not a resource name"},
	}
	for _, tt := range tests {
		t.Run(tt.obj.GetName(), func(t *testing.T) {
			var err error
			testkit.Wait(ctx, testkit.DefaultTimeout, func() string {
				if err = env.Client.Create(ctx, tt.obj.DeepCopyObject().(client.Object)); err != nil {
					return ""
				}
				if err := env.Client.Delete(ctx, tt.obj); err != nil {
					t.Fatalf("delete what was accepted before the policy was loaded: %v", err)
				}
				return "the policy is not enforced yet"
			})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("create with resource name memroy: %v; want an error saying %q", err, tt.want)
			}
		})
	}
	ok := &batchv1.Task{ObjectMeta: metav1.ObjectMeta{Name: "named-task", Namespace: "default"},
		Spec: batchv1.TaskSpec{Command: []string{"true"}, Resources: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi"),
			corev1.ResourceEphemeralStorage: resource.MustParse("1Gi"), "gpu": resource.MustParse("1"),
			"example.com/fpga": resource.MustParse("2"), "vendor/widget": resource.MustParse("1")}}}
	if err := env.Client.Create(ctx, ok); err != nil {
		t.Fatalf("standard and extended names: %v", err)
	}
}

// TestPerNodeOrCount: a group has a count or is perNode, not both.
func TestPerNodeOrCount(t *testing.T) {
	ctx := context.Background()
	tmpl := batchv1.TaskTemplate{Spec: batchv1.TaskSpec{Command: []string{"true"}}}
	both := &batchv1.TaskGroup{ObjectMeta: metav1.ObjectMeta{Name: "both", Namespace: "default"},
		Spec: batchv1.TaskGroupSpec{Count: 2, PerNode: true, Template: tmpl}}
	if err := env.Client.Create(ctx, both); err == nil || !strings.Contains(err.Error(), "leave count unset") {
		t.Errorf("count 2 with perNode: %v; want a refusal", err)
	}
	job := &batchv1.FleetJob{ObjectMeta: metav1.ObjectMeta{Name: "both", Namespace: "default"},
		Spec: batchv1.FleetJobSpec{TaskGroups: []batchv1.TaskGroupTemplate{{Name: "a", Count: 3, PerNode: true, Template: tmpl}}}}
	if err := env.Client.Create(ctx, job); err == nil || !strings.Contains(err.Error(), "leave count unset") {
		t.Errorf("a job's group with count 3 and perNode: %v; want a refusal", err)
	}
	// Without count (as kubectl users write it): refused unless perNode.
	for _, tc := range []struct {
		name, spec, want string
	}{
		{"no-count", `{"template": {"spec": {"command": ["true"]}}}`, "count is required unless perNode is true"},
		{"per-node", `{"perNode": true, "template": {"spec": {"command": ["true"]}}}`, ""},
	} {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("batch.drover.io/v1alpha1")
		u.SetKind("TaskGroup")
		u.SetName(tc.name)
		u.SetNamespace("default")
		var spec map[string]any
		if err := json.Unmarshal([]byte(tc.spec), &spec); err != nil {
			t.Fatal(err)
		}
		u.Object["spec"] = spec
		err := env.Client.Create(ctx, u)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v; want accepted", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v; want an error saying %q", tc.name, err, tc.want)
		}
	}
}

// TestMultiTaskGroupValidation: spec.tasks is an alternative to
// spec.template, with at least one Main, and refused in a FleetJob's
// groups with an error that says so. The CRDs (with tasks' bounds) were
// installed by TestMain, so their CEL cost fits the apiserver's budget.
func TestMultiTaskGroupValidation(t *testing.T) {
	ctx := context.Background()
	spec := batchv1.TaskSpec{Command: []string{"true"}}
	group := func(name string, mutate func(*batchv1.TaskGroupSpec)) *batchv1.TaskGroup {
		g := &batchv1.TaskGroup{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: batchv1.TaskGroupSpec{Count: 1, Tasks: []batchv1.GroupTask{
				{Name: "setup", Lifecycle: batchv1.LifecycleInit, Spec: spec},
				{Name: "work", Spec: spec},
				{Name: "log", Lifecycle: batchv1.LifecycleSidecar, Spec: spec},
			}}}
		if mutate != nil {
			mutate(&g.Spec)
		}
		return g
	}
	tests := []struct {
		name    string
		group   *batchv1.TaskGroup
		wantErr string
	}{
		{"init, main and sidecar", group("mt-ok", nil), ""},
		{"both template and tasks", group("mt-both", func(s *batchv1.TaskGroupSpec) {
			s.Template = batchv1.TaskTemplate{Spec: spec}
		}), "exactly one of spec.template"},
		{"neither template nor tasks", group("mt-neither", func(s *batchv1.TaskGroupSpec) { s.Tasks = nil }), "exactly one of spec.template"},
		{"no main", group("mt-nomain", func(s *batchv1.TaskGroupSpec) { s.Tasks = s.Tasks[:1] }), "at least one task with lifecycle Main"},
		{"unknown lifecycle", group("mt-life", func(s *batchv1.TaskGroupSpec) { s.Tasks[1].Lifecycle = "Prestart" }), "lifecycle"},
		{"duplicate names", group("mt-dup", func(s *batchv1.TaskGroupSpec) { s.Tasks[2].Name = "work" }), "Duplicate value"},
		{"too many tasks", group("mt-many", func(s *batchv1.TaskGroupSpec) {
			for i := range batchv1.MaxGroupTasks {
				s.Tasks = append(s.Tasks, batchv1.GroupTask{Name: fmt.Sprintf("m%d", i), Spec: spec})
			}
		}), "spec.tasks"},
		{"a typo in a task's resources names the task", group("mt-res", func(s *batchv1.TaskGroupSpec) {
			s.Tasks[1].Spec.Resources = corev1.ResourceList{"memroy": resource.MustParse("1Gi")}
		}), "spec.tasks[work].spec.resources[memroy]"},
		{"long names", &batchv1.TaskGroup{ObjectMeta: metav1.ObjectMeta{Name: strings.Repeat("g", 200), Namespace: "default"},
			Spec: batchv1.TaskGroupSpec{Count: 1, Tasks: []batchv1.GroupTask{{Name: strings.Repeat("t", 60), Spec: spec}}}},
			"shorten them to 242 together"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := env.Client.Create(ctx, tt.group)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Create = %v, want it accepted", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("Create = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
	var got batchv1.TaskGroup
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "mt-ok"}, &got); err != nil {
		t.Fatal(err)
	}
	if role := got.Spec.Tasks[1].Lifecycle; role != batchv1.LifecycleMain {
		t.Errorf("defaulted lifecycle = %q, want Main", role)
	}
	job := &batchv1.FleetJob{ObjectMeta: metav1.ObjectMeta{Name: "mt-job", Namespace: "default"},
		Spec: batchv1.FleetJobSpec{TaskGroups: []batchv1.TaskGroupTemplate{{Name: "a", Count: 1,
			Template: batchv1.TaskTemplate{Spec: spec}, Tasks: []runtime.RawExtension{{Raw: []byte(`{"name":"x"}`)}}}}}}
	if err := env.Client.Create(ctx, job); err == nil || !strings.Contains(err.Error(), "not supported in a FleetJob yet") {
		t.Errorf("a FleetJob group with tasks: %v; want a refusal that says it is not supported", err)
	}
}
