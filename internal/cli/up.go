package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/drover-fleet/drover/api/fleet/v1alpha1"
	"github.com/drover-fleet/drover/internal/bootstrap"
)

// upOptions are `drover up`'s flags: a server plus local agents.
type upOptions struct {
	server      serverOptions
	agents      int
	agentBinary string
	namePrefix  string
	transport   string
}

func newUpCommand(g *globalOptions) *cobra.Command {
	o := &upOptions{server: serverOptions{g: g}}
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run `drover server` plus N local agents: a working fleet in one command",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.server.out = cmd.OutOrStdout()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return o.Run(ctx)
		},
	}
	o.server.addFlags(cmd)
	cmd.Flags().IntVar(&o.agents, "agents", 3, "how many local drover-agent processes to start")
	cmd.Flags().StringVar(&o.agentBinary, "agent-binary", "", "drover-agent binary (default: next to drover, on $PATH, or built from this checkout)")
	cmd.Flags().StringVar(&o.namePrefix, "node-prefix", "node", "agents are named <prefix>-1 … <prefix>-N")
	cmd.Flags().StringVar(&o.transport, "agent-transport", "grpc", "how the local agents talk to the hub: grpc or mqtt (the embedded broker)")
	return cmd
}

// Validate checks the flags.
func (o *upOptions) Validate() error {
	if o.agents < 0 || o.agents > 500 {
		return fmt.Errorf("--agents %d: want 0 to 500 local agents", o.agents)
	}
	switch o.transport {
	case "grpc":
	case "mqtt":
		if o.server.comp.mqtt.listen == "" && o.server.comp.mqtt.broker == "" {
			return errors.New("--agent-transport mqtt needs MQTT: leave --mqtt-listen set or give --mqtt-broker")
		}
	default:
		return fmt.Errorf("--agent-transport %q: want grpc or mqtt", o.transport)
	}
	return o.server.Validate()
}

// Run starts the server and, once it is up, the agents.
func (o *upOptions) Run(ctx context.Context) error {
	if err := o.Validate(); err != nil {
		return err
	}
	o.server.prepare = ensureUpGrant
	return o.server.Run(ctx, func(ctx context.Context, info serverInfo) error {
		if o.agents == 0 {
			return nil
		}
		bin, err := o.findAgentBinary(ctx)
		if err != nil {
			return err
		}
		tok, err := bootstrap.Generate()
		if err != nil {
			return err
		}
		tok.AutoApprove, tok.Description = true, "drover up: local agents"
		exp := time.Now().Add(time.Hour)
		tok.Expires = &exp
		if err := bootstrap.Create(ctx, info.Client, o.server.comp.namespace, tok); err != nil {
			return err
		}
		workRoot, err := upWorkRoot(o.server.dataDir)
		if err != nil {
			return err
		}
		names := make([]string, 0, o.agents)
		// Ended by ctx; waited for so that `drover up` returns once its
		// agents have stopped.
		var agents sync.WaitGroup
		for i := 1; i <= o.agents; i++ {
			name := o.namePrefix + "-" + strconv.Itoa(i)
			names = append(names, name)
			dir, _ := filepath.Abs(filepath.Join(o.server.dataDir, "agents", name))
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return err
			}
			agentBin, err := agentBinaryCopy(bin, filepath.Join(dir, "bin"))
			if err != nil {
				return err
			}
			logf, err := os.OpenFile(filepath.Join(dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
			if err != nil {
				return err
			}
			args := []string{"--node", name, "--hub", info.Hub, "--token", tok.String(), "--ca-file", info.CAFile,
				"--state-dir", dir, "--labels", "drover.io/local=true",
				// Ctrl-C on `drover up` stops everything it started.
				"--stop-tasks-on-exit"}
			if workRoot != "" {
				args = append(args, "--work-dir", filepath.Join(workRoot, name))
			}
			if o.transport == "mqtt" {
				args = append(args, "--transport", "mqtt", "--mqtt-broker", info.MQTT, "--mqtt-prefix", o.server.comp.mqtt.prefix)
			}
			cmd := exec.Command(agentBin, args...)
			cmd.Stdout, cmd.Stderr = logf, logf
			if err := cmd.Start(); err != nil {
				logf.Close()
				return fmt.Errorf("start agent %s: %w", name, err)
			}
			agents.Go(func() { superviseAgent(ctx, cmd, logf, name, info) })
		}
		fmt.Fprintf(o.server.out, "Started %d local agents (logs and binaries under %s).\n", o.agents, filepath.Join(o.server.dataDir, "agents"))
		o.waitOnline(ctx, info, names)
		<-ctx.Done()
		agents.Wait()
		return nil
	})
}

// upGrantName is the NodeGrant `drover up` makes so that the quick start
// runs: namespace upNamespace may run tasks on every node, as the node's
// unprivileged task user, inside each attempt's own directory.
const (
	upGrantName = "drover-up"
	upNamespace = "default"
)

// ensureUpGrant creates the quick start's NodeGrant if it is absent; one
// that exists (an administrator may have narrowed it) is left as it is.
func ensureUpGrant(ctx context.Context, c client.Client) error {
	g := &fleetv1.NodeGrant{
		ObjectMeta: metav1.ObjectMeta{Name: upGrantName, Labels: map[string]string{"app.kubernetes.io/managed-by": "drover-up"}},
		Spec:       fleetv1.NodeGrantSpec{Namespaces: []string{upNamespace}},
	}
	if err := c.Create(ctx, g); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create NodeGrant %s (namespace %s may run tasks on every node): %w", upGrantName, upNamespace, err)
	}
	return nil
}

// upOnlineTimeout bounds how long `drover up` waits to report its agents
// Online; the fleet keeps running either way.
const upOnlineTimeout = 2 * time.Minute

// waitOnline reports progress until every local agent is Online, or says
// which are not and where their logs are.
func (o *upOptions) waitOnline(ctx context.Context, info serverInfo, names []string) {
	ctx, cancel := context.WithTimeout(ctx, upOnlineTimeout)
	defer cancel()
	last := -1
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		var missing []string
		for _, name := range names {
			var n fleetv1.FleetNode
			if err := info.Client.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil || n.Status.Phase != fleetv1.FleetNodeOnline {
				missing = append(missing, name)
			}
		}
		if online := len(names) - len(missing); online != last {
			fmt.Fprintf(o.server.out, "%d/%d agents Online\n", online, len(names))
			last = online
		}
		if len(missing) == 0 {
			fmt.Fprintf(o.server.out, "Watch them: kubectl --kubeconfig %s get fleetnodes -w\n", info.Kubeconfig)
			return
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				fmt.Fprintf(o.server.out, "not Online after %v: %s; see %s\n", upOnlineTimeout, strings.Join(missing, ", "),
					filepath.Join(o.server.dataDir, "agents", missing[0], "agent.log"))
			}
			return
		case <-tick.C:
		}
	}
}

// superviseAgent stops an agent process when ctx ends (SIGTERM, then SIGKILL
// after 10s) and reports an early exit.
func superviseAgent(ctx context.Context, cmd *exec.Cmd, logf *os.File, name string, info serverInfo) {
	defer logf.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		switch {
		case ctx.Err() != nil:
		case err == nil:
			// A signal to the process group (Ctrl-C) may reach the agent
			// before `drover up` sees it.
			info.Log.Info("agent stopped", "node", name, "log", logf.Name())
		default:
			info.Log.Error("agent exited", "node", name, "err", err, "log", logf.Name())
		}
	case <-ctx.Done():
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
}

// findAgentBinary looks next to drover, then on $PATH, then builds it from
// the source checkout in the working directory (the `go run` quick start).
func (o *upOptions) findAgentBinary(ctx context.Context) (string, error) {
	if o.agentBinary != "" {
		return o.agentBinary, nil
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), "drover-agent")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath("drover-agent"); err == nil {
		return p, nil
	}
	if _, err := os.Stat(filepath.Join("cmd", "drover-agent", "main.go")); err != nil {
		return "", errors.New("no drover-agent binary found: pass --agent-binary, put it next to drover or on $PATH, or run from the source checkout")
	}
	out, _ := filepath.Abs(filepath.Join(o.server.dataDir, "bin", "drover-agent"))
	fmt.Fprintf(o.server.out, "Building drover-agent into %s ...\n", out)
	build := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/drover-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build drover-agent: %w\n%s", err, b)
	}
	return out, nil
}

// upWorkRoot is where the local agents keep their tasks' dirs when they
// run as root, and so run tasks as nobody: outside the data dir, which is
// 0700 (it holds the control plane's PKI and admin kubeconfig) and may
// sit in a home dir nobody can traverse. "" when not root: tasks then run
// as the agents' own user, who reaches the default under the data dir.
func upWorkRoot(dataDir string) (string, error) {
	if os.Geteuid() != 0 {
		return "", nil
	}
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(abs))
	root := filepath.Join(os.TempDir(), "drover-up-work-"+hex.EncodeToString(sum[:6]))
	if err := os.Mkdir(root, 0o711); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("create the local agents' work dir: %w", err)
	}
	// In a shared /tmp someone may have made it first, or a symlink.
	fi, err := os.Lstat(root)
	if err != nil {
		return "", err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !fi.IsDir() || !ok || st.Uid != 0 {
		return "", fmt.Errorf("%s is not a directory root owns: remove it, or run drover up with another --data-dir", root)
	}
	if err := os.Chmod(root, 0o711); err != nil {
		return "", err
	}
	return root, nil
}
