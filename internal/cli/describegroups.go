package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	"github.com/drover-fleet/drover/internal/kname"
)

// maxDescribedTasks bounds the task table of a described job or group: the
// failed ones first, then the rest, so a large group stays readable.
const maxDescribedTasks = 20

// describeGroupOrJob prints a FleetJob or a TaskGroup (kind), its counts,
// conditions, its groups (a job's), its tasks (failed first) and Events.
func describeGroupOrJob(ctx context.Context, w io.Writer, c client.Client, kind, namespace, name string, now time.Time) error {
	var (
		obj    client.Object
		sel    client.MatchingLabels
		status func(tw io.Writer)
	)
	p := func(tw io.Writer, k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	counts := func(tw io.Writer, unit string, phase batchv1.GroupPhase, c batchv1.TaskCounts, conds []metav1.Condition) {
		p(tw, "Phase", orNone(string(phase)))
		p(tw, unit, fmt.Sprintf("%d total: %d pending, %d active (%d scheduled, %d dispatching, %d running), %d completed, %d failed",
			c.Total, c.Pending, active(c), c.Scheduled, c.Dispatching, c.Running, c.Completed, c.Failed))
		for _, cd := range conds {
			p(tw, "Condition "+cd.Type, fmt.Sprintf("%s (%s) %s", cd.Status, cd.Reason, cd.Message))
		}
	}
	switch kind {
	case "FleetJob":
		var j batchv1.FleetJob
		obj, sel = &j, client.MatchingLabels{batchv1.LabelFleetJob: kname.LabelValue(name)}
		status = func(tw io.Writer) {
			if j.Spec.NodeSelector != nil {
				p(tw, "Node Selector", metav1.FormatLabelSelector(j.Spec.NodeSelector))
			}
			p(tw, "Priority", fmt.Sprint(j.Spec.Priority))
			restart, reschedule := batchv1.RestartNever, batchv1.RescheduleOnNodeLost // unset: the tasks' defaults
			if j.Spec.RestartPolicy != "" {
				restart = j.Spec.RestartPolicy
			}
			if j.Spec.ReschedulePolicy != "" {
				reschedule = j.Spec.ReschedulePolicy
			}
			p(tw, "Policies", fmt.Sprintf("restart %s, reschedule %s", restart, reschedule))
			if d := j.Spec.ActiveDeadlineSeconds; d != nil {
				p(tw, "Active Deadline", fmt.Sprintf("%ds for each group", *d))
			}
			counts(tw, "Tasks", j.Status.Phase, j.Status.Counts, j.Status.Conditions)
			tw.(*tabwriter.Writer).Flush()
			fmt.Fprintln(w, "Groups:")
			gw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
			fmt.Fprintln(gw, "  NAME\tDESIRED\tPHASE\tPENDING\tACTIVE\tCOMPLETED\tFAILED")
			phases := map[string]batchv1.GroupSummary{}
			for _, g := range j.Status.Groups {
				phases[g.Name] = g
			}
			for _, g := range j.Spec.TaskGroups {
				s := phases[g.Name]
				fmt.Fprintf(gw, "  %s\t%s\t%s\t%d\t%d\t%d\t%d\n", j.Name+"-"+g.Name, desired(g.PerNode, g.Count, s.Desired), orNone(string(s.Phase)),
					s.Counts.Pending, active(s.Counts), s.Counts.Completed, s.Counts.Failed)
			}
			gw.Flush()
		}
	case "TaskGroup":
		var g batchv1.TaskGroup
		obj, sel = &g, client.MatchingLabels{batchv1.LabelTaskGroup: kname.LabelValue(name)}
		status = func(tw io.Writer) {
			if owner := metav1.GetControllerOf(&g); owner != nil {
				p(tw, owner.Kind, owner.Name)
			}
			if g.Spec.PerNode {
				p(tw, "Per Node", fmt.Sprintf("one task on each matching node: %d now", g.Status.Desired))
			} else {
				p(tw, "Count", fmt.Sprint(g.Spec.Count))
			}
			if d := g.Spec.ActiveDeadlineSeconds; d != nil {
				p(tw, "Active Deadline", fmt.Sprintf("%ds, until %s", *d, g.CreationTimestamp.Add(time.Duration(*d)*time.Second).UTC().Format(time.RFC3339)))
			}
			if len(g.Spec.Tasks) > 0 {
				describeGroupTasks(tw, &g, p)
				counts(tw, "Instances", g.Status.Phase, g.Status.Counts, g.Status.Conditions)
				tw.(*tabwriter.Writer).Flush()
				return
			}
			p(tw, "Command", quoteArgv(g.Spec.Template.Spec.Command))
			if g.Spec.Template.Spec.NodeSelector != nil {
				p(tw, "Node Selector", metav1.FormatLabelSelector(g.Spec.Template.Spec.NodeSelector))
			}
			if m := g.Spec.Template.Spec.MaxPerNode; m != nil {
				p(tw, "Max Per Node", fmt.Sprint(*m))
			}
			counts(tw, "Tasks", g.Status.Phase, g.Status.Counts, g.Status.Conditions)
			tw.(*tabwriter.Writer).Flush()
		}
	default:
		return fmt.Errorf("cannot describe %s", kind)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("%s %s not found in namespace %s", kind, name, namespace)
		}
		return fmt.Errorf("get %s %s/%s: %w", kind, namespace, name, err)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	p(tw, "Name", obj.GetName())
	p(tw, "Namespace", obj.GetNamespace())
	created := obj.GetCreationTimestamp()
	p(tw, "Created", when(&created, now))
	status(tw)

	var tasks batchv1.TaskList
	if err := c.List(ctx, &tasks, client.InNamespace(namespace), sel); err != nil {
		return fmt.Errorf("list the tasks of %s %s: %w", kind, name, err)
	}
	describeTaskTable(w, tasks.Items)
	var evs corev1.EventList
	if err := c.List(ctx, &evs, client.InNamespace(namespace), client.MatchingFields{"involvedObject.uid": string(obj.GetUID())}); err == nil {
		describeEvents(w, evs.Items, now)
	}
	return nil
}

// describeTaskTable lists tasks, failed first, at most maxDescribedTasks.
func describeTaskTable(w io.Writer, tasks []batchv1.Task) {
	if len(tasks) == 0 {
		fmt.Fprintln(w, "Tasks:  <none>")
		return
	}
	sort.SliceStable(tasks, func(i, k int) bool {
		fi, fk := tasks[i].Status.State == batchv1.TaskFailed, tasks[k].Status.State == batchv1.TaskFailed
		if fi != fk {
			return fi
		}
		return tasks[i].Name < tasks[k].Name
	})
	fmt.Fprintln(w, "Tasks:")
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "  NAME\tSTATE\tNODE\tATTEMPT\tEXIT\tREASON\tMESSAGE")
	for i, t := range tasks {
		if i == maxDescribedTasks {
			fmt.Fprintf(tw, "  … %d more (drover get tasks -l %s)\n", len(tasks)-i, taskSelectorHint(t))
			break
		}
		st := t.Status
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%s\t%s\t%s\n", t.Name, orNone(string(st.State)), orNone(st.NodeName), st.Attempt,
			exitCode(st.ExitCode), orNone(st.Reason), clipText(st.Message, 80))
	}
	tw.Flush()
}

func taskSelectorHint(t batchv1.Task) string {
	if j := t.Labels[batchv1.LabelFleetJob]; j != "" {
		return batchv1.LabelFleetJob + "=" + j
	}
	return batchv1.LabelTaskGroup + "=" + t.Labels[batchv1.LabelTaskGroup]
}

// clipText shortens s to at most n runes for a table cell.
func clipText(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// describeGroupTasks shows a multi-task group's tasks, in order, with
// their progress over the instances (counts then count instances).
func describeGroupTasks(tw io.Writer, g *batchv1.TaskGroup, p func(io.Writer, string, string)) {
	p(tw, "Tasks", fmt.Sprintf("%s ended (init, main and sidecar tasks over all instances; each instance on one node)", orNone(g.Status.TaskProgress)))
	byName := map[string]batchv1.GroupTaskStatus{}
	for _, s := range g.Status.Tasks {
		byName[s.Name] = s
	}
	for _, d := range g.Spec.Tasks {
		s := byName[d.Name]
		p(tw, "  "+d.Name, fmt.Sprintf("%s: %s; waiting %d, active %d, completed %d, failed %d, stopped %d",
			d.Role(), quoteArgv(d.Spec.Command), s.Waiting, s.Active, s.Completed, s.Failed, s.Stopped))
	}
}
