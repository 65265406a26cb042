package cli

import (
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/duration"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
)

func newGetCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:       "get nodes",
		Short:     "List fleet nodes",
		Args:      cobra.ExactArgs(1),
		ValidArgs: []string{"nodes", "fleetnodes", "fn"},
		RunE: func(cmd *cobra.Command, args []string) error {
			switch args[0] {
			case "nodes", "node", "fleetnodes", "fleetnode", "fn":
			default:
				return fmt.Errorf("unknown resource %q: try `drover get nodes`", args[0])
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			var list fleetv1.FleetNodeList
			if err := c.List(cmd.Context(), &list); err != nil {
				return fmt.Errorf("list nodes: %w", err)
			}
			printNodes(cmd.OutOrStdout(), list.Items, time.Now())
			return nil
		},
	}
}

func printNodes(w io.Writer, nodes []fleetv1.FleetNode, now time.Time) {
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "NAME\tPHASE\tAPPROVED\tHUB\tVERSION\tLAST-HEARTBEAT\tAGE")
	for _, n := range nodes {
		hb := "<none>"
		if n.Status.LastHeartbeatTime != nil {
			hb = duration.HumanDuration(now.Sub(n.Status.LastHeartbeatTime.Time)) + " ago"
		}
		fmt.Fprintf(tw, "%s\t%s\t%t\t%s\t%s\t%s\t%s\n", n.Name, orNone(string(n.Status.Phase)), n.Spec.Approved,
			orNone(n.Status.Hub), orNone(n.Status.AgentVersion), hb, duration.HumanDuration(now.Sub(n.CreationTimestamp.Time)))
	}
	tw.Flush()
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}
