package cli

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"
)

// Version is set by the build (-ldflags "-X .../internal/cli.Version=v1.2.3").
var Version = "dev"

// globalOptions are the flags every command shares.
type globalOptions struct {
	kubeconfig string
	logLevel   string
}

func (g *globalOptions) level() (slog.Level, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(g.logLevel)); err != nil {
		return 0, fmt.Errorf("--log-level %q: want debug, info, warn or error", g.logLevel)
	}
	return lvl, nil
}

func (g *globalOptions) logger(w io.Writer) (*slog.Logger, error) {
	lvl, err := g.level()
	if err != nil {
		return nil, err
	}
	l := slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: lvl}))
	// controller-runtime reads its logger from a process-wide slot; fill it
	// once here, at the program's edge, so library code never touches it.
	ctrl.SetLogger(logr.FromSlogHandler(l.Handler()))
	return l, nil
}

// NewRootCommand builds the drover command tree.
func NewRootCommand() *cobra.Command {
	g := &globalOptions{}
	root := &cobra.Command{
		Use:           "drover",
		Short:         "Drover: a Kubernetes-native control plane for fleets of machines",
		Long:          "Drover dispatches work to agents on edge nodes, robots and bare-metal hosts, and reports per-machine progress into the Kubernetes API.",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       Version,
	}
	root.PersistentFlags().StringVar(&g.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then ./.drover/kubeconfig, then ~/.kube/config)")
	root.PersistentFlags().StringVar(&g.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	root.AddCommand(
		newServerCommand(g),
		newUpCommand(g),
		newManagerCommand(g),
		newHubCommand(g),
		newApproveCommand(g),
		newRevokeCommand(g),
		newGetCommand(g),
		newDescribeCommand(g),
		newWatchCommand(g),
		newLogsCommand(g),
		newSessionCommand(g),
		newAppCommand(g),
		newConfirmCommand(g),
		newAbortCommand(g),
		newCordonCommand(g, true),
		newCordonCommand(g, false),
		newDrainCommand(g),
		newTokenCommand(g),
		newCACommand(g),
		newMQTTCommand(g),
		newControlPlaneCommand(),
		newCtrlKitCommand(),
		newConvertCommand(),
	)
	return root
}

// Main runs the root command and returns the process exit code.
func Main() int {
	cmd := NewRootCommand()
	// cobra's Print* default to stderr; results belong on stdout, for scripts.
	cmd.SetOut(os.Stdout)
	if err := cmd.Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "Error: %s\n", strings.TrimSpace(err.Error()))
		return 1
	}
	return 0
}
