// Command agentsim runs many simulated Drover agents in one process, speaking
// the real agent protocol (internal/protocol/agentv1) over loopback with real
// TLS: each agent makes its own key and CSR, registers with a bootstrap
// token, then holds a GetMessage stream with its own client certificate
// (mTLS, one TCP connection per agent), reports its NodeState, sends
// heartbeats and acks what the hub sends. bench/fleet starts several of
// these against one hub.
//
//	agentsim -hub 127.0.0.1:7443 -ca ca.crt -token ID.SECRET -agents 5000 -first 0 -src-first 10 -src-count 8
//
// With -nodejobs each agent also answers node-job upgrade items
// (wire.TypeUpgrade) at once with no-op actions: it acks the item and sends,
// one SendMessage each, Running for Check and BackUp and Succeeded for
// Upgrade (bench/nodejob).
//
// With -echo-hub it is instead a trivial AgentHub server (the benchmark's
// baseline): same gRPC/TLS server settings as the hub, certificates signed in
// memory, no Kubernetes API, no liveness tracking.
//
// Every -report interval it prints one line to stdout:
//
//	stat registered=N connected=N ...
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	var o simOptions
	echo := flag.Bool("echo-hub", false, "run the baseline echo hub instead of agents")
	echoListen := flag.String("listen", "127.0.0.1:0", "echo hub: listen address")
	echoCA := flag.String("ca-out", "", "echo hub: write its CA certificate (PEM) here")
	flag.StringVar(&o.hub, "hub", "", "hub address host:port")
	flag.StringVar(&o.caFile, "ca", "", "Drover's CA certificate (PEM), to trust the hub when registering")
	flag.StringVar(&o.token, "token", "", "bootstrap token (an auto-approve one)")
	flag.IntVar(&o.agents, "agents", 1000, "simulated agents in this process")
	flag.IntVar(&o.first, "first", 0, "index of the first agent (node names are <prefix>-<index>)")
	flag.StringVar(&o.prefix, "prefix", "sim", "node name prefix")
	flag.IntVar(&o.srcFirst, "src-first", 1, "first source address 127.0.0.<src-first>")
	flag.IntVar(&o.srcCount, "src-count", 1, "spread connections over this many source addresses")
	flag.IntVar(&o.concurrency, "concurrency", 8, "agents registering and connecting at once")
	flag.DurationVar(&o.heartbeat, "heartbeat", 30*time.Second, "heartbeat interval (each agent gets a random phase)")
	flag.IntVar(&o.workers, "workers", 32, "goroutines sending heartbeats")
	flag.DurationVar(&o.report, "report", 5*time.Second, "how often to print a stat line")
	flag.BoolVar(&o.nodeJobs, "nodejobs", false, "answer node-job upgrade items at once with no-op actions, as the real agent reports them (Check, BackUp, Upgrade)")
	flag.StringVar(&o.version, "version", "agentsim", "agent version the simulated agents report (-nodejobs: the version an upgrade starts from)")
	labels := flag.String("labels", "", "node labels k=v,k=v the agents report (the hub puts them on the FleetNodes)")
	flag.Parse()
	if *labels != "" {
		o.labels = map[string]string{}
		for kv := range strings.SplitSeq(*labels, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				fmt.Fprintf(os.Stderr, "agentsim: -labels: %q is not k=v\n", kv)
				os.Exit(2)
			}
			o.labels[k] = v
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if *echo {
		err = runEchoHub(ctx, *echoListen, *echoCA)
	} else {
		err = runSim(ctx, o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "agentsim:", err)
		os.Exit(1)
	}
}
