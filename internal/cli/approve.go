package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/fleetnode"
	"github.com/drover-fleet/drover/internal/hub"
)

func newApproveCommand(g *globalOptions) *cobra.Command {
	var allPending bool
	cmd := &cobra.Command{
		Use:   "approve NODE...",
		Short: "Approve registered nodes so they get a certificate and work",
		Long: `Approve registered nodes so they get a certificate and work, with the
labels and capacity their agents report (status.reportedLabels and
status.reportedCapacity become spec.approvedLabels and spec.approvedCapacity).
A node carries only approved labels, and the scheduler counts on no more than
the approved capacity: when an agent later reports other labels or more
capacity, the node's LabelsApproved or CapacityApproved condition says so,
and approving the node again accepts the change.`,
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
			return approve(cmd.Context(), c, args, cmd)
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

// approve approves each node as it is now: spec.approved and what its
// agent reports. The optimistic lock makes it approve what it read: a
// report that changes meanwhile is read again, and printed.
func approve(ctx context.Context, c client.Client, names []string, cmd *cobra.Command) error {
	var errs []error
	for _, name := range names {
		var n fleetv1.FleetNode
		var labels, capacity []string
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n = fleetv1.FleetNode{}
			if err := c.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
				return err
			}
			before := n.DeepCopy()
			if n.Spec.Approved {
				labels, capacity = fleetnode.LabelChanges(&n), fleetnode.CapacityOverApproved(&n)
			}
			n.Spec.Approved = true
			fleetnode.ApproveReported(&n)
			return c.Patch(ctx, &n, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
		})
		switch {
		case apierrors.IsNotFound(err):
			errs = append(errs, fmt.Errorf("node %s not found: it registers when its agent first contacts a hub", name))
			continue
		case err != nil:
			errs = append(errs, fmt.Errorf("approve node %s: %w", name, err))
			continue
		}
		if n.Spec.Revoked {
			// Approval does not undo a revocation; saying "approved" alone
			// would have the operator wait for a node that stays refused.
			cmd.Printf("fleetnode/%s approved, but it is revoked and stays refused: to readmit it, "+
				"kubectl patch fleetnode %s --type merge -p '{\"spec\":{\"revoked\":false}}' (or delete it to register afresh)\n", name, name)
			continue
		}
		// The operator compares it with the key the agent logs at start:
		// approving a name is approving whoever registered it.
		cmd.Printf("fleetnode/%s approved; key sha256 %s: compare it with the agent's (keySHA256 in its log at start, \"key sha256\" while it waits for approval)\n", name, keyOf(&n))
		if len(labels) > 0 {
			cmd.Printf("  label changes the agent reported, now approved: %s\n", strings.Join(labels, ", "))
		}
		if len(capacity) > 0 {
			cmd.Printf("  capacity the agent claimed beyond the approved, now approved: %s\n", strings.Join(capacity, ", "))
		}
	}
	return errors.Join(errs...)
}
