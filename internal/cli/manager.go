package cli

import (
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// partOptions are the flags of `drover manager` and `drover hub`.
type partOptions struct {
	g    *globalOptions
	comp componentOptions
}

func newManagerCommand(g *globalOptions) *cobra.Command {
	o := &partOptions{g: g}
	cmd := &cobra.Command{
		Use:   "manager",
		Short: "Run Drover's controllers against a cluster (--kubeconfig)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd, true, false)
		},
	}
	o.comp.addManagerFlags(cmd.Flags())
	o.comp.webhook.addFlags(cmd.Flags(), "127.0.0.1:9443", true)
	o.comp.signer.addServeFlags(cmd.Flags(), "127.0.0.1:9444")
	o.comp.sessionAPI.addFlags(cmd.Flags(), "")
	cmd.Flags().BoolVar(&o.comp.leaderElect, "leader-elect", true, "elect one active manager among replicas")
	return cmd
}

func newHubCommand(g *globalOptions) *cobra.Command {
	o := &partOptions{g: g}
	cmd := &cobra.Command{
		Use:   "hub",
		Short: "Run one hub against a cluster (--kubeconfig); run as many as you need",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd, false, true)
		},
	}
	o.comp.addManagerFlags(cmd.Flags())
	o.comp.addHubFlags(cmd.Flags())
	o.comp.signer.addClientFlags(cmd.Flags())
	return cmd
}

func (o *partOptions) run(cmd *cobra.Command, withManager, withHub bool) error {
	if err := o.comp.validate(withHub); err != nil {
		return err
	}
	log, err := o.g.logger(os.Stderr)
	if err != nil {
		return err
	}
	cfg, err := o.g.restConfig()
	if err != nil {
		return err
	}
	r, err := newComponents(cfg, o.comp, withManager, withHub, log)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if r.admission != nil {
		go func() {
			if addr, err := r.webhookAddress(ctx); err == nil {
				cmd.Printf("ready webhook=%s\n", addr)
			}
		}()
	}
	if r.signer != nil {
		go func() {
			if addr, err := r.signerAddress(ctx); err == nil && addr != "" {
				cmd.Printf("ready signer=%s\n", addr)
			}
		}()
	}
	if r.metrics != nil {
		go func() {
			if u, err := r.metricsURL(ctx); err == nil {
				cmd.Printf("ready metrics=%s\n", u)
			}
		}()
	}
	if withHub {
		go func() {
			if addr, err := r.hubAddress(ctx); err == nil {
				cmd.Printf("ready hub=%s\n", addr)
			}
		}()
	}
	return r.mgr.Start(ctx)
}
