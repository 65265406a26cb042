package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/drover-fleet/drover/internal/bootstrap"
	"github.com/drover-fleet/drover/internal/hub"
)

func newTokenCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Manage bootstrap tokens that let new agents register"}
	var (
		ns          string
		ttl         time.Duration
		autoApprove bool
		desc        string
	)
	create := &cobra.Command{
		Use:   "create",
		Short: "Create a bootstrap token and print it",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if ttl < 0 {
				return fmt.Errorf("--ttl %v must not be negative", ttl)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			tok, err := bootstrap.Generate()
			if err != nil {
				return err
			}
			tok.AutoApprove, tok.Description = autoApprove, desc
			if ttl > 0 {
				exp := time.Now().Add(ttl)
				tok.Expires = &exp
			}
			if err := hub.EnsureNamespace(cmd.Context(), c, ns); err != nil {
				return err
			}
			if err := bootstrap.Create(cmd.Context(), c, ns, tok); err != nil {
				return err
			}
			cmd.Println(tok.String())
			return nil
		},
	}
	create.Flags().StringVar(&ns, "namespace", "drover-system", "Drover's namespace")
	create.Flags().DurationVar(&ttl, "ttl", 24*time.Hour, "how long the token is valid; 0 = forever")
	create.Flags().BoolVar(&autoApprove, "auto-approve", false, "approve nodes that register with this token at once")
	create.Flags().StringVar(&desc, "description", "", "what the token is for")
	cmd.AddCommand(create)
	return cmd
}

func newCACommand(g *globalOptions) *cobra.Command {
	var ns string
	cmd := &cobra.Command{
		Use:   "ca",
		Short: "Print Drover's CA certificate (PEM), for agents' --ca-file",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			var s corev1.Secret
			if err := c.Get(cmd.Context(), client.ObjectKey{Namespace: ns, Name: hub.CASecretName}, &s); err != nil {
				return fmt.Errorf("read Drover's CA (has a hub run yet?): %w", err)
			}
			_, err = cmd.OutOrStdout().Write(s.Data[corev1.TLSCertKey])
			return err
		},
	}
	cmd.Flags().StringVar(&ns, "namespace", "drover-system", "Drover's namespace")
	return cmd
}
