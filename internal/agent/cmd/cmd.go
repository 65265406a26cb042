// Package cmd is drover-agent's command line. It uses the standard flag
// package: the agent binary stays small and free of k8s.io.
package cmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/drover-fleet/drover/internal/agent"
	"github.com/drover-fleet/drover/internal/agent/cgroup"
	"github.com/drover-fleet/drover/internal/agent/mqttclient"
	"github.com/drover-fleet/drover/internal/agent/taskexec"
	"github.com/drover-fleet/drover/internal/mqtt/topics"
)

// Version is set at build time: -ldflags "-X github.com/drover-fleet/drover/internal/agent/cmd.Version=v1.2.3".
var Version = "dev"

// failAtStart is a test-only knob: a binary built with
// -ldflags "-X github.com/drover-fleet/drover/internal/agent/cmd.failAtStart=true"
// exits 1 before doing anything, --version included, so that upgrade tests
// have a real binary that cannot start. Release builds never set it.
var failAtStart = ""

// Main parses args, runs the agent and returns the exit code.
func Main(args []string) int {
	if len(args) > 0 && args[0] == cgroup.ShimArg {
		// The agent re-executed itself to start a task inside its v1
		// cgroups; on success this does not return.
		return cgroup.RunShim(args[1:])
	}
	if len(args) > 0 && args[0] == taskexec.LogShimArg {
		// The agent re-executed itself as a task attempt's log shim.
		return taskexec.RunLogShim(args[1:])
	}
	if failAtStart == "true" {
		fmt.Fprintln(os.Stderr, "drover-agent: built with failAtStart (a test binary that cannot start)")
		return 1
	}
	fs := flag.NewFlagSet("drover-agent", flag.ContinueOnError)
	var (
		o         agent.Options
		hubs      string
		labels    string
		capacity  string
		logLevel  string
		heartbeat time.Duration
		version   bool
		transport string
		mq        mqttclient.Options
		retention time.Duration
		cgroups   string
		cgParent  string
		taskUser  string
	)
	host, _ := os.Hostname()
	fs.StringVar(&o.Node, "node", strings.ToLower(host), "this machine's node name")
	fs.StringVar(&hubs, "hub", "127.0.0.1:7443", "hub addresses host:port, comma-separated; tried in turn")
	fs.StringVar(&o.BootstrapToken, "token", os.Getenv("DROVER_TOKEN"), "bootstrap token (only needed to register; or $DROVER_TOKEN)")
	fs.StringVar(&o.CAFile, "ca-file", "", "Drover's CA certificate, to trust the hub when registering (`drover ca`)")
	fs.StringVar(&o.StateDir, "state-dir", "/var/lib/drover-agent",
		"directory for the agent's database, keys and the tasks' logs; kept 0700 (the agent narrows a wider mode at start)")
	fs.StringVar(&o.WorkDir, "work-dir", "",
		"directory of the task attempts' own dirs (their working dir and HOME, 0700 and owned by the task's user); itself 0711, "+
			"so every dir above it must let the task users through. Default: the state dir + \"-work\" (/var/lib/drover-agent-work)")
	fs.StringVar(&taskUser, "task-user", taskexec.DefaultTaskUser,
		"user tasks run as when their securityContext names none: a name, a uid, or uid:gid (default nobody, else 65534:65534). "+
			"Only an agent running as root switches users; otherwise tasks run as the agent's user")
	fs.BoolVar(&o.AllowRootTasks, "allow-root-tasks", false,
		"let a task run as uid or gid 0 when its securityContext asks (a NodeGrant must allow it too); without it such a task fails, RunAsRefused")
	fs.StringVar(&labels, "labels", "", "labels to report, k=v,k2=v2")
	fs.StringVar(&capacity, "capacity", "",
		"resources to report besides the detected cpu and memory, name=quantity,... (e.g. gpu=1,example.com/fpga=2); "+
			"a name given here overrides the detected value (memory=4Gi)")
	fs.DurationVar(&heartbeat, "heartbeat-interval", 0, "override the hub's heartbeat interval")
	fs.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&transport, "transport", "grpc", "how to carry the agent protocol: grpc (to --hub) or mqtt (to --mqtt-broker; with --hub, registration and renewal use --hub). "+
		"--mqtt-broker without --hub implies mqtt")
	fs.StringVar(&mq.Broker, "mqtt-broker", "", "MQTT broker URL ssl://host:port, for --transport mqtt. Without --hub: the hubs' embedded brokers, comma-separated, tried in turn; "+
		"the agent registers (with --token), renews and works over MQTT only, and moves to the next broker when its hub dies")
	fs.StringVar(&mq.Prefix, "mqtt-prefix", topics.DefaultPrefix, "MQTT topic prefix, for --transport mqtt")
	fs.DurationVar(&retention, "task-retention", taskexec.DefaultRetention,
		"how long an ended task attempt's dirs (its logs under --state-dir/tasks, its own dir under --work-dir) stay after the attempt ended "+
			"(finished, or stopped because the hub dropped it); 0 keeps them for ever. drover logs can read a task's output until then")
	fs.Int64Var(&o.MaxArtifactBytes, "max-artifact-bytes", taskexec.DefaultMaxArtifactBytes,
		"largest task artifact to download, in bytes; a larger one fails the task before it starts")
	fs.BoolVar(&o.StopTasksOnExit, "stop-tasks-on-exit", false,
		"stop running task processes when the agent stops (SIGTERM, SIGKILL 5s later) and report them Failed, AgentStopped. "+
			"Default: they run on and the agent takes them over when it starts again (restarts and upgrades keep the fleet's work)")
	fs.StringVar(&cgroups, "cgroups", "auto",
		"contain each task attempt in a cgroup of its own (memory and cpu limits from its resources; stopping it kills every process it started): "+
			"auto (when the node has cgroup v1 or v2 and the agent may create cgroups; else process groups only), off, or required (refuse to start without)")
	fs.StringVar(&cgParent, "cgroup-parent", "",
		"cgroup under which task attempts' cgroups are created, as a path from each hierarchy's root (e.g. /drover); default: a drover child of the agent's own cgroup")
	fs.BoolVar(&version, "version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if version {
		fmt.Println(Version)
		return 0
	}
	switch {
	case retention < 0:
		fmt.Fprintf(os.Stderr, "drover-agent: --task-retention %s: want a duration of 0 (keep for ever) or more\n", retention)
		return 2
	case retention == 0:
		o.TaskRetention = -1 // taskexec: keep for ever
	default:
		o.TaskRetention = retention
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if given["task-user"] {
		u, err := taskexec.LookupUser(taskUser)
		if err != nil {
			fmt.Fprintf(os.Stderr, "drover-agent: --task-user: %v\n", err)
			return 2
		}
		if (u.UID == 0 || u.GID == 0) && !o.AllowRootTasks && os.Geteuid() == 0 {
			fmt.Fprintf(os.Stderr, "drover-agent: --task-user %s is root: every task would run as root; add --allow-root-tasks if that is meant\n", taskUser)
			return 2
		}
		o.TaskUser = &u
	}
	if o.MaxArtifactBytes <= 0 {
		fmt.Fprintf(os.Stderr, "drover-agent: --max-artifact-bytes %d: want a size in bytes above 0\n", o.MaxArtifactBytes)
		return 2
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "drover-agent: --log-level %q: want debug, info, warn or error\n", logLevel)
		return 2
	}
	o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	switch cgroups {
	case "off":
	case "auto", "required":
		m, err := cgroup.New(cgroup.Options{Parent: cgParent, Logger: o.Logger})
		switch {
		case err == nil:
			o.Cgroups = m
		case cgroups == "required" || !errors.Is(err, cgroup.ErrUnavailable):
			fmt.Fprintf(os.Stderr, "drover-agent: --cgroups %s: %v\n", cgroups, err)
			return 2
		default:
			o.Logger.Warn("cgroups unavailable: task attempts run in process groups only, without resource limits (--cgroups=required refuses this)", "err", err)
		}
	default:
		fmt.Fprintf(os.Stderr, "drover-agent: --cgroups %q: want auto, off or required\n", cgroups)
		return 2
	}
	o.Version = Version
	brokerOnly := mq.Broker != "" && !given["hub"]
	if brokerOnly && given["transport"] && transport != "mqtt" {
		fmt.Fprintf(os.Stderr, "drover-agent: --transport %s with --mqtt-broker and no --hub: give the hubs' gRPC addresses (--hub) or use --transport mqtt\n", transport)
		return 2
	}
	switch {
	case brokerOnly:
		// A robot that reaches only the brokers: its hubs are the
		// brokers; it registers as a joiner and renews over its session.
		if _, err := topics.New(mq.Prefix); err != nil {
			fmt.Fprintf(os.Stderr, "drover-agent: --mqtt-prefix: %v\n", err)
			return 2
		}
		for b := range strings.SplitSeq(mq.Broker, ",") {
			if b = strings.TrimSpace(b); b == "" {
				continue
			}
			if _, _, err := topics.BrokerURL(b); err != nil {
				fmt.Fprintf(os.Stderr, "drover-agent: --mqtt-broker: %v\n", err)
				return 2
			}
			o.Hubs = append(o.Hubs, b)
		}
		prefix := mq.Prefix
		mq.Broker, mq.Node, mq.Logger = "", o.Node, o.Logger
		o.Connect = mqttclient.Connector(mq)
		o.Register = mqttclient.Registrar(mqttclient.JoinOptions{Prefix: prefix, Logger: o.Logger})
		o.RenewOverSession = true
		hubs = ""
	case transport == "grpc":
	case transport == "mqtt":
		if strings.Contains(mq.Broker, ",") {
			fmt.Fprintln(os.Stderr, "drover-agent: --mqtt-broker with --hub takes one broker (an external one); several brokers are for agents without --hub")
			return 2
		}
		if mq.Broker == "" {
			fmt.Fprintln(os.Stderr, "drover-agent: --transport mqtt needs --mqtt-broker ssl://host:port")
			return 2
		}
		if _, _, err := topics.BrokerURL(mq.Broker); err != nil {
			fmt.Fprintf(os.Stderr, "drover-agent: --mqtt-broker: %v\n", err)
			return 2
		}
		if _, err := topics.New(mq.Prefix); err != nil {
			fmt.Fprintf(os.Stderr, "drover-agent: --mqtt-prefix: %v\n", err)
			return 2
		}
		mq.Node, mq.Logger = o.Node, o.Logger
		o.Connect = mqttclient.Connector(mq)
	default:
		fmt.Fprintf(os.Stderr, "drover-agent: --transport %q: want grpc or mqtt\n", transport)
		return 2
	}
	o.HeartbeatInterval = heartbeat
	for h := range strings.SplitSeq(hubs, ",") {
		if h = strings.TrimSpace(h); h != "" {
			o.Hubs = append(o.Hubs, h)
		}
	}
	if labels != "" {
		o.Labels = map[string]string{}
		for kv := range strings.SplitSeq(labels, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				fmt.Fprintf(os.Stderr, "drover-agent: --labels %q: want k=v pairs separated by commas\n", kv)
				return 2
			}
			o.Labels[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	extra, err := agent.ParseCapacity(capacity)
	if err != nil {
		fmt.Fprintf(os.Stderr, "drover-agent: --capacity %v\n", err)
		return 2
	}
	if extra != nil {
		o.Capacity = agent.DetectCapacity()
		maps.Copy(o.Capacity, extra)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := agent.Run(ctx, o); err != nil {
		var fatal *agent.FatalError
		if errors.As(err, &fatal) {
			fmt.Fprintf(os.Stderr, "drover-agent: %v\n", err)
			return 3
		}
		fmt.Fprintf(os.Stderr, "drover-agent: %v\n", err)
		return 1
	}
	return 0
}
