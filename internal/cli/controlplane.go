package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/drover-fleet/drover/internal/controlplane"
)

// controlPlaneOptions are the flags of the hidden `drover controlplane`
// command, which runs only etcd + kube-apiserver (no manager, no hub). The
// test harness (internal/testenv) starts it as a subprocess, so that test
// binaries do not link the apiserver.
type controlPlaneOptions struct {
	dataDir  string
	port     int
	crdDir   string
	logLevel string
	// apiserverArgs are extra kube-apiserver flags (e.g. --profiling=true
	// for a benchmark's profile); they override Drover's own.
	apiserverArgs []string

	out    io.Writer // the "ready" line
	logOut io.Writer // logs
}

func newControlPlaneCommand() *cobra.Command {
	o := &controlPlaneOptions{}
	cmd := &cobra.Command{
		Use:    "controlplane",
		Short:  "Run only etcd and kube-apiserver (for tests)",
		Hidden: true,
		Long: `Run an embedded etcd and kube-apiserver with state in --data-dir, install the
CRDs found in --crd-dir (*.yaml), and print one line

  ready kubeconfig=<path>

to stdout once the API server is ready. Runs until SIGINT or SIGTERM. Logs go
to stderr; the apiserver's and etcd's full logs go to <data-dir>/*.log.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.out = cmd.OutOrStdout()
			o.logOut = cmd.ErrOrStderr()
			// --log-level is the root command's persistent flag when this
			// command runs under it.
			if f := cmd.Flags().Lookup("log-level"); f != nil {
				o.logLevel = f.Value.String()
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return o.Run(ctx)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.dataDir, "data-dir", "", "directory for etcd data, certificates, kubeconfig and logs (required)")
	fs.IntVar(&o.port, "port", 0, "kube-apiserver port on 127.0.0.1 (0 picks a free one)")
	fs.StringVar(&o.crdDir, "crd-dir", "", "install every *.yaml CRD manifest in this directory once the API server is ready")
	fs.StringArrayVar(&o.apiserverArgs, "apiserver-arg", nil, "an extra kube-apiserver flag, e.g. --apiserver-arg=--profiling=true (repeatable)")
	return cmd
}

// Validate checks the flags.
func (o *controlPlaneOptions) Validate() error {
	if o.dataDir == "" {
		return errors.New("--data-dir is required")
	}
	if o.port < 0 || o.port > 65535 {
		return fmt.Errorf("--port %d is not a port", o.port)
	}
	if o.crdDir != "" {
		st, err := os.Stat(o.crdDir)
		if err != nil {
			return fmt.Errorf("--crd-dir: %w", err)
		}
		if !st.IsDir() {
			return fmt.Errorf("--crd-dir %s is not a directory", o.crdDir)
		}
	}
	return nil
}

// Run starts the control plane, installs the CRDs, prints the ready line and
// blocks until ctx ends and the control plane has stopped.
func (o *controlPlaneOptions) Run(ctx context.Context) error {
	if err := o.Validate(); err != nil {
		return err
	}
	lvl := slog.LevelInfo
	if o.logLevel != "" {
		if err := lvl.UnmarshalText([]byte(o.logLevel)); err != nil {
			return fmt.Errorf("--log-level %q: want debug, info, warn or error", o.logLevel)
		}
	}
	logOut := o.logOut
	if logOut == nil {
		logOut = os.Stderr
	}
	log := slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: lvl}))

	manifests, err := readManifests(o.crdDir)
	if err != nil {
		return err
	}
	cpCtx, stop := context.WithCancel(ctx)
	defer stop()
	cp, err := controlplane.Start(cpCtx, controlplane.Options{DataDir: o.dataDir, APIServerPort: o.port, Logger: log, ExtraAPIServerArgs: o.apiserverArgs})
	if err != nil {
		return err
	}
	if err := controlplane.InstallCRDs(ctx, cp.RESTConfig(), manifests); err != nil {
		stop()
		_ = cp.Wait() // stop etcd cleanly; the CRD error is the one to report
		return fmt.Errorf("install CRDs from %s: %w", o.crdDir, err)
	}
	if len(manifests) > 0 {
		log.Info("CRDs installed", "dir", o.crdDir, "files", len(manifests))
	}
	if err := installPolicies(ctx, cp.RESTConfig()); err != nil {
		stop()
		_ = cp.Wait()
		return err
	}
	if err := installRBAC(ctx, cp.RESTConfig()); err != nil {
		stop()
		_ = cp.Wait()
		return err
	}
	kubeconfig, err := filepath.Abs(cp.KubeconfigPath())
	if err != nil {
		return err
	}
	fmt.Fprintf(o.out, "ready kubeconfig=%s\n", kubeconfig)

	select {
	case <-ctx.Done():
		log.Info("stopping control plane")
	case <-cp.Done(): // stopped by itself: Wait says why
	}
	if err := cp.Wait(); err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	log.Info("control plane stopped")
	return nil
}

// readManifests reads every *.yaml file in dir, sorted by name. An empty dir
// name yields no manifests.
func readManifests(dir string) ([][]byte, error) {
	if dir == "" {
		return nil, nil
	}
	names, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, fmt.Errorf("--crd-dir %s: %w", dir, err)
	}
	sort.Strings(names)
	out := make([][]byte, 0, len(names))
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			return nil, fmt.Errorf("read CRD manifest: %w", err)
		}
		out = append(out, b)
	}
	return out, nil
}
