// Package cmd is drover-agent's command line. It uses the standard flag
// package: the agent binary stays small and free of k8s.io.
package cmd

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/drover-fleet/drover/internal/agent"
	"github.com/drover-fleet/drover/internal/agent/cgroup"
	"github.com/drover-fleet/drover/internal/agent/mqttclient"
	"github.com/drover-fleet/drover/internal/agent/taskexec"
)

// Version is set at build time: -ldflags "-X github.com/drover-fleet/drover/internal/agent/cmd.Version=v1.2.3".
var Version = "dev"

// failAtStart is a test-only knob: a binary built with
// -ldflags "-X github.com/drover-fleet/drover/internal/agent/cmd.failAtStart=true"
// exits 1 before doing anything, --version included, so that upgrade tests
// have a real binary that cannot start. Release builds never set it.
var failAtStart = ""

// Exit codes. The systemd unit written by `drover-agent install` does not
// restart the agent after exitUsage or exitFatal: starting again with the
// same flags cannot help.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
	exitFatal = 3
)

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
		return exitError
	}
	if len(args) > 0 {
		switch args[0] {
		case "install":
			return runInstall(args[1:], os.Stdout, os.Stderr)
		case "uninstall":
			return runUninstall(args[1:], os.Stdout, os.Stderr)
		}
	}
	s := newSettings()
	if err := s.fs.Parse(args); err != nil {
		return exitUsage
	}
	if s.version {
		// Before the config file: the upgrade probe runs `<new> --version`.
		fmt.Println(Version)
		return exitOK
	}
	if s.config != "" {
		if err := s.loadConfig(s.config, s.given()); err != nil {
			fmt.Fprintf(os.Stderr, "drover-agent: %v\n", err)
			return exitUsage
		}
	}
	o, err := s.options()
	if err != nil {
		fmt.Fprintf(os.Stderr, "drover-agent: %v\n", err)
		return exitUsage
	}
	if s.checkConfig {
		if err := s.printEffective(os.Stdout); err != nil {
			fmt.Fprintf(os.Stderr, "drover-agent: %v\n", err)
			return exitError
		}
		return exitOK
	}
	o.Version = Version
	o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: s.level}))
	switch {
	case s.brokerOnly():
		mq := s.mq
		mq.Broker, mq.Node, mq.Logger = "", o.Node, o.Logger
		o.Connect = mqttclient.Connector(mq)
		o.Register = mqttclient.Registrar(mqttclient.JoinOptions{Prefix: s.mq.Prefix, Logger: o.Logger})
		o.RenewOverSession = true
	case s.mq.Broker != "" && s.transport == "mqtt":
		s.mq.Node, s.mq.Logger = o.Node, o.Logger
		o.Connect = mqttclient.Connector(s.mq)
	}
	if s.cgroups != "off" {
		m, err := cgroup.New(cgroup.Options{Parent: s.cgParent, Logger: o.Logger})
		switch {
		case err == nil:
			o.Cgroups = m
		case s.cgroups == "required" || !errors.Is(err, cgroup.ErrUnavailable):
			fmt.Fprintf(os.Stderr, "drover-agent: --cgroups %s: %v\n", s.cgroups, err)
			return exitUsage
		default:
			o.Logger.Warn("cgroups unavailable: task attempts run in process groups only, without resource limits (--cgroups=required refuses this)", "err", err)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if s.metrics != "" {
		o.Metrics = agent.NewMetrics(Version, time.Now())
		l, err := net.Listen("tcp", s.metrics)
		if err != nil {
			fmt.Fprintf(os.Stderr, "drover-agent: --metrics-addr: %v\n", err)
			return exitError
		}
		o.Logger.Info("serving metrics", "url", "http://"+l.Addr().String()+"/metrics")
		stopMetrics := serveMetrics(l, o.Metrics, o.Logger)
		defer stopMetrics()
	}
	if err := agent.Run(ctx, o); err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			// Stopped by a signal while waiting (to register, say): a clean
			// stop, which Restart=on-failure must not answer with a restart.
			return exitOK
		}
		fmt.Fprintf(os.Stderr, "drover-agent: %v\n", err)
		var fatal *agent.FatalError
		if errors.As(err, &fatal) {
			return exitFatal
		}
		return exitError
	}
	return exitOK
}

// serveMetrics serves m on l until the returned func is called.
//
// It answers GET /metrics itself, one request per connection (Connection:
// close, which Prometheus handles), instead of running an http.Server: the
// server (with its HTTP/2 half) adds ~0.35 MiB to an agent that must stay
// under 20 MiB. The request is still parsed by net/http's ReadRequest.
func serveMetrics(l net.Listener, m *agent.Metrics, log *slog.Logger) (stop func()) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := l.Accept()
			if err != nil {
				if !errors.Is(err, net.ErrClosed) {
					log.Error("metrics listener stopped", "err", err)
				}
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				answerMetrics(conn, m)
			}()
		}
	}()
	return func() {
		_ = l.Close()
		wg.Wait() // each connection ends within its deadline
	}
}

// metricsConnTimeout bounds one scrape's connection: a stalled client
// cannot hold it, nor stop the agent from stopping.
const metricsConnTimeout = 10 * time.Second

func answerMetrics(conn net.Conn, m *agent.Metrics) {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(metricsConnTimeout))
	req, err := http.ReadRequest(bufio.NewReader(conn))
	if err != nil {
		return
	}
	status, ctype, body := http.StatusOK, "text/plain; version=0.0.4; charset=utf-8", &bytes.Buffer{}
	switch {
	case req.URL.Path != "/metrics":
		status, ctype = http.StatusNotFound, "text/plain; charset=utf-8"
		body.WriteString("not found: the agent serves /metrics only\n")
	case req.Method != http.MethodGet && req.Method != http.MethodHead:
		status, ctype = http.StatusMethodNotAllowed, "text/plain; charset=utf-8"
		body.WriteString("want GET\n")
	default:
		_ = m.Write(body)
	}
	fmt.Fprintf(conn, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n",
		status, http.StatusText(status), ctype, body.Len())
	if req.Method != http.MethodHead {
		_, _ = conn.Write(body.Bytes())
	}
}
