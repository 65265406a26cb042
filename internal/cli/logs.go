package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	"github.com/drover-fleet/drover/internal/hub"
	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/task/tasklogs"
)

func newLogsCommand(g *globalOptions) *cobra.Command {
	var (
		o        tasklogs.Options
		tail     int64
		caFile   string
		droverNS string
		previous bool
	)
	cmd := &cobra.Command{
		Use:   "logs TASK",
		Short: "Print (or follow) the output of a task's current attempt, from its node",
		Long: `Print the stdout (or stderr) of a task's current attempt. The log stays on
the node; the hub serving the node streams it. You need get on tasks/log in
the task's namespace, which the hub asks the kube-apiserver about.

Hubs take client certificates only. With a kubeconfig that has a client
certificate, drover logs presents it. With a bearer token, drover logs
makes a key in memory and has Drover's signer (the manager's; --signer, or
the address on the drover-ca-bundle ConfigMap) review the token and sign a
10-minute certificate with your identity: the token goes only to a server
proving it is the signer (certificate of Drover's CA named drover-signer),
never to a hub. Exec and auth-provider plugins are not supported.

--previous prints the log of the attempt before the current one, and
--attempt N that of attempt N, from the node it ran on (which keeps an
ended attempt's files for its --task-retention, 24h by default). When that
node cannot give it (offline, or the files are gone), --previous prints the
last 4 KiB the agent reported, from the Task's status, and says so.`,
		Example: `  drover logs -n robots survey-3
  drover logs -n robots survey-3 -f --stream stderr
  drover logs survey-3 --tail 4096 --hub hub.example:7443
  drover logs survey-3 --previous
  drover logs survey-3 --attempt 1`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.Stream != protocol.LogStdout && o.Stream != protocol.LogStderr {
				return fmt.Errorf("--stream %q: want stdout or stderr", o.Stream)
			}
			if tail < 0 {
				return fmt.Errorf("--tail %d: want a number of bytes, or 0 for all", tail)
			}
			o.TailBytes = uint64(tail)
			if o.Attempt < 0 {
				return fmt.Errorf("--attempt %d: want an attempt number, 1 or more", o.Attempt)
			}
			if previous && o.Attempt != 0 {
				return errors.New("--previous and --attempt: name the attempt with one of them")
			}
			var t batchv1.Task
			if previous {
				if o.Follow {
					return errors.New("--previous and --follow: a previous attempt has ended, there is nothing to follow")
				}
				c, err := g.client()
				if err != nil {
					return err
				}
				key := client.ObjectKey{Namespace: g.namespace(o.Namespace), Name: args[0]}
				if err := c.Get(cmd.Context(), key, &t); err != nil {
					return fmt.Errorf("get task %s: %w", key, err)
				}
				if t.Status.Attempt < 2 {
					return fmt.Errorf("task %s has no previous attempt (it is at attempt %d)", key, max(t.Status.Attempt, 1))
				}
				o.Attempt = t.Status.Attempt - 1
			}
			cfg, err := g.restConfig()
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			o.Config, o.Client, o.DroverNamespace, o.Name = cfg, c, droverNS, args[0]
			o.Namespace = g.namespace(o.Namespace)
			if o.CAPEM, err = droverCA(cmd, c, caFile, droverNS); err != nil {
				return err
			}
			if !previous {
				return tasklogs.Copy(cmd.Context(), o, cmd.OutOrStdout())
			}
			// The whole log from the node, or else the tail the status kept:
			// read first, so that a failure halfway prints nothing twice.
			var buf bytes.Buffer
			nodeErr := tasklogs.Copy(cmd.Context(), o, &buf)
			if nodeErr == nil {
				_, err = buf.WriteTo(cmd.OutOrStdout())
				return err
			}
			out, err := previousOutput(&t)
			if err != nil {
				return fmt.Errorf("%w; and its node's log: %w", err, nodeErr)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "drover logs: the node's log of attempt %d cannot be read (%v); the last 4 KiB the agent reported follow\n", o.Attempt, nodeErr)
			_, err = io.WriteString(cmd.OutOrStdout(), out)
			return err
		},
	}
	cmd.Flags().StringVarP(&o.Namespace, "namespace", "n", "", "the task's namespace"+namespaceFlagHelp)
	cmd.Flags().BoolVarP(&o.Follow, "follow", "f", false, "keep printing output until the attempt ends")
	cmd.Flags().BoolVarP(&previous, "previous", "p", false, "print the log of the attempt before the current one (from its node; else the tail in the task's status)")
	cmd.Flags().Int32Var(&o.Attempt, "attempt", 0, "print the log of this attempt (from the node it ran on); 0: the current one")
	cmd.Flags().StringVar(&o.Stream, "stream", protocol.LogStdout, "stdout or stderr")
	cmd.Flags().Int64Var(&tail, "tail", 0, "start this many bytes before the end (0: all that the node keeps)")
	cmd.Flags().StringVar(&o.Hub, "hub", "", "hub host:port (default: the hub the task's node is connected to)")
	cmd.Flags().StringVar(&caFile, "ca-file", "", "Drover's CA (PEM) to verify the hub and the signer (default: .drover/ca.crt, then the drover-ca-bundle ConfigMap, then the drover-ca Secret)")
	cmd.Flags().StringVar(&o.Signer, "signer", "", "Drover's signer host:port, which trades a kubeconfig's bearer token for a short-lived certificate (default: the address on the drover-ca-bundle ConfigMap)")
	cmd.Flags().StringVar(&droverNS, "drover-namespace", "drover-system", "Drover's namespace (hub Leases, CA)")
	return cmd
}

// droverCA finds Drover's CA certificates: --ca-file, the local `drover
// server` data dir, the public bundle the manager's signer keeps (the
// ConfigMap drover-ca-bundle, which log readers may get), then the CA
// Secret (as `drover ca` reads it; administrators only).
func droverCA(cmd *cobra.Command, c client.Client, file, ns string) ([]byte, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		return b, nil
	}
	if b, err := os.ReadFile(filepath.Join(defaultDataDir, "ca.crt")); err == nil {
		return b, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	b, bundleErr := hub.ReadBundle(cmd.Context(), c, ns)
	if bundleErr == nil {
		return b.PEM(), nil
	}
	var s corev1.Secret
	if err := c.Get(cmd.Context(), client.ObjectKey{Namespace: ns, Name: hub.CASecretName}, &s); err != nil {
		return nil, fmt.Errorf("read Drover's CA (pass --ca-file with the output of `drover ca`): %w; %w", bundleErr, err)
	}
	t, err := hub.ParseTrust(&s)
	if err != nil {
		return nil, err
	}
	return t.BundlePEM(), nil
}
