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

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/controller-runtime/pkg/client"

	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
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
