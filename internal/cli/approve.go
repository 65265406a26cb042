package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/hub"
)

func newApproveCommand(g *globalOptions) *cobra.Command {
	var allPending bool
	cmd := &cobra.Command{
		Use:   "approve NODE...",
		Short: "Approve registered nodes so they get a certificate and work",
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 && !allPending {
				return errors.New("name at least one node, or pass --all-pending")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			if allPending {
				var list fleetv1.FleetNodeList
				if err := c.List(cmd.Context(), &list); err != nil {
					return fmt.Errorf("list nodes: %w", err)
				}
				for _, n := range list.Items {
					if !n.Spec.Approved && !n.Spec.Revoked {
						args = append(args, n.Name)
					}
				}
				if len(args) == 0 {
					cmd.Println("No nodes are waiting for approval.")
					return nil
				}
			}
			return setSpec(cmd.Context(), c, args, func(n *fleetv1.FleetNode) { n.Spec.Approved = true }, "approved", cmd)
		},
	}
	cmd.Flags().BoolVar(&allPending, "all-pending", false, "approve every node waiting for approval")
	return cmd
}

func newRevokeCommand(g *globalOptions) *cobra.Command {
	var ns string
	cmd := &cobra.Command{
		Use:   "revoke NODE...",
		Short: "Revoke nodes: hubs close their streams and refuse their keys",
		Long: `Revoke nodes: each node's registered key goes on the revocation list
(ConfigMap ` + hub.RevokedKeysName + ` in Drover's namespace), then its spec.revoked is set.
Hubs close the node's streams, and hubs and the embedded MQTT broker refuse
its key from then on, even after the FleetNode is deleted and the name is
registered again by another machine, until every certificate signed for the
key has expired.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			var errs []error
			for _, name := range args {
				listed, err := hub.RevokeNode(cmd.Context(), c, ns, name, time.Now())
				if err != nil {
					errs = append(errs, err)
					continue
				}
				if !listed {
					cmd.Printf("fleetnode/%s revoked (no registered key is recorded on it: only its name is refused)\n", name)
					continue
				}
				cmd.Printf("fleetnode/%s revoked; its key is refused even if the node is deleted and registered again\n", name)
			}
			return errors.Join(errs...)
		},
	}
	cmd.Flags().StringVar(&ns, "namespace", "drover-system", "Drover's namespace, which holds the revocation list")
	return cmd
}

// keyOf is the SHA-256 of the key n registered with, as hubs record it.
func keyOf(n *fleetv1.FleetNode) string {
	if k := n.Annotations[fleetv1.AnnotationRegistrationKey]; k != "" {
		return k
	}
	return "<not recorded>"
}

func setSpec(ctx context.Context, c client.Client, names []string, mutate func(*fleetv1.FleetNode), verb string, cmd *cobra.Command) error {
	var errs []error
	for _, name := range names {
		var n fleetv1.FleetNode
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
			if apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("node %s not found: it registers when its agent first contacts a hub", name))
				continue
			}
			errs = append(errs, fmt.Errorf("get node %s: %w", name, err))
			continue
		}
		before := n.DeepCopy()
		mutate(&n)
		if err := c.Patch(ctx, &n, client.MergeFrom(before)); err != nil {
			errs = append(errs, fmt.Errorf("update node %s: %w", name, err))
			continue
		}
		if verb == "approved" && n.Spec.Revoked {
			// Approval does not undo a revocation; saying "approved" alone
			// would have the operator wait for a node that stays refused.
			cmd.Printf("fleetnode/%s approved, but it is revoked and stays refused: to readmit it, "+
				"kubectl patch fleetnode %s --type merge -p '{\"spec\":{\"revoked\":false}}' (or delete it to register afresh)\n", name, name)
			continue
		}
		if verb == "approved" {
			// The operator compares it with the key the agent logs at
			// start: approving a name is approving whoever registered it.
			cmd.Printf("fleetnode/%s approved; key sha256 %s: compare it with the agent's (keySHA256 in its log at start, \"key sha256\" while it waits for approval)\n", name, keyOf(&n))
			continue
		}
		cmd.Printf("fleetnode/%s %s\n", name, verb)
	}
	return errors.Join(errs...)
}
