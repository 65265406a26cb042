package cli

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
)

func newGetCommand(g *globalOptions) *cobra.Command {
	var selector, output string
	var scope namespaceScope
	cmd := &cobra.Command{
		Use:   "get nodes|nodeupgradejobs|imageprepulljobs|fleetjobs|taskgroups|tasks|pools|plans|nhc|apps|sessions|instances [NAME...]",
		Short: "List fleet nodes, node jobs, robot tasks, in-place updates, or applications, their sessions and instances",
		Example: `  drover get nodes
  drover get nodes edge-1 edge-2
  drover get nodes -l site=berlin
  drover get nodeupgradejobs
  drover get tasks -n robots
  drover get pools
  drover get plans
  drover get nhc
  drover get apps -n games
  drover get instances echo -o wide
  drover get sessions -A`,
		Args:      cobra.MinimumNArgs(1),
		ValidArgs: []string{"nodes", "fleetnodes", "fn", "nodeupgradejobs", "nuj", "imageprepulljobs", "ippj", "fleetjobs", "taskgroups", "tasks", "pools", "plans", "nodehealthchecks", "nhc", "apps", "sessions", "instances", "instanceslices"},
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "" && output != "wide" {
				return fmt.Errorf("--output %q: only wide is known", output)
			}
			wide := output == "wide"
			c, err := g.client()
			if err != nil {
				return err
			}
			if kind, ok := batchKinds[strings.ToLower(args[0])]; ok {
				scope.namespace = g.namespace(scope.namespace)
				sel, err := labels.Parse(selector)
				if err != nil {
					return fmt.Errorf("--selector %q: %w", selector, err)
				}
				return getBatch(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), c, kind, scope, sel, args[1:], time.Now())
			}
			if kind, ok := appKinds[strings.ToLower(args[0])]; ok {
				scope.namespace = g.namespace(scope.namespace)
				sel, err := labels.Parse(selector)
				if err != nil {
					return fmt.Errorf("--selector %q: %w", selector, err)
				}
				return getApps(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), c, kind, scope, sel, args[1:], wide, time.Now())
			}
			if kind, ok := inplaceKinds[strings.ToLower(args[0])]; ok {
				return getInPlace(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), c, kind, args[1:], time.Now())
			}
			if k, ok := findJobKind(args[0]); ok {
				jobs, err := getJobs(cmd.Context(), c, k, args[1:])
				if len(jobs) == 0 && err == nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "No %ss found.\n", k.kind)
					return nil
				}
				if len(jobs) > 0 {
					if perr := printJobs(cmd.OutOrStdout(), jobs, time.Now()); perr != nil {
						return perr
					}
				}
				return err
			}
			switch args[0] {
			case "nodes", "node", "fleetnodes", "fleetnode", "fn":
			default:
				return fmt.Errorf("unknown resource %q: try nodes, nodeupgradejobs or imageprepulljobs", args[0])
			}
			sel, err := labels.Parse(selector)
			if err != nil {
				return fmt.Errorf("--selector %q: %w", selector, err)
			}
			var nodes []fleetv1.FleetNode
			if names := args[1:]; len(names) > 0 {
				var errs []error
				for _, name := range names {
					var n fleetv1.FleetNode
					if err := c.Get(cmd.Context(), client.ObjectKey{Name: name}, &n); err != nil {
						errs = append(errs, fmt.Errorf("get node %s: %w", name, err))
						continue
					}
					if sel.Matches(labels.Set(n.Labels)) {
						nodes = append(nodes, n)
					}
				}
				if len(nodes) > 0 {
					printNodes(cmd.OutOrStdout(), nodes, time.Now(), wide)
				}
				return errors.Join(errs...)
			}
			var list fleetv1.FleetNodeList
			if err := c.List(cmd.Context(), &list, client.MatchingLabelsSelector{Selector: sel}); err != nil {
				return fmt.Errorf("list nodes: %w", err)
			}
			if len(list.Items) == 0 {
				fmt.Fprintln(cmd.ErrOrStderr(), "No fleet nodes found.")
				return nil
			}
			printNodes(cmd.OutOrStdout(), list.Items, time.Now(), wide)
			return nil
		},
	}
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "label selector, e.g. site=berlin,tier!=canary")
	cmd.Flags().StringVarP(&output, "output", "o", "", "wide: nodes with the SHA-256 of the key each registered with")
	cmd.Flags().StringVarP(&scope.namespace, "namespace", "n", "", "namespace of fleetjobs, taskgroups, tasks, apps, sessions and instances"+namespaceFlagHelp)
	cmd.Flags().BoolVarP(&scope.all, "all-namespaces", "A", false, "list fleetjobs, taskgroups or tasks in every namespace")
	return cmd
}

// printNodes lists nodes; wide adds the SHA-256 of each one's registered
// key, to compare with the fingerprint its agent logs.
func printNodes(w io.Writer, nodes []fleetv1.FleetNode, now time.Time, wide bool) {
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	head := "NAME\tPHASE\tAPPROVED\tHUB\tVERSION\tLAST-HEARTBEAT\tAGE"
	if wide {
		head += "\tKEY-SHA256"
	}
	fmt.Fprintln(tw, head)
	for _, n := range nodes {
		hb := "<none>"
		if n.Status.LastHeartbeatTime != nil {
			hb = duration.HumanDuration(now.Sub(n.Status.LastHeartbeatTime.Time)) + " ago"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s", n.Name, orNone(string(n.Status.Phase)), approvedColumn(&n),
			orNone(n.Status.Hub), orNone(n.Status.AgentVersion), hb, duration.HumanDuration(now.Sub(n.CreationTimestamp.Time)))
		if wide {
			fmt.Fprintf(tw, "\t%s", keyOf(&n))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

// approvedColumn is spec.approved, with what of the agent's report waits
// for `drover approve` (the node meanwhile keeps its approved labels and
// capacity).
func approvedColumn(n *fleetv1.FleetNode) string {
	if !n.Spec.Approved {
		return "false"
	}
	var pending []string
	if meta.IsStatusConditionFalse(n.Status.Conditions, fleetv1.LabelsApprovedCondition) {
		pending = append(pending, "labels")
	}
	if meta.IsStatusConditionFalse(n.Status.Conditions, fleetv1.CapacityApprovedCondition) {
		pending = append(pending, "capacity")
	}
	if len(pending) == 0 {
		return "true"
	}
	return "true(" + strings.Join(pending, ",") + " pending)"
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}
