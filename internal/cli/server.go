package cli

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/drover-fleet/drover/config/admission"
	"github.com/drover-fleet/drover/config/crd"
	"github.com/drover-fleet/drover/config/rbac"
	"github.com/drover-fleet/drover/internal/controlplane"
	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/manager"
)

// serverOptions are `drover server`'s flags.
type serverOptions struct {
	g       *globalOptions
	dataDir string
	apiPort int
	comp    componentOptions
	verbose bool
	out     io.Writer
	// prepare, if set, runs once the API is installed, before the manager
	// and hub start (`drover up`'s NodeGrant).
	prepare func(context.Context, client.Client) error
}

// serverInfo is what a started server tells its caller.
type serverInfo struct {
	Kubeconfig string
	Hub        string
	MQTT       string // the MQTT broker's URL; "" when MQTT is off
	CAFile     string
	Client     client.Client
	Log        *slog.Logger
}

func newServerCommand(g *globalOptions) *cobra.Command {
	o := &serverOptions{g: g}
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run Drover on this machine: etcd, kube-apiserver, CRDs, manager and a hub",
		Long: `Run everything Drover needs on one machine: an embedded etcd and kube-apiserver,
Drover's CRDs, the manager and one hub. State lives under --data-dir and
survives restarts. An admin kubeconfig is written to <data-dir>/kubeconfig and
Drover's CA (for agents' --ca-file) to <data-dir>/ca.crt. The terminal shows
Drover's progress, warnings and errors; the full log is in
<data-dir>/server.log (-v shows it on the terminal too).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.out = cmd.OutOrStdout()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return o.Run(ctx, nil)
		},
	}
	o.addFlags(cmd)
	return cmd
}

func (o *serverOptions) addFlags(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&o.dataDir, "data-dir", defaultDataDir, "directory for etcd data, certificates, kubeconfig and logs")
	fs.IntVar(&o.apiPort, "apiserver-port", 0, "kube-apiserver port on 127.0.0.1 (0 picks a free one; the kubeconfig always has it)")
	o.comp.addManagerFlags(fs)
	o.comp.addHubFlags(fs)
	// The API server is on this machine: any free port will do.
	o.comp.webhook.addFlags(fs, "127.0.0.1:0", false)
	// Its hub signs in the process; other hubs (`drover hub --signer`)
	// reach the signer here.
	o.comp.signer.addServeFlags(fs, "127.0.0.1:0")
	// Port 0: two servers on one machine (tests) never collide; the
	// address is printed.
	o.comp.sessionAPI.addFlags(fs, "127.0.0.1:0")
	fs.BoolVar(&o.comp.leaderElect, "leader-elect", true,
		"hold the drover-manager Lease, so that a `drover manager` started against this control plane stands by")
	fs.BoolVarP(&o.verbose, "verbose", "v", false,
		"log at --log-level on the terminal too (default: warnings and errors there; everything in <data-dir>/"+serverLogName+")")
}

// Validate checks the flags.
func (o *serverOptions) Validate() error {
	if o.dataDir == "" {
		return errors.New("--data-dir must not be empty")
	}
	return o.comp.validate(true)
}

// Run runs the server until ctx ends. ready, if set, runs once everything
// is up, while the server keeps running.
func (o *serverOptions) Run(ctx context.Context, ready func(context.Context, serverInfo) error) (retErr error) {
	if err := o.Validate(); err != nil {
		return err
	}
	sl, err := o.g.serverLogger(os.Stderr, o.dataDir, o.verbose)
	if err != nil {
		return err
	}
	defer sl.Close()
	defer sl.stopOn(ctx)()
	log := sl.Logger
	began := time.Now()
	fmt.Fprintf(o.out, "Starting Drover in %s (full log: %s) ...\n", o.dataDir, sl.path)
	log.Info("starting control plane", "dataDir", o.dataDir)
	// The control plane has a context of its own, ended on every return
	// (an error after it started must stop it, not wait for it), but only
	// after the manager stopped: the manager releases its Lease and flushes
	// its events through the API server on the way out. While it starts,
	// ctx still ends it.
	cpCtx, stopCP := context.WithCancel(context.WithoutCancel(ctx))
	detach := context.AfterFunc(ctx, stopCP)
	cp, err := controlplane.Start(cpCtx, controlplane.Options{DataDir: o.dataDir, APIServerPort: o.apiPort, Logger: log.With("component", "controlplane")})
	detach()
	if err != nil {
		stopCP()
		return err
	}
	// From the stop on, what the components log while the manager, hubs
	// and agents go down is shutdown noise: it stays in the files.
	defer context.AfterFunc(ctx, cp.Quiet)()
	defer func() {
		stopCP()
		if err := cp.Wait(); err != nil && ctx.Err() == nil {
			log.Error("control plane stopped", "err", err)
		}
		log.Info("drover server stopped")
		if retErr == nil {
			fmt.Fprintln(o.out, "Drover stopped.")
		}
	}()
	cfg := cp.RESTConfig()
	manifests, err := crd.Manifests()
	if err != nil {
		return err
	}
	if err := controlplane.InstallCRDs(ctx, cfg, manifests); err != nil {
		return err
	}
	if err := installPolicies(ctx, cfg); err != nil {
		return err
	}
	if err := installRBAC(ctx, cfg); err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		return err
	}
	if err := hub.EnsureNamespace(ctx, c, o.comp.namespace); err != nil {
		return err
	}
	if o.prepare != nil {
		if err := o.prepare(ctx, c); err != nil {
			return err
		}
	}
	trust, err := hub.EnsureTrust(ctx, c, o.comp.namespace, time.Now())
	if err != nil {
		return err
	}
	caFile := filepath.Join(o.dataDir, "ca.crt")
	if err := os.WriteFile(caFile, trust.BundlePEM(), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", caFile, err)
	}
	r, err := newComponents(cfg, o.comp, true, true, log)
	if err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return r.mgr.Start(ctx) })
	// A component that failed to start ends ctx; its error says why.
	hubAddr, err := r.hubAddress(ctx)
	if err != nil {
		return cmp.Or(g.Wait(), err)
	}
	mqttURL, err := r.mqttURL(ctx)
	if err != nil {
		return cmp.Or(g.Wait(), err)
	}
	// Ready means Tasks are checked against NodeGrants already.
	if _, err := r.webhookAddress(ctx); err != nil {
		return cmp.Or(g.Wait(), err)
	}
	signerAddr, err := r.signerAddress(ctx)
	if err != nil {
		return cmp.Or(g.Wait(), err)
	}
	metricsURL, err := r.metricsURL(ctx)
	if err != nil {
		return cmp.Or(g.Wait(), err)
	}
	kubeconfig, _ := filepath.Abs(cp.KubeconfigPath())
	caAbs, _ := filepath.Abs(caFile)
	fmt.Fprintf(o.out, "Drover is up (%.1fs).\n  kubeconfig: %s\n  hub:        %s\n", time.Since(began).Seconds(), kubeconfig, hubAddr)
	if mqttURL != "" {
		fmt.Fprintf(o.out, "  mqtt:       %s\n", mqttURL)
	}
	if signerAddr != "" {
		fmt.Fprintf(o.out, "  signer:     %s (for `drover hub --signer`; `drover logs` finds it on drover-ca-bundle)\n", signerAddr)
	}
	fmt.Fprintf(o.out, "  agent CA:   %s\n  try:        kubectl --kubeconfig %s get fleetnodes\n", caAbs, kubeconfig)
	if metricsURL != "" {
		fmt.Fprintf(o.out, "  metrics:    %s (manager and hub; docs/monitoring.md)\n", metricsURL)
	}
	if signerAddr != "" {
		fmt.Fprintf(o.out, "ready signer=%s\n", signerAddr)
	}
	if metricsURL != "" {
		fmt.Fprintf(o.out, "ready metrics=%s\n", metricsURL)
	}
	// One machine-readable line for scripts and tests.
	fmt.Fprintf(o.out, "ready kubeconfig=%s hub=%s ca=%s\n", kubeconfig, hubAddr, caAbs)
	if ready != nil {
		g.Go(func() error {
			return ready(ctx, serverInfo{Kubeconfig: kubeconfig, Hub: hubAddr, MQTT: mqttURL, CAFile: caAbs, Client: c, Log: log})
		})
	}
	return g.Wait()
}

// installPolicies installs the admission policies embedded from
// config/admission, which hold the API rules the CRD schemas cannot.
func installPolicies(ctx context.Context, cfg *rest.Config) error {
	manifests, err := admission.Manifests()
	if err != nil {
		return err
	}
	if err := controlplane.InstallPolicies(ctx, cfg, manifests); err != nil {
		return fmt.Errorf("install the admission policies of config/admission: %w", err)
	}
	return nil
}

// installRBAC applies config/rbac to the embedded control plane: the
// ServiceAccounts and roles of an existing cluster's setup, so that the
// README's bindings (drover-task-log-reader, drover-hub-locator, view and
// edit aggregation) work the same with `drover up`. An object that exists
// is updated to the manifest.
func installRBAC(ctx context.Context, cfg *rest.Config) error {
	files, err := rbac.Manifests()
	if err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return fmt.Errorf("install config/rbac: %w", err)
	}
	for _, f := range files {
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(f), 4096)
		for {
			var u unstructured.Unstructured
			if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return fmt.Errorf("install config/rbac: %w", err)
			}
			if len(u.Object) == 0 {
				continue
			}
			err := c.Create(ctx, u.DeepCopy())
			if apierrors.IsAlreadyExists(err) {
				err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
					var cur unstructured.Unstructured
					cur.SetGroupVersionKind(u.GroupVersionKind())
					if err := c.Get(ctx, client.ObjectKeyFromObject(&u), &cur); err != nil {
						return err
					}
					want := u.DeepCopy()
					want.SetResourceVersion(cur.GetResourceVersion())
					return c.Update(ctx, want)
				})
			}
			if err != nil {
				return fmt.Errorf("install config/rbac: %s %s: %w", u.GetKind(), u.GetName(), err)
			}
		}
	}
	return nil
}
