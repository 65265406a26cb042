package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/controller-runtime/pkg/client"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
)

// Robot tasks (batch.drover.io) in `drover get` and `drover describe`.

// batchKinds maps the command line's spellings to the kinds.
var batchKinds = map[string]string{
	"fleetjobs": "FleetJob", "fleetjob": "FleetJob", "fj": "FleetJob",
	"taskgroups": "TaskGroup", "taskgroup": "TaskGroup", "tg": "TaskGroup",
	"tasks": "Task", "task": "Task", "tk": "Task",
}

// namespaceScope is where a `get` of namespaced kinds looks.
type namespaceScope struct {
	namespace string
	all       bool
}

func (s namespaceScope) listOptions(sel labels.Selector) []client.ListOption {
	opts := []client.ListOption{client.MatchingLabelsSelector{Selector: sel}}
	if !s.all {
		opts = append(opts, client.InNamespace(s.namespace))
	}
	return opts
}

// getBatch lists or gets the batch.drover.io objects of kind.
func getBatch(ctx context.Context, out, errOut io.Writer, c client.Client, kind string, scope namespaceScope, sel labels.Selector, names []string, now time.Time) error {
	var (
		objs []client.Object
		errs []error
	)
	newObj := map[string]func() client.Object{
		"FleetJob":  func() client.Object { return &batchv1.FleetJob{} },
		"TaskGroup": func() client.Object { return &batchv1.TaskGroup{} },
		"Task":      func() client.Object { return &batchv1.Task{} },
	}[kind]
	if len(names) > 0 {
		if scope.all {
			return errors.New("a name cannot be given with --all-namespaces")
		}
		for _, n := range names {
			o := newObj()
			if err := c.Get(ctx, client.ObjectKey{Namespace: scope.namespace, Name: n}, o); err != nil {
				if apierrors.IsNotFound(err) {
					errs = append(errs, fmt.Errorf("%s %s not found in namespace %s", kind, n, scope.namespace))
				} else {
					errs = append(errs, fmt.Errorf("get %s %s: %w", kind, n, err))
				}
				continue
			}
			if sel.Matches(labels.Set(o.GetLabels())) {
				objs = append(objs, o)
			}
		}
	} else {
		var err error
		switch kind {
		case "FleetJob":
			var l batchv1.FleetJobList
			err = c.List(ctx, &l, scope.listOptions(sel)...)
			for i := range l.Items {
				objs = append(objs, &l.Items[i])
			}
		case "TaskGroup":
			var l batchv1.TaskGroupList
			err = c.List(ctx, &l, scope.listOptions(sel)...)
			for i := range l.Items {
				objs = append(objs, &l.Items[i])
			}
		case "Task":
			var l batchv1.TaskList
			err = c.List(ctx, &l, scope.listOptions(sel)...)
			for i := range l.Items {
				objs = append(objs, &l.Items[i])
			}
		}
		if err != nil {
			return fmt.Errorf("list %ss: %w", kind, err)
		}
		if len(objs) == 0 {
			where := "in namespace " + scope.namespace
			if scope.all {
				where = "in any namespace"
			}
			fmt.Fprintf(errOut, "No %ss found %s.\n", kind, where)
			return nil
		}
	}
	if len(objs) > 0 {
		printBatch(out, kind, objs, scope.all, now)
	}
	return errors.Join(errs...)
}

// printBatch prints objs as kubectl prints the kinds' printer columns.
func printBatch(w io.Writer, kind string, objs []client.Object, withNS bool, now time.Time) {
	sort.Slice(objs, func(i, j int) bool {
		if objs[i].GetNamespace() != objs[j].GetNamespace() {
			return objs[i].GetNamespace() < objs[j].GetNamespace()
		}
		return objs[i].GetName() < objs[j].GetName()
	})
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	defer tw.Flush()
	ns := func(o client.Object) string {
		if withNS {
			return o.GetNamespace() + "\t"
		}
		return ""
	}
	head := ""
	if withNS {
		head = "NAMESPACE\t"
	}
	age := func(o client.Object) string { return duration.HumanDuration(now.Sub(o.GetCreationTimestamp().Time)) }
	switch kind {
	case "FleetJob":
		fmt.Fprintln(tw, head+"NAME\tPHASE\tDESIRED\tTASKS\tPENDING\tACTIVE\tCOMPLETED\tFAILED\tAGE")
		for _, o := range objs {
			j := o.(*batchv1.FleetJob)
			c := j.Status.Counts
			fmt.Fprintf(tw, "%s%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", ns(o), j.Name, orNone(string(j.Status.Phase)), j.Status.Desired, c.Total, c.Pending, active(c), c.Completed, c.Failed, age(o))
		}
	case "TaskGroup":
		// TASKS is a multi-task group's ended/all tasks over its instances
		// (<none> for a group of single tasks, whose counts say it all).
		fmt.Fprintln(tw, head+"NAME\tPHASE\tDESIRED\tTASKS\tPENDING\tACTIVE\tCOMPLETED\tFAILED\tAGE")
		for _, o := range objs {
			g := o.(*batchv1.TaskGroup)
			c := g.Status.Counts
			fmt.Fprintf(tw, "%s%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\n", ns(o), g.Name, orNone(string(g.Status.Phase)), desired(g.Spec.PerNode, g.Spec.Count, g.Status.Desired),
				orNone(g.Status.TaskProgress), c.Pending, active(c), c.Completed, c.Failed, age(o))
		}
	case "Task":
		fmt.Fprintln(tw, head+"NAME\tSTATE\tNODE\tATTEMPT\tEXIT\tREASON\tAGE")
		for _, o := range objs {
			t := o.(*batchv1.Task)
			fmt.Fprintf(tw, "%s%s\t%s\t%s\t%s\t%s\t%s\t%s\n", ns(o), t.Name, orNone(string(t.Status.State)), orNone(t.Status.NodeName),
				optInt(t.Status.Attempt), exitCode(t.Status.ExitCode), orNone(t.Status.Reason), age(o))
		}
	}
}

func optInt(n int32) string {
	if n == 0 {
		return "<none>"
	}
	return strconv.Itoa(int(n))
}

func exitCode(c *int32) string {
	if c == nil {
		return "<none>"
	}
	return strconv.Itoa(int(*c))
}

func when(t *metav1.Time, now time.Time) string {
	if t == nil {
		return "<none>"
	}
	if d := t.Sub(now); d > 0 {
		return t.UTC().Format(time.RFC3339) + " (in " + duration.HumanDuration(d) + ")"
	}
	return t.UTC().Format(time.RFC3339) + " (" + duration.HumanDuration(now.Sub(t.Time)) + " ago)"
}

// quoteArgv shows an argv vector so that each argument is visible as one.
func quoteArgv(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		if a == "" || strings.ContainsAny(a, " \t\n\"'\\$`|&;<>()*?[]#~") {
			q[i] = strconv.Quote(a)
		} else {
			q[i] = a
		}
	}
	return strings.Join(q, " ")
}

// describeTask prints a task's spec summary, state, attempts and output tail.
func describeTask(w io.Writer, t *batchv1.Task, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	p := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	p("Name", t.Name)
	p("Namespace", t.Namespace)
	if g := t.Labels[batchv1.LabelTaskGroup]; g != "" {
		p("TaskGroup", g)
	}
	if j := t.Labels[batchv1.LabelFleetJob]; j != "" {
		p("FleetJob", j)
	}
	p("Created", when(&t.CreationTimestamp, now))
	if t.DeletionTimestamp != nil {
		p("Deleting", when(t.DeletionTimestamp, now)+", finalizers: "+strings.Join(t.Finalizers, ", "))
	}
	s := t.Spec
	p("Driver", orNone(s.Driver))
	p("Command", quoteArgv(s.Command))
	if len(s.Env) > 0 {
		var env []string
		for _, e := range s.Env {
			env = append(env, e.Name+"="+e.Value)
		}
		p("Env", strings.Join(env, " "))
	}
	if s.WorkingDir != "" {
		p("Working Dir", s.WorkingDir)
	}
	for i, a := range s.Artifacts {
		p(fmt.Sprintf("Artifact %d", i), a.Path+" <- "+a.URL+" (sha256 "+a.SHA256+")")
	}
	if len(s.Resources) > 0 {
		var rs []string
		for k, v := range s.Resources {
			rs = append(rs, string(k)+"="+v.String())
		}
		sort.Strings(rs)
		p("Resources", strings.Join(rs, " "))
	}
	if s.Timeout != nil {
		p("Timeout", s.Timeout.Duration.String())
	}
	if s.KillTimeout != nil {
		p("Kill Timeout", s.KillTimeout.Duration.String())
	}
	if s.NodeName != "" {
		p("Pinned To", s.NodeName)
	}
	if s.NodeSelector != nil {
		if sel, err := metav1.LabelSelectorAsSelector(s.NodeSelector); err == nil {
			p("Node Selector", sel.String())
		}
	}
	restart, reschedule := string(s.RestartPolicy), string(s.ReschedulePolicy)
	if restart == "" {
		restart = string(batchv1.RestartNever) + " (default)"
	}
	if reschedule == "" {
		reschedule = string(batchv1.RescheduleOnNodeLost) + " (default)"
	}
	p("Restart Policy", fmt.Sprintf("%s, reschedule %s, at most %d attempts", restart, reschedule, s.MaxAttempts))
	if s.Priority != 0 {
		p("Priority", strconv.Itoa(int(s.Priority)))
	}

	st := t.Status
	fmt.Fprintln(tw, "Status:\t")
	p("  State", orNone(string(st.State)))
	if st.Reason != "" {
		p("  Reason", st.Reason)
	}
	if st.Message != "" {
		p("  Message", st.Message)
	}
	p("  Node", orNone(st.NodeName))
	p("  Attempt", optInt(st.Attempt))
	p("  Exit Code", exitCode(st.ExitCode))
	p("  Started", when(st.StartTime, now))
	p("  Finished", when(st.FinishTime, now))
	if st.NextAttemptTime != nil {
		p("  Next Attempt", when(st.NextAttemptTime, now))
	}
	tw.Flush()

	if len(st.History) > 0 {
		fmt.Fprintln(w, "Attempts:")
		hw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
		fmt.Fprintln(hw, "  ATTEMPT\tNODE\tSTATE\tREASON\tEXIT\tSTARTED\tFINISHED")
		ts := func(t *metav1.Time) string {
			if t == nil {
				return "<none>"
			}
			return t.UTC().Format(time.RFC3339)
		}
		for _, a := range st.History {
			fmt.Fprintf(hw, "  %d\t%s\t%s\t%s\t%s\t%s\t%s\n", a.Attempt, orNone(a.Node), orNone(string(a.State)), orNone(a.Reason), exitCode(a.ExitCode), ts(a.StartTime), ts(a.FinishTime))
		}
		if last := st.History[len(st.History)-1]; st.Attempt > last.Attempt {
			fmt.Fprintf(hw, "  %d (now)\t%s\t%s\t%s\t%s\t%s\t%s\n", st.Attempt, orNone(st.NodeName), orNone(string(st.State)), orNone(st.Reason), exitCode(st.ExitCode), ts(st.StartTime), ts(st.FinishTime))
		}
		hw.Flush()
	}
	if len(st.Conditions) > 0 {
		fmt.Fprintln(w, "Conditions:")
		for _, c := range st.Conditions {
			fmt.Fprintf(w, "  %s=%s  %s: %s\n", c.Type, c.Status, c.Reason, c.Message)
		}
	}
	if n := len(st.History); n > 0 && st.History[n-1].OutputTail != "" {
		fmt.Fprintf(w, "Output of attempt %d (tail; `drover logs --previous`):\n", st.History[n-1].Attempt)
		printIndented(w, st.History[n-1].OutputTail)
	}
	if st.OutputTail != "" {
		fmt.Fprintln(w, "Output (tail of stdout and stderr; `drover logs [--stream stderr]` shows all):")
		printIndented(w, st.OutputTail)
	}
}

func printIndented(w io.Writer, text string) {
	for _, line := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		fmt.Fprintln(w, "  "+line)
	}
}

// previousOutput is the output tail of the task's attempt before the
// current one, as its status keeps it.
func previousOutput(t *batchv1.Task) (string, error) {
	n := len(t.Status.History)
	if n == 0 {
		return "", fmt.Errorf("task %s/%s has no previous attempt (it is at attempt %d)", t.Namespace, t.Name, t.Status.Attempt)
	}
	a := t.Status.History[n-1]
	if a.OutputTail == "" {
		return "", fmt.Errorf("attempt %d of task %s/%s (%s on node %s) left no output in the task's status", a.Attempt, t.Namespace, t.Name, orNone(string(a.State)), orNone(a.Node))
	}
	return a.OutputTail, nil
}

func describeTaskCommand(cmd *cobra.Command, g *globalOptions, namespace, name string) error {
	c, err := g.client()
	if err != nil {
		return err
	}
	var t batchv1.Task
	if err := c.Get(cmd.Context(), client.ObjectKey{Namespace: namespace, Name: name}, &t); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("task %s not found in namespace %s", name, namespace)
		}
		return fmt.Errorf("get task %s/%s: %w", namespace, name, err)
	}
	now := time.Now()
	describeTask(cmd.OutOrStdout(), &t, now)
	// Events as kubectl describe shows them; a cluster that will not list
	// them still gets the task described.
	var evs corev1.EventList
	if err := c.List(cmd.Context(), &evs, client.InNamespace(namespace), client.MatchingFields{"involvedObject.uid": string(t.UID)}); err == nil {
		describeEvents(cmd.OutOrStdout(), evs.Items, now)
	}
	return nil
}

// describeEvents prints events oldest first.
func describeEvents(w io.Writer, evs []corev1.Event, now time.Time) {
	if len(evs) == 0 {
		fmt.Fprintln(w, "Events:  <none>")
		return
	}
	at := func(e corev1.Event) time.Time {
		switch {
		case !e.EventTime.IsZero():
			return e.EventTime.Time
		case !e.LastTimestamp.IsZero():
			return e.LastTimestamp.Time
		}
		return e.CreationTimestamp.Time
	}
	sort.SliceStable(evs, func(i, j int) bool { return at(evs[i]).Before(at(evs[j])) })
	fmt.Fprintln(w, "Events:")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  TYPE\tREASON\tAGE\tFROM\tMESSAGE")
	for _, e := range evs {
		from := e.ReportingController
		if from == "" {
			from = e.Source.Component
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", e.Type, e.Reason, duration.HumanDuration(now.Sub(at(e))), orNone(from), e.Message)
	}
	tw.Flush()
}

// active counts the tasks a node holds, from the parts, so that a status
// written before counts.active existed shows them too.
func active(c batchv1.TaskCounts) int32 { return c.Scheduled + c.Dispatching + c.Running }

// desired is a group's DESIRED column: its count, or for a perNode group
// the nodes that match now, marked as such.
func desired(perNode bool, count, status int32) string {
	if perNode {
		return fmt.Sprintf("%d (per node)", status)
	}
	return fmt.Sprint(count)
}
