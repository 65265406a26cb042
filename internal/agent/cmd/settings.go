package cmd

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/drover-fleet/drover/internal/agent"
	"github.com/drover-fleet/drover/internal/agent/mqttclient"
	"github.com/drover-fleet/drover/internal/agent/taskexec"
	"github.com/drover-fleet/drover/internal/ctrd/ctrdwire"
	"github.com/drover-fleet/drover/internal/mqtt/topics"
)

// settings are the agent's flags: one field per flag and the flag set that
// fills them. `drover-agent install` parses the same set, so a unit is only
// written for flags the agent accepts.
type settings struct {
	fs *flag.FlagSet

	o         agent.Options
	hubs      string
	labels    string
	capacity  string
	logLevel  string
	level     slog.Level
	heartbeat time.Duration
	version   bool
	transport string
	mq        mqttclient.Options
	retention time.Duration
	cgroups   string
	cgParent  string
	taskUser  string
	metrics   string
	ctrdAddr  string
	ctrdComp  string
	apps      bool
	instPorts string
	sockDir   string

	config      string
	checkConfig bool
}

// notConfig are the flags a config file may not set: they choose what the
// command does, not how the agent runs.
var notConfig = map[string]bool{"config": true, "check-config": true, "version": true}

func newSettings() *settings {
	s := &settings{fs: flag.NewFlagSet("drover-agent", flag.ContinueOnError)}
	fs := s.fs
	host, _ := os.Hostname()
	fs.StringVar(&s.o.Node, "node", strings.ToLower(host), "this machine's node name")
	fs.StringVar(&s.hubs, "hub", "127.0.0.1:7443", "hub addresses host:port, comma-separated; tried in turn")
	fs.StringVar(&s.o.BootstrapToken, "token", os.Getenv("DROVER_TOKEN"), "bootstrap token (only needed to register; or $DROVER_TOKEN)")
	fs.StringVar(&s.o.CAFile, "ca-file", "", "Drover's CA certificate, to trust the hub when registering (`drover ca`)")
	fs.StringVar(&s.o.StateDir, "state-dir", "/var/lib/drover-agent",
		"directory for the agent's database, keys and the tasks' logs; kept 0700 (the agent narrows a wider mode at start)")
	fs.StringVar(&s.o.WorkDir, "work-dir", "",
		"directory of the task attempts' own dirs (their working dir and HOME, 0700 and owned by the task's user); itself 0711, "+
			"so every dir above it must let the task users through. Default: the state dir + \"-work\" (/var/lib/drover-agent-work)")
	fs.StringVar(&s.taskUser, "task-user", taskexec.DefaultTaskUser,
		"user tasks run as when their securityContext names none: a name, a uid, or uid:gid (default nobody, else 65534:65534). "+
			"Only an agent running as root switches users; otherwise tasks run as the agent's user")
	fs.BoolVar(&s.o.AllowRootTasks, "allow-root-tasks", false,
		"let a task run as uid or gid 0 when its securityContext asks (a NodeGrant must allow it too); without it such a task fails, RunAsRefused")
	fs.StringVar(&s.labels, "labels", "", "labels to report, k=v,k2=v2")
	fs.StringVar(&s.capacity, "capacity", "",
		"resources to report besides the detected cpu and memory, name=quantity,... (e.g. gpu=1,example.com/fpga=2); "+
			"a name given here overrides the detected value (memory=4Gi)")
	fs.DurationVar(&s.heartbeat, "heartbeat-interval", 0, "override the hub's heartbeat interval")
	fs.StringVar(&s.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&s.transport, "transport", "grpc", "how to carry the agent protocol: grpc (to --hub) or mqtt (to --mqtt-broker; with --hub, registration and renewal use --hub). "+
		"--mqtt-broker without --hub implies mqtt")
	fs.StringVar(&s.mq.Broker, "mqtt-broker", "", "MQTT broker URL ssl://host:port, for --transport mqtt. Without --hub: the hubs' embedded brokers, comma-separated, tried in turn; "+
		"the agent registers (with --token), renews and works over MQTT only, and moves to the next broker when its hub dies")
	fs.StringVar(&s.mq.Prefix, "mqtt-prefix", topics.DefaultPrefix, "MQTT topic prefix, for --transport mqtt")
	fs.DurationVar(&s.retention, "task-retention", taskexec.DefaultRetention,
		"how long an ended task attempt's dirs (its logs under --state-dir/tasks, its own dir under --work-dir) stay after the attempt ended "+
			"(finished, or stopped because the hub dropped it); 0 keeps them for ever. drover logs can read a task's output until then")
	fs.Int64Var(&s.o.MaxArtifactBytes, "max-artifact-bytes", taskexec.DefaultMaxArtifactBytes,
		"largest task artifact to download, in bytes; a larger one fails the task before it starts")
	fs.BoolVar(&s.o.StopTasksOnExit, "stop-tasks-on-exit", false,
		"stop running task processes when the agent stops (SIGTERM, SIGKILL 5s later) and report them Failed, AgentStopped. "+
			"Default: they run on and the agent takes them over when it starts again (restarts and upgrades keep the fleet's work)")
	fs.StringVar(&s.cgroups, "cgroups", "auto",
		"contain each task attempt in a cgroup of its own (memory and cpu limits from its resources; stopping it kills every process it started): "+
			"auto (when the node has cgroup v1 or v2 and the agent may create cgroups; else process groups only), off, or required (refuse to start without)")
	fs.StringVar(&s.cgParent, "cgroup-parent", "",
		"cgroup under which task attempts' cgroups are created, as a path from each hierarchy's root (e.g. /drover); default: a drover child of the agent's own cgroup")
	fs.StringVar(&s.ctrdAddr, "containerd-address", ctrdwire.DefaultAddress,
		"containerd's socket, for tasks with driver containerd (docs/containers.md); empty: this agent runs no container tasks (they fail, DriverUnavailable)")
	fs.StringVar(&s.ctrdComp, "containerd-companion", "",
		"path of drover-containerd, the companion that talks to containerd; default: drover-containerd next to drover-agent")
	fs.BoolVar(&s.apps, "apps", true,
		"run serverless instances and sessions (serverless.drover.io, docs/serverless.md) and tell hubs so; standby instances need cgroups")
	fs.StringVar(&s.instPorts, "instance-ports", "",
		"host port range of serverless instances, LO-HI (each instance gets its own, e.g. 30000-32767); default: ports the kernel chooses")
	fs.StringVar(&s.sockDir, "session-socket-dir", "",
		"dir of the instances' session service sockets (every dir above it must let the instances' users through, and its path must be short); default: the state dir + \"-sessions\"")
	fs.StringVar(&s.metrics, "metrics-addr", "",
		"serve Prometheus metrics (sessions, work items by type and result, node job actions) on http://ADDR/metrics, e.g. 127.0.0.1:9464; "+
			"default off. Plain HTTP without authentication: keep it on loopback or a trusted network")
	fs.BoolVar(&s.version, "version", false, "print the version and exit")
	fs.StringVar(&s.config, "config", "",
		"YAML file of settings: keys are these flags' names without --, e.g. \"hub: [h1:7443, h2:7443]\"; flags given on the command line win")
	fs.BoolVar(&s.checkConfig, "check-config", false, "check the settings (the config file, then the flags), print the effective ones as YAML and exit")
	return s
}

// brokerOnly: an agent given brokers and no hub (on the command line or in
// its config file) reaches its hubs through their brokers only.
func (s *settings) brokerOnly() bool { return s.mq.Broker != "" && !s.given()["hub"] }

// given is the set of flags set on the command line.
func (s *settings) given() map[string]bool {
	g := map[string]bool{}
	s.fs.Visit(func(f *flag.Flag) { g[f.Name] = true })
	return g
}

// options checks every flag and returns the agent's options, without a
// logger, a connector or cgroups: those have effects (cgroup.New creates
// cgroups), and `install` and `--check-config` must have none. Its errors
// are usage errors naming the flag.
func (s *settings) options() (agent.Options, error) {
	o := s.o
	o.Capacity, o.Labels, o.Hubs = nil, nil, nil
	switch {
	case s.retention < 0:
		return o, fmt.Errorf("--task-retention %s: want a duration of 0 (keep for ever) or more", s.retention)
	case s.retention == 0:
		o.TaskRetention = -1 // taskexec: keep for ever
	default:
		o.TaskRetention = s.retention
	}
	if s.given()["task-user"] {
		u, err := taskexec.LookupUser(s.taskUser)
		if err != nil {
			return o, fmt.Errorf("--task-user: %w", err)
		}
		if (u.UID == 0 || u.GID == 0) && !o.AllowRootTasks && os.Geteuid() == 0 {
			return o, fmt.Errorf("--task-user %s is root: every task would run as root; add --allow-root-tasks if that is meant", s.taskUser)
		}
		o.TaskUser = &u
	}
	if s.ctrdAddr != "" {
		comp := s.ctrdComp
		if comp == "" {
			exe, err := os.Executable()
			if err != nil {
				return o, fmt.Errorf("--containerd-companion: cannot find drover-agent's own path to look next to it: %w", err)
			}
			comp = filepath.Join(filepath.Dir(exe), "drover-containerd")
		}
		o.Containerd = &taskexec.Containerd{Companion: comp, Address: s.ctrdAddr, Namespace: ctrdwire.DefaultNamespace}
	}
	if s.apps {
		o.Apps = &agent.AppOptions{SocketDir: s.sockDir}
		if s.instPorts != "" {
			lo, hi, ok := strings.Cut(s.instPorts, "-")
			var err1, err2 error
			o.Apps.PortMin, err1 = strconv.Atoi(strings.TrimSpace(lo))
			o.Apps.PortMax, err2 = strconv.Atoi(strings.TrimSpace(hi))
			if !ok || err1 != nil || err2 != nil || o.Apps.PortMin < 1 || o.Apps.PortMax > 65535 || o.Apps.PortMin > o.Apps.PortMax {
				return o, fmt.Errorf("--instance-ports %q: want LO-HI with 1 <= LO <= HI <= 65535", s.instPorts)
			}
		}
	}
	if o.MaxArtifactBytes <= 0 {
		return o, fmt.Errorf("--max-artifact-bytes %d: want a size in bytes above 0", o.MaxArtifactBytes)
	}
	if err := s.level.UnmarshalText([]byte(s.logLevel)); err != nil {
		return o, fmt.Errorf("--log-level %q: want debug, info, warn or error", s.logLevel)
	}
	switch s.cgroups {
	case "off", "auto", "required":
	default:
		return o, fmt.Errorf("--cgroups %q: want auto, off or required", s.cgroups)
	}
	if p := s.cgParent; p != "" && (filepath.Clean("/"+p) != "/"+strings.Trim(p, "/") || strings.Contains(p, "..")) {
		return o, fmt.Errorf("--cgroup-parent %q: want a clean path from the hierarchy root, without ..", p)
	}
	brokerOnly := s.brokerOnly()
	if brokerOnly && s.given()["transport"] && s.transport != "mqtt" {
		return o, fmt.Errorf("--transport %s with --mqtt-broker and no --hub: give the hubs' gRPC addresses (--hub) or use --transport mqtt", s.transport)
	}
	switch {
	case brokerOnly:
		// A robot that reaches only the brokers: its hubs are the
		// brokers; it registers as a joiner and renews over its session.
		if _, err := topics.New(s.mq.Prefix); err != nil {
			return o, fmt.Errorf("--mqtt-prefix: %w", err)
		}
		for b := range strings.SplitSeq(s.mq.Broker, ",") {
			if b = strings.TrimSpace(b); b == "" {
				continue
			}
			if _, _, err := topics.BrokerURL(b); err != nil {
				return o, fmt.Errorf("--mqtt-broker: %w", err)
			}
			o.Hubs = append(o.Hubs, b)
		}
	case s.transport == "grpc":
	case s.transport == "mqtt":
		if strings.Contains(s.mq.Broker, ",") {
			return o, errors.New("--mqtt-broker with --hub takes one broker (an external one); several brokers are for agents without --hub")
		}
		if s.mq.Broker == "" {
			return o, errors.New("--transport mqtt needs --mqtt-broker ssl://host:port")
		}
		if _, _, err := topics.BrokerURL(s.mq.Broker); err != nil {
			return o, fmt.Errorf("--mqtt-broker: %w", err)
		}
		if _, err := topics.New(s.mq.Prefix); err != nil {
			return o, fmt.Errorf("--mqtt-prefix: %w", err)
		}
	default:
		return o, fmt.Errorf("--transport %q: want grpc or mqtt", s.transport)
	}
	o.HeartbeatInterval = s.heartbeat
	if !brokerOnly {
		for h := range strings.SplitSeq(s.hubs, ",") {
			if h = strings.TrimSpace(h); h != "" {
				o.Hubs = append(o.Hubs, h)
			}
		}
	}
	if len(o.Hubs) == 0 {
		return o, errors.New("--hub: want at least one host:port (or --mqtt-broker: at least one ssl://host:port)")
	}
	if s.labels != "" {
		o.Labels = map[string]string{}
		for kv := range strings.SplitSeq(s.labels, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return o, fmt.Errorf("--labels %q: want k=v pairs separated by commas", kv)
			}
			o.Labels[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	extra, err := agent.ParseCapacity(s.capacity)
	if err != nil {
		return o, fmt.Errorf("--capacity %w", err)
	}
	if extra != nil {
		o.Capacity = agent.DetectCapacity()
		maps.Copy(o.Capacity, extra)
	}
	return o, nil
}

// printEffective writes every setting as YAML a config file accepts, in
// flag order; the bootstrap token is never printed.
func (s *settings) printEffective(w io.Writer) error {
	var b strings.Builder
	if s.config != "" {
		fmt.Fprintf(&b, "# effective settings: %s, then the command line\n", s.config)
	} else {
		b.WriteString("# effective settings: defaults and the command line\n")
	}
	var err error
	s.fs.VisitAll(func(f *flag.Flag) {
		if notConfig[f.Name] || err != nil {
			return
		}
		v := f.Value.String()
		if f.Name == "token" && v != "" {
			b.WriteString("token: \"<redacted>\"\n")
			return
		}
		if bf, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && bf.IsBoolFlag() {
			fmt.Fprintf(&b, "%s: %s\n", f.Name, v)
			return
		}
		fmt.Fprintf(&b, "%s: %s\n", f.Name, yamlScalar(v))
	})
	if err != nil {
		return err
	}
	_, err = io.WriteString(w, b.String())
	return err
}

// yamlScalar quotes v as a YAML double-quoted string unless it is a plain
// word, so that printed settings read back as the same strings.
func yamlScalar(v string) string {
	plain := v != ""
	for _, r := range v {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._-", r)) {
			plain = false
			break
		}
	}
	switch v {
	case "true", "false", "yes", "no", "on", "off", "null", "y", "n", "~":
		plain = false
	}
	if plain {
		return v
	}
	return fmt.Sprintf("%q", v)
}
