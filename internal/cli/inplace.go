package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

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
