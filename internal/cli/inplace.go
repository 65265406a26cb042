package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
	"github.com/drover-fleet/drover/internal/inplace/inplacectl"
)

// inplaceKind is one of the in-place update kinds `drover get` lists.
type inplaceKind string

const (
	kindPools inplaceKind = "pools"
	kindPlans inplaceKind = "plans"
	kindNHC   inplaceKind = "nodehealthchecks"
)

// inplaceKinds maps what `drover get` accepts to a kind (names, singular
// names and the CRDs' short names).
var inplaceKinds = map[string]inplaceKind{
	"pools": kindPools, "pool": kindPools, "nodepools": kindPools, "nodepool": kindPools, "np": kindPools,
	"plans": kindPlans, "plan": kindPlans, "inplaceupdateplans": kindPlans, "inplaceupdateplan": kindPlans, "iup": kindPlans,
	"nodehealthchecks": kindNHC, "nodehealthcheck": kindNHC, "nhc": kindNHC,
}

// getInPlace lists pools, plans or health checks (all, or those named).
func getInPlace(ctx context.Context, w, errw io.Writer, c client.Reader, kind inplaceKind, names []string, now time.Time) error {
	var (
		list client.ObjectList
		errs []error
	)
	switch kind {
	case kindPools:
		list = &updatev1.NodePoolList{}
	case kindPlans:
		list = &updatev1.InPlaceUpdatePlanList{}
	default:
		list = &updatev1.NodeHealthCheckList{}
	}
	if err := c.List(ctx, list); err != nil {
		return fmt.Errorf("list %s: %w", kind, err)
	}
	keep := func(name string) bool {
		if len(names) == 0 {
			return true
		}
		for _, n := range names {
			if n == name {
				return true
			}
		}
		return false
	}
	found := map[string]bool{}
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	rows := 0
	switch l := list.(type) {
	case *updatev1.NodePoolList:
		sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Name < l.Items[j].Name })
		for _, p := range l.Items {
			if !keep(p.Name) {
				continue
			}
			if rows == 0 {
				fmt.Fprintln(tw, "NAME\tSTRATEGY\tNODES\tUPDATED\tUPDATE\tPLAN\tREASON\tAGE")
			}
			rows++
			found[p.Name] = true
			reason := conditionReason(p.Status.Conditions, updatev1.InPlaceUpdateCondition)
			if c := meta.FindStatusCondition(p.Status.Conditions, updatev1.PreflightBlockedCondition); c != nil && c.Status == "True" {
				reason = updatev1.PreflightBlockedCondition + ": " + c.Reason
			}
			strategy := string(p.Spec.Strategy.Type)
			if p.Spec.Strategy.MaxUnavailable != nil {
				strategy += "(" + p.Spec.Strategy.MaxUnavailable.String() + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", p.Name, orNone(strategy), p.Status.Nodes, p.Status.UpdatedNodes,
				orNone(string(p.Status.UpdateStatus)), orNone(p.Labels[updatev1.LabelUpdateTaskName]), orNone(reason), duration.HumanDuration(now.Sub(p.CreationTimestamp.Time)))
		}
	case *updatev1.InPlaceUpdatePlanList:
		sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Name < l.Items[j].Name })
		for _, p := range l.Items {
			if !keep(p.Name) {
				continue
			}
			if rows == 0 {
				fmt.Fprintln(tw, "NAME\tPHASE\tSTATUS\tSEQUENCE\tNODES\tUPDATED\tFAILED\tWHY\tAGE")
			}
			rows++
			found[p.Name] = true
			why := ""
			if c := meta.FindStatusCondition(p.Status.Conditions, updatev1.FailedCondition); c != nil && c.Status == "True" {
				why = c.Message
			} else if c := meta.FindStatusCondition(p.Status.Conditions, "Waiting"); c != nil && c.Status == "True" {
				why = c.Message
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", p.Name, orNone(string(p.Spec.UpdatePhase)), orNone(string(p.Status.UpdateStatus)),
				p.Status.CurrentSequence, p.Status.Nodes.Total, p.Status.Nodes.Updated, p.Status.Nodes.Failed, orNone(why), duration.HumanDuration(now.Sub(p.CreationTimestamp.Time)))
		}
	case *updatev1.NodeHealthCheckList:
		sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Name < l.Items[j].Name })
		for _, h := range l.Items {
			if !keep(h.Name) {
				continue
			}
			if rows == 0 {
				fmt.Fprintln(tw, "NAME\tEXPECTED\tHEALTHY\tIN-UPDATE\tREMEDIATIONS\tWHY\tAGE")
			}
			rows++
			found[h.Name] = true
			why := ""
			if c := meta.FindStatusCondition(h.Status.Conditions, updatev1.RemediationAllowedCondition); c != nil {
				why = c.Message
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%s\n", h.Name, h.Status.ExpectedNodes, h.Status.CurrentHealthy, h.Status.InUpdate,
				h.Status.RemediationsAllowed, orNone(why), duration.HumanDuration(now.Sub(h.CreationTimestamp.Time)))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range names {
		if !found[n] {
			errs = append(errs, fmt.Errorf("%s %q not found", strings.TrimSuffix(string(kind), "s"), n))
		}
	}
	if rows == 0 && len(names) == 0 {
		fmt.Fprintf(errw, "No %s found.\n", kind)
	}
	return errors.Join(errs...)
}

func conditionReason(conds []metav1.Condition, typ string) string {
	if c := meta.FindStatusCondition(conds, typ); c != nil {
		return c.Reason
	}
	return ""
}

// isPlanKind reports whether arg names InPlaceUpdatePlans (for `drover abort`).
func isPlanKind(arg string) bool { return inplaceKinds[strings.ToLower(arg)] == kindPlans }

// abortPlan sets a plan's spec.updatePhase to aborting: running nodes abort
// their updater tasks, and every node ends updated or aborted.
func abortPlan(ctx context.Context, c client.Client, name string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var p updatev1.InPlaceUpdatePlan
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &p); err != nil {
			return fmt.Errorf("get plan %s: %w", name, err)
		}
		if p.Status.UpdateStatus.Done() {
			return fmt.Errorf("plan %s has already ended (%s)", name, p.Status.UpdateStatus)
		}
		if p.Spec.UpdatePhase == updatev1.PhaseAborting {
			return nil
		}
		p.Spec.UpdatePhase = updatev1.PhaseAborting
		return c.Update(ctx, &p)
	})
}

// newCordonCommand is `drover cordon NODE...` (or uncordon): an operator's
// cordon, which in-place updates leave as it is.
func newCordonCommand(g *globalOptions, cordon bool) *cobra.Command {
	use, short := "cordon NODE...", "Keep new tasks off nodes (spec.unschedulable); running tasks stay"
	if !cordon {
		use, short = "uncordon NODE...", "Let new tasks onto nodes again"
	}
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			return setCordon(cmd.Context(), cmd.OutOrStdout(), c, args, cordon)
		},
	}
}

// setCordon sets spec.unschedulable on nodes. An operator's uncordon of a
// node an update cordoned also drops the update's mark, so the update does
// not later undo the operator's decision either way.
func setCordon(ctx context.Context, w io.Writer, c client.Client, names []string, cordon bool) error {
	var errs []error
	for _, name := range names {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var n fleetv1.FleetNode
			if err := c.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
				return fmt.Errorf("get node %s: %w", name, err)
			}
			n.Spec.Unschedulable = cordon
			delete(n.Annotations, inplacectl.AnnotationCordonedBy)
			return c.Update(ctx, &n)
		})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		verb := "cordoned"
		if !cordon {
			verb = "uncordoned"
		}
		fmt.Fprintf(w, "node/%s %s\n", name, verb)
	}
	return errors.Join(errs...)
}

// describePlan prints a plan as the tree it runs: pool sequence → pool →
// node → updater task, each with its status and why, so an operator sees
// where a plan stands and what holds it without reading four kinds of
// object by hand.
func describePlan(ctx context.Context, w io.Writer, c client.Reader, name string, now time.Time) error {
	var p updatev1.InPlaceUpdatePlan
	if err := c.Get(ctx, client.ObjectKey{Name: name}, &p); err != nil {
		return fmt.Errorf("get plan %s: %w", name, err)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "Name:\t%s\n", p.Name)
	fmt.Fprintf(tw, "Phase:\t%s\n", orNone(string(p.Spec.UpdatePhase)))
	status := orNone(string(p.Status.UpdateStatus))
	if p.Status.CurrentSequence > 0 && !p.Status.UpdateStatus.Done() {
		status += fmt.Sprintf(" (sequence %d)", p.Status.CurrentSequence)
	}
	fmt.Fprintf(tw, "Status:\t%s\n", status)
	n := p.Status.Nodes
	fmt.Fprintf(tw, "Nodes:\t%d total, %d updating, %d updated, %d aborting, %d aborted, %d failed\n",
		n.Total, n.Updating, n.Updated, n.Aborting, n.Aborted, n.Failed)
	if p.Spec.MaxInFlight > 0 {
		fmt.Fprintf(tw, "Max in flight:\t%d\n", p.Spec.MaxInFlight)
	}
	fmt.Fprintf(tw, "Age:\t%s\n", duration.HumanDuration(now.Sub(p.CreationTimestamp.Time)))
	if err := tw.Flush(); err != nil {
		return err
	}

	updaters := slicesSortedUpdaters(p.Spec.Updaters)
	fmt.Fprintln(w, "Updaters (run on each node in this order):")
	for _, u := range updaters {
		ref := u.UpdaterUpdateTemplateRef
		where := ref.Name
		if ref.Namespace != "" {
			where = ref.Namespace + "/" + ref.Name
		}
		fmt.Fprintf(w, "  %d  %s  tasks of kind %s from %s %s, owns %d path(s)\n", u.Sequence, u.Name,
			inplacectl.TaskGVK(ref).Kind, ref.Kind, where, len(u.Responsibilities))
	}
	if len(p.Status.Conditions) > 0 {
		fmt.Fprintln(w, "Conditions:")
		ctw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(ctw, "  TYPE\tSTATUS\tREASON\tMESSAGE")
		for _, cond := range p.Status.Conditions {
			fmt.Fprintf(ctw, "  %s\t%s\t%s\t%s\n", cond.Type, cond.Status, orNone(cond.Reason), cond.Message)
		}
		if err := ctw.Flush(); err != nil {
			return err
		}
	}

	// Updater tasks of this plan, by node and updater: one list per
	// updater kind, not one per node.
	tasks := map[string]map[string]*unstructured.Unstructured{}
	var missing []string
	for _, u := range updaters {
		gvk := inplacectl.TaskGVK(u.UpdaterUpdateTemplateRef)
		l := &unstructured.UnstructuredList{}
		l.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		opts := []client.ListOption{client.MatchingLabels{updatev1.LabelUpdateTaskName: p.Name, updatev1.LabelUpdater: u.Name}}
		if ns := u.UpdaterUpdateTemplateRef.Namespace; ns != "" {
			opts = append(opts, client.InNamespace(ns))
		}
		if err := c.List(ctx, l, opts...); err != nil {
			missing = append(missing, fmt.Sprintf("%s: %v", gvk.Kind, err))
			continue
		}
		for i := range l.Items {
			t := &l.Items[i]
			node := t.GetLabels()[updatev1.LabelNode]
			if tasks[node] == nil {
				tasks[node] = map[string]*unstructured.Unstructured{}
			}
			// A node updated again (after a remediation) has a task per
			// attempt: show the newest.
			if old := tasks[node][u.Name]; old == nil || old.GetCreationTimestamp().Time.Before(t.GetCreationTimestamp().Time) {
				tasks[node][u.Name] = t
			}
		}
	}

	poolStatus := map[string]updatev1.PoolUpdate{}
	for _, ps := range p.Status.Pools {
		poolStatus[ps.Name] = ps
	}
	pools := slices.Clone(p.Spec.Pools)
	sort.SliceStable(pools, func(i, j int) bool {
		if pools[i].Sequence != pools[j].Sequence {
			return pools[i].Sequence < pools[j].Sequence
		}
		return pools[i].Name < pools[j].Name
	})
	var nodes fleetv1.FleetNodeList
	if err := c.List(ctx, &nodes); err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	fmt.Fprintln(w, "Progress:")
	for i, pl := range pools {
		if i == 0 || pools[i-1].Sequence != pl.Sequence {
			fmt.Fprintf(w, "  sequence %d\n", pl.Sequence)
		}
		ps := poolStatus[pl.Name]
		pst := string(ps.UpdateStatus)
		switch {
		case pst != "":
		case ps.Nodes > 0 && ps.UpdatedNodes == ps.Nodes:
			// A plan that ended no longer marks its pools: the counts
			// it kept say how the pool ended.
			pst = string(updatev1.StatusUpdated)
		case p.Status.UpdateStatus.Done():
			pst = "not updated"
		}
		line := fmt.Sprintf("    pool %s: %s", pl.Name, orWaiting(pst))
		if ps.Nodes > 0 {
			line += fmt.Sprintf(", %d/%d nodes updated", ps.UpdatedNodes, ps.Nodes)
		}
		var pool updatev1.NodePool
		if err := c.Get(ctx, client.ObjectKey{Name: pl.Name}, &pool); err != nil {
			fmt.Fprintf(w, "%s (pool: %v)\n", line, err)
			continue
		}
		if cond := meta.FindStatusCondition(pool.Status.Conditions, updatev1.PreflightBlockedCondition); cond != nil && cond.Status == metav1.ConditionTrue {
			line += fmt.Sprintf(" [PreflightBlocked: %s: %s]", cond.Reason, cond.Message)
		}
		fmt.Fprintln(w, line)
		sel, err := metav1.LabelSelectorAsSelector(&pool.Spec.Selector)
		if err != nil {
			fmt.Fprintf(w, "      (selector: %v)\n", err)
			continue
		}
		for _, node := range nodes.Items {
			if !sel.Matches(labels.Set(node.Labels)) && node.Labels[updatev1.LabelPool] != pool.Name {
				continue
			}
			st := "pending"
			if node.Labels[updatev1.LabelUpdateTaskName] == p.Name && node.Status.UpdateStatus != "" {
				st = node.Status.UpdateStatus
			} else if fromTasks := nodeStatusFromTasks(tasks[node.Name], updaters); fromTasks != "" {
				// The plan has let go of the node (it ended, or moved
				// on): its tasks still say how it went.
				st = fromTasks
			} else if p.Status.UpdateStatus.Done() {
				st = "not updated"
			}
			nline := fmt.Sprintf("      node %s: %s", node.Name, st)
			if cond := meta.FindStatusCondition(node.Status.Conditions, updatev1.InPlaceUpdateCondition); cond != nil && cond.Status != metav1.ConditionTrue && st != "pending" {
				nline += fmt.Sprintf(" (%s: %s)", cond.Reason, cond.Message)
			}
			if node.Spec.Unschedulable {
				nline += ", cordoned"
			}
			fmt.Fprintln(w, nline)
			for _, u := range updaters {
				t := tasks[node.Name][u.Name]
				if t == nil {
					continue
				}
				tst, _, _ := unstructured.NestedString(t.Object, "status", "updateStatus")
				tline := fmt.Sprintf("        %s %s/%s: %s", u.Name, t.GetKind(), t.GetName(), orWaiting(tst))
				if why := lastConditionWhy(t); why != "" {
					tline += " (" + why + ")"
				}
				fmt.Fprintln(w, tline)
			}
		}
	}
	if len(p.Status.Failures) > 0 {
		fmt.Fprintln(w, "Failures:")
		for _, f := range p.Status.Failures {
			fmt.Fprintf(w, "  node %s, updater %s: %s: %s\n", f.Node, orNone(f.Updater), orNone(f.Reason), f.Message)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("could not list updater tasks (%s)", strings.Join(missing, "; "))
	}
	return nil
}

// nodeStatusFromTasks is a node's result in a plan read from its updater
// tasks: failed or aborted if one is, updated if every updater's is,
// updating if any exists; "" without tasks.
func nodeStatusFromTasks(byUpdater map[string]*unstructured.Unstructured, updaters []updatev1.Updater) string {
	if len(byUpdater) == 0 {
		return ""
	}
	updated := 0
	for _, u := range updaters {
		t := byUpdater[u.Name]
		if t == nil {
			continue
		}
		st, _, _ := unstructured.NestedString(t.Object, "status", "updateStatus")
		switch updatev1.UpdateStatus(st) {
		case updatev1.StatusFailed, updatev1.StatusAborted:
			return st
		case updatev1.StatusUpdated:
			updated++
		}
	}
	if updated == len(updaters) {
		return string(updatev1.StatusUpdated)
	}
	return string(updatev1.StatusUpdating)
}

func slicesSortedUpdaters(us []updatev1.Updater) []updatev1.Updater {
	out := slices.Clone(us)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Sequence < out[j].Sequence })
	return out
}

func orWaiting(s string) string {
	if s == "" {
		return "waiting"
	}
	return s
}

// lastConditionWhy is "Reason: message" of a task's most recently changed
// condition that is not True: the contract's tasks explain themselves
// with condition reasons.
func lastConditionWhy(t *unstructured.Unstructured) string {
	conds, _, _ := unstructured.NestedSlice(t.Object, "status", "conditions")
	var why, at string
	for _, c := range conds {
		m, ok := c.(map[string]any)
		if !ok || m["status"] == "True" {
			continue
		}
		ts, _ := m["lastTransitionTime"].(string)
		if why != "" && ts < at {
			continue
		}
		reason, _ := m["reason"].(string)
		msg, _ := m["message"].(string)
		why, at = strings.TrimSuffix(reason+": "+msg, ": "), ts
	}
	return why
}

// watchPlan follows a plan until it ends: a live bar on a terminal, else a
// line whenever its state changes. A plan that ends failed or aborted is
// an error, so scripts can stop on it.
func watchPlan(ctx context.Context, out io.Writer, c client.Reader, name string, interval time.Duration, live *liveBar) error {
	last := ""
	for {
		var p updatev1.InPlaceUpdatePlan
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &p); err != nil {
			return fmt.Errorf("get plan %s: %w", name, err)
		}
		n := p.Status.Nodes
		ended := n.Updated + n.Aborted + n.Failed
		status := fmt.Sprintf("%s (sequence %d): %d updated, %d updating, %d aborting, %d aborted, %d failed",
			orWaiting(string(p.Status.UpdateStatus)), p.Status.CurrentSequence, n.Updated, n.Updating, n.Aborting, n.Aborted, n.Failed)
		if live != nil {
			live.setCounts(int64(n.Total), int64(ended), status)
			if p.Status.UpdateStatus.Done() {
				live.stop()
			}
		} else if status != last {
			fmt.Fprintf(out, "%s %s %d/%d nodes ended, %s\n", time.Now().Format("15:04:05"), name, ended, n.Total, status)
			last = status
		}
		if p.Status.UpdateStatus.Done() {
			for _, f := range p.Status.Failures {
				fmt.Fprintf(out, "  node %s, updater %s: %s: %s\n", f.Node, orNone(f.Updater), orNone(f.Reason), f.Message)
			}
			if p.Status.UpdateStatus != updatev1.StatusUpdated {
				return fmt.Errorf("plan %s ended %s", name, p.Status.UpdateStatus)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stopped watching plan %s while %s: %w", name, orWaiting(string(p.Status.UpdateStatus)), ctx.Err())
		case <-time.After(interval):
		}
	}
}

func newDrainCommand(g *globalOptions) *cobra.Command {
	var timeout, interval time.Duration
	cmd := &cobra.Command{
		Use:   "drain NODE...",
		Short: "Cordon nodes, then wait until no task runs on them (the tasks finish; none is stopped)",
		Long: "drain cordons the nodes (spec.unschedulable), then waits until every Task whose current attempt is on them has ended.\n" +
			"Running tasks are not stopped or moved: a task that must go sooner is deleted by its owner.\n" +
			"On --timeout it exits non-zero naming the tasks still running; the nodes stay cordoned.",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if err := setCordon(ctx, cmd.OutOrStdout(), c, args, true); err != nil {
				return err
			}
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			return waitDrained(ctx, cmd.OutOrStdout(), c, args, interval)
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "give up after this long (0 = never); the nodes stay cordoned")
	cmd.Flags().DurationVar(&interval, "interval", 2*time.Second, "how often to look")
	return cmd
}

// waitDrained waits until no unfinished Task has its current attempt on
// one of nodes, printing what it waits for whenever that changes.
func waitDrained(ctx context.Context, w io.Writer, c client.Reader, nodes []string, interval time.Duration) error {
	on := map[string]bool{}
	for _, n := range nodes {
		on[n] = true
	}
	last := ""
	for {
		var l batchv1.TaskList
		if err := c.List(ctx, &l); err != nil {
			return fmt.Errorf("list tasks (drain needs to list Tasks in every namespace): %w", err)
		}
		var running []string
		for _, t := range l.Items {
			if on[t.Status.NodeName] && !t.Status.State.Final() && t.DeletionTimestamp == nil {
				running = append(running, fmt.Sprintf("%s/%s on %s", t.Namespace, t.Name, t.Status.NodeName))
			}
		}
		sort.Strings(running)
		if len(running) == 0 {
			for _, n := range nodes {
				fmt.Fprintf(w, "node/%s drained\n", n)
			}
			return nil
		}
		if now := strings.Join(running, ", "); now != last {
			fmt.Fprintf(w, "waiting for %d task(s): %s\n", len(running), now)
			last = now
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("nodes not drained, %d task(s) still running (%s); the nodes stay cordoned: %w", len(running), strings.Join(running, ", "), ctx.Err())
		case <-time.After(interval):
		}
	}
}
