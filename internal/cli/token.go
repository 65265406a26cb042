package cli

import (
	"fmt"
	"strings"
	"text/tabwriter"
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
	create.Flags().DurationVar(&ttl, "ttl", 24*time.Hour, "how long the token is valid; 0 = forever")
	create.Flags().BoolVar(&autoApprove, "auto-approve", false, "approve nodes that register with this token at once")
	create.Flags().StringVar(&desc, "description", "", "what the token is for")
	list := &cobra.Command{
		Use:   "list",
		Short: "List bootstrap tokens (ids only; secrets are never shown again)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			toks, err := bootstrap.List(cmd.Context(), c, ns)
			if err != nil {
				return err
			}
			if len(toks) == 0 {
				cmd.Println("No bootstrap tokens. Create one with `drover token create`.")
				return nil
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 3, ' ', 0)
			fmt.Fprintln(w, "ID\tEXPIRES\tAUTO-APPROVE\tDESCRIPTION")
			now := time.Now()
			for _, t := range toks {
				exp := "never"
				if t.Expires != nil {
					exp = t.Expires.UTC().Format(time.RFC3339)
					if !now.Before(*t.Expires) {
						exp += " (expired)"
					}
				}
				fmt.Fprintf(w, "%s\t%s\t%v\t%s\n", t.ID, exp, t.AutoApprove, t.Description)
			}
			return w.Flush()
		},
	}
	del := &cobra.Command{
		Use:   "delete ID|TOKEN...",
		Short: "Delete bootstrap tokens; nodes that already registered keep their certificates",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			for _, a := range args {
				id, _, _ := strings.Cut(a, ".")
				if err := bootstrap.Delete(cmd.Context(), c, ns, id); err != nil {
					return err
				}
				cmd.Printf("bootstrap token %s deleted\n", id)
			}
			return nil
		},
	}
	cmd.PersistentFlags().StringVar(&ns, "namespace", "drover-system", "Drover's namespace")
	cmd.AddCommand(create, list, del)
	return cmd
}

func newCACommand(g *globalOptions) *cobra.Command {
	var ns string
	cmd := &cobra.Command{
		Use:   "ca",
		Short: "Print Drover's trusted CA certificates (PEM), for agents' --ca-file; rotate the CA",
		Long: `Print Drover's CA certificates (PEM): the current CA, then those a
rotation left trusted. Agents' --ca-file takes the output.

Rotating the CA: 'drover ca rotate' makes a new CA current; hubs sign with
it within a minute and still trust the old one. Agents renew onto the new
CA within one certificate lifetime (--certificate-validity of the hubs, 7
days by default). Then 'drover ca rotate --finish' stops trusting the old
CA.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			var s corev1.Secret
			if err := c.Get(cmd.Context(), client.ObjectKey{Namespace: ns, Name: hub.CASecretName}, &s); err != nil {
				return fmt.Errorf("read Drover's CA (has a hub run yet?): %w", err)
			}
			t, err := hub.ParseTrust(&s)
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(t.BundlePEM())
			return err
		},
	}
	cmd.PersistentFlags().StringVar(&ns, "namespace", "drover-system", "Drover's namespace")
	cmd.AddCommand(newCARotateCommand(g, &ns))
	return cmd
}

func newCARotateCommand(g *globalOptions, ns *string) *cobra.Command {
	var finish, force bool
	var validity time.Duration
	cmd := &cobra.Command{
		Use:   "rotate",
		Short: "Make a new CA current, keeping the old one trusted; --finish stops trusting the old one",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			now := time.Now()
			if finish {
				dropped, err := hub.FinishCARotation(cmd.Context(), c, *ns, now, validity, force)
				if err != nil {
					return err
				}
				for _, d := range dropped {
					fmt.Fprintf(out, "no longer trusted: CA %s\n", d.Subject.CommonName)
				}
				fmt.Fprintln(out, "hubs refuse certificates of those CAs within a minute; give new agents the output of `drover ca` as --ca-file")
				return nil
			}
			t, err := hub.RotateCA(cmd.Context(), c, *ns, now)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "current CA: %s; still trusted: %d previous\n", t.Current.Cert.Subject.CommonName, len(t.Previous))
			fmt.Fprintf(out, "hubs sign with the new CA within a minute; agents renew onto it within one certificate lifetime.\n"+
				"After %s, run `drover ca rotate --finish`.\n", now.Add(validity).UTC().Format(time.RFC3339))
			return nil
		},
	}
	cmd.Flags().BoolVar(&finish, "finish", false, "stop trusting the CAs an earlier rotation replaced")
	cmd.Flags().BoolVar(&force, "force", false, "with --finish: finish before one certificate lifetime has passed (agents not yet renewed must register again)")
	cmd.Flags().DurationVar(&validity, "certificate-validity", hub.DefaultCertificateValidity, "the hubs' --certificate-validity: how long certificates of the old CA may still be in use")
	return cmd
}
