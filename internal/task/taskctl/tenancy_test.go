package taskctl_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/task/taskctl"
	"github.com/drover-fleet/drover/internal/testenv"
)

func probeTask(ns, name string, mutate func(*batchv1.Task)) *batchv1.Task {
	tk := &batchv1.Task{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: batchv1.TaskSpec{Command: []string{"true"}}}
	if mutate != nil {
		mutate(tk)
	}
	return tk
}

func create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := env.Client.Create(context.Background(), obj); err != nil {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

// waitEvent waits for an Event of reason on the object named regarding
// whose note holds note.
func waitEvent(t *testing.T, ns, regarding, reason, typ, note string) {
	t.Helper()
	testenv.Eventually(t, waitTimeout, fmt.Sprintf("a %s Event on %s", reason, regarding), func(ctx context.Context) (bool, error) {
		var evs eventsv1.EventList
		if err := env.Client.List(ctx, &evs, client.InNamespace(ns)); err != nil {
			return false, err
		}
		var seen []string
		for _, e := range evs.Items {
			if e.Regarding.Name == regarding && e.Reason == reason && e.Type == typ && strings.Contains(e.Note, note) {
				return true, nil
			}
			seen = append(seen, e.Regarding.Name+" "+e.Reason+": "+e.Note)
		}
		return false, fmt.Errorf("events: %q", seen)
	})
}

func notGranted(contains string) func(*batchv1.Task) bool {
	return func(tk *batchv1.Task) bool {
		return tk.Status.State == batchv1.TaskPending && tk.Status.Reason == taskctl.ReasonNotGranted && strings.Contains(tk.Status.Message, contains)
	}
}

// A namespace without a NodeGrant runs nothing: its task waits, says why
// (reason NotGranted, the policy's words, an Event), and is placed as soon
// as an administrator grants the namespace a node.
func TestTaskWaitsForAGrant(t *testing.T) {
	ns := startWith(t, "tenancy-wait", taskctl.Options{}, false)
	node(t, "tw-node", fleetv1.FleetNodeOnline, nil, nil)
	create(t, probeTask(ns, "waits", nil))

	tk := waitTask(t, ns, "waits", "not granted", notGranted(fmt.Sprintf("namespace %q has no NodeGrant", ns)))
	if want := "0/1 nodes are available: 1 not granted to the namespace."; !strings.HasPrefix(tk.Status.Message, want) {
		t.Errorf("message %q, want it to start with %q", tk.Status.Message, want)
	}
	if c := meta.FindStatusCondition(tk.Status.Conditions, taskctl.ConditionScheduled); c == nil || c.Status != metav1.ConditionFalse ||
		c.Reason != taskctl.ReasonNotGranted || c.Message != tk.Status.Message {
		t.Errorf("Scheduled condition = %+v, want False NotGranted with the status's message", c)
	}
	waitEvent(t, ns, "waits", taskctl.ReasonNotGranted, corev1.EventTypeWarning, "has no NodeGrant")

	grant(t, "tw-"+ns, fleetv1.NodeGrantSpec{Namespaces: []string{ns}})
	tk = waitTask(t, ns, "waits", "scheduled once granted", stateIs(batchv1.TaskScheduled, 1))
	if tk.Status.NodeName != "tw-node" {
		t.Errorf("placed on %q, want tw-node", tk.Status.NodeName)
	}
}

// Placement stays inside what the namespace is granted: a task pinned to
// an ungranted node is refused in the policy's words and placed once a
// grant by the namespace's labels reaches the node; removing the grants
// stops nothing already placed (IgnoredDuringExecution), but new work
// waits again.
func TestPlacementStaysInsideTheGrants(t *testing.T) {
	ns := startWith(t, "tenancy-place", taskctl.Options{}, false)
	node(t, "tp-lab", fleetv1.FleetNodeOnline, nil, map[string]string{"pool": "tp-lab"})
	node(t, "tp-prod", fleetv1.FleetNodeOnline, nil, map[string]string{"pool": "tp-prod"})
	grant(t, "tp-lab-"+ns, fleetv1.NodeGrantSpec{Namespaces: []string{ns},
		NodeSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pool": "tp-lab"}}})
	// Granted by label, to namespaces that do not carry it yet.
	prod := grant(t, "tp-prod-"+ns, fleetv1.NodeGrantSpec{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tenant": ns}},
		NodeSelector:      metav1.LabelSelector{MatchLabels: map[string]string{"pool": "tp-prod"}}})

	for i := range 3 {
		create(t, probeTask(ns, fmt.Sprintf("free-%d", i), nil))
	}
	create(t, probeTask(ns, "pinned", func(tk *batchv1.Task) { tk.Spec.NodeName = "tp-prod" }))
	root := int64(0)
	create(t, probeTask(ns, "root", func(tk *batchv1.Task) { tk.Spec.SecurityContext = &batchv1.TaskSecurityContext{RunAsUser: &root} }))

	for i := range 3 {
		tk := waitTask(t, ns, fmt.Sprintf("free-%d", i), "scheduled", stateIs(batchv1.TaskScheduled, 1))
		if tk.Status.NodeName != "tp-lab" {
			t.Errorf("free-%d placed on %s, want tp-lab, the only granted node", i, tk.Status.NodeName)
		}
	}
	want := fmt.Sprintf(`node "tp-prod" is not granted to namespace %q for this work: NodeGrant "tp-lab-%s" grants only nodes pool=tp-lab`, ns, ns)
	tk := waitTask(t, ns, "pinned", "refused by the policy", notGranted(want))
	if c := meta.FindStatusCondition(tk.Status.Conditions, taskctl.ConditionScheduled); c == nil || c.Reason != taskctl.ReasonNotGranted || c.Message != want {
		t.Errorf("Scheduled condition = %+v, want NotGranted: %s", c, want)
	}
	waitEvent(t, ns, "pinned", taskctl.ReasonNotGranted, corev1.EventTypeWarning, want)
	waitTask(t, ns, "root", "refused: no grant allows root", notGranted(`does not allow runAsUser 0`))

	// The namespace's label brings it under the second grant.
	patch := client.RawPatch("application/merge-patch+json", fmt.Appendf(nil, `{"metadata":{"labels":{"tenant":%q}}}`, ns))
	if err := env.Client.Patch(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, patch); err != nil {
		t.Fatal(err)
	}
	tk = waitTask(t, ns, "pinned", "scheduled once the namespace is labelled", stateIs(batchv1.TaskScheduled, 1))
	if tk.Status.NodeName != "tp-prod" {
		t.Errorf("pinned placed on %s", tk.Status.NodeName)
	}
	hub(t, ns, "pinned", 1, batchv1.TaskRunning, nil, "", tk.CreationTimestamp.Time)

	// Narrowed: what runs keeps running, new work waits.
	if err := env.Client.Delete(context.Background(), prod); err != nil {
		t.Fatal(err)
	}
	create(t, probeTask(ns, "after", func(tk *batchv1.Task) { tk.Spec.NodeName = "tp-prod" }))
	waitTask(t, ns, "after", "refused after the grant went", notGranted(`node "tp-prod" is not granted`))
	// The loop that refused "after" saw "pinned" and left it alone.
	if tk := getTask(t, ns, "pinned"); tk.Status.State != batchv1.TaskRunning || tk.Status.NodeName != "tp-prod" || tk.Status.Attempt != 1 {
		t.Errorf("running task after its grant went: %s on %q attempt %d, want Running on tp-prod attempt 1", tk.Status.State, tk.Status.NodeName, tk.Status.Attempt)
	}
	if tk := getTask(t, ns, "root"); tk.Status.Reason != taskctl.ReasonNotGranted {
		t.Errorf("root task: %s %s: %s", tk.Status.State, tk.Status.Reason, tk.Status.Message)
	}
}

// refuseTasks stands in for the tenancy admission webhook (another
// package): a ValidatingAdmissionPolicy that refuses every Task created in
// ns, in force once a dry-run create is refused. It returns a func that
// lifts it and waits until creates pass again.
func refuseTasks(t *testing.T, ns, message string) (lift func()) {
	t.Helper()
	ctx := context.Background()
	name := "refuse-tasks-" + ns
	policy := &admissionv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr(admissionv1.Fail),
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{Operations: []admissionv1.OperationType{admissionv1.Create},
					Rule: admissionv1.Rule{APIGroups: []string{batchv1.GroupVersion.Group}, APIVersions: []string{"*"}, Resources: []string{"tasks"}}},
			}}},
			Validations: []admissionv1.Validation{{Expression: "false", Message: message, Reason: ptr(metav1.StatusReasonForbidden)}},
		}}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: name, ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
			MatchResources: &admissionv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{corev1.LabelMetadataName: ns}}}}}
	create(t, policy)
	create(t, binding)
	deleted := false
	remove := func() {
		if deleted {
			return
		}
		deleted = true
		for _, o := range []client.Object{binding, policy} {
			if err := env.Client.Delete(ctx, o); client.IgnoreNotFound(err) != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(remove)
	refusedNow := func(want bool) func(context.Context) (bool, error) {
		return func(ctx context.Context) (bool, error) {
			err := env.Client.Create(ctx, probeTask(ns, "probe", nil), client.DryRunAll)
			if (err != nil) != want {
				return false, fmt.Errorf("dry-run create: %v", err)
			}
			return true, nil
		}
	}
	testenv.Eventually(t, waitTimeout, "the stand-in policy refuses tasks", refusedNow(true))
	return func() {
		remove()
		testenv.Eventually(t, waitTimeout, "the stand-in policy gone", refusedNow(false))
	}
}

// A FleetJob whose Tasks the API refuses (the tenancy webhook will) says
// why on its TaskGroup and on itself, as a CreateFailed condition and a
// FailedCreate Event, without asking again in a hot loop; once the API
// lets them through, the tasks are made and the condition goes.
func TestRefusedTaskCreatesAreShown(t *testing.T) {
	// No retry before the test ends: only the watch can bring the group back.
	ns := startWith(t, "tenancy-refused", taskctl.Options{CreateRetry: time.Hour}, true)
	const message = "refused by the stand-in for the tenancy webhook"
	lift := refuseTasks(t, ns, message)
	errorsBefore := counter(t, "controller_runtime_reconcile_errors_total", "controller", "taskgroup")

	create(t, &batchv1.FleetJob{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "job"},
		Spec: batchv1.FleetJobSpec{TaskGroups: []batchv1.TaskGroupTemplate{{Name: "g", Count: 2,
			Template: batchv1.TaskTemplate{Spec: batchv1.TaskSpec{Command: []string{"true"}}}}}}})

	var g batchv1.TaskGroup
	testenv.WaitFor(t, env.Client, waitTimeout, client.ObjectKey{Namespace: ns, Name: "job-g"}, &g, func(client.Object) bool {
		return meta.IsStatusConditionTrue(g.Status.Conditions, taskctl.ConditionCreateFailed)
	})
	c := meta.FindStatusCondition(g.Status.Conditions, taskctl.ConditionCreateFailed)
	if c.Reason != taskctl.ReasonFailedCreate || !strings.HasPrefix(c.Message, "the API refused Task job-g-0 (and 1 more): ") || !strings.Contains(c.Message, message) {
		t.Errorf("TaskGroup CreateFailed = %+v, want FailedCreate naming job-g-0 and the API's message", c)
	}
	if g.Status.Phase != batchv1.GroupPending || g.Status.Counts.Pending != 2 {
		t.Errorf("group %s with counts %+v, want Pending with 2 pending", g.Status.Phase, g.Status.Counts)
	}
	waitEvent(t, ns, "job-g", taskctl.ReasonFailedCreate, corev1.EventTypeWarning, message)

	var job batchv1.FleetJob
	testenv.WaitFor(t, env.Client, waitTimeout, client.ObjectKey{Namespace: ns, Name: "job"}, &job, func(client.Object) bool {
		c := meta.FindStatusCondition(job.Status.Conditions, taskctl.ConditionCreateFailed)
		return c != nil && c.Status == metav1.ConditionTrue && strings.HasPrefix(c.Message, "TaskGroup job-g: the API refused Task job-g-0") &&
			strings.Contains(c.Message, message)
	})
	waitEvent(t, ns, "job", taskctl.ReasonFailedCreate, corev1.EventTypeWarning, message)
	// A refusal is an answer, not an error: no error backoff, no hot loop.
	if n := counter(t, "controller_runtime_reconcile_errors_total", "controller", "taskgroup") - errorsBefore; n != 0 {
		t.Errorf("%v reconcile errors for refused creates, want none", n)
	}

	// The API lets tasks through again (as the webhook does once a grant
	// allows them); a change of the namespace's labels (or of a NodeGrant)
	// brings the group back at once.
	lift()
	patch := client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"labels":{"tenancy-test":"relabelled"}}}`))
	if err := env.Client.Patch(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, patch); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, env.Client, waitTimeout, client.ObjectKey{Namespace: ns, Name: "job-g"}, &g, func(client.Object) bool {
		return meta.FindStatusCondition(g.Status.Conditions, taskctl.ConditionCreateFailed) == nil && g.Status.Counts.Total == 2
	})
	if n := len(tasksOf(t, ns)); n != 2 {
		t.Errorf("%d tasks, want 2", n)
	}
	testenv.WaitFor(t, env.Client, waitTimeout, client.ObjectKey{Namespace: ns, Name: "job"}, &job, func(client.Object) bool {
		return meta.FindStatusCondition(job.Status.Conditions, taskctl.ConditionCreateFailed) == nil
	})
}
