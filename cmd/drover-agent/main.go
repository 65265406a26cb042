// Command drover-agent runs on every machine of the fleet. It imports nothing
// from k8s.io: it speaks only the agent protocol.
package main

import (
	"context"
	"os"
	"sync"

	"github.com/drover-fleet/drover/internal/agent"
	"github.com/drover-fleet/drover/internal/agent/cmd"
)

func main() { os.Exit(run(os.Args[1:])) }

// run is the agent (or one of its shims, which run as long as a task) with
// its memory kept trimmed beside it: left alone, an idle agent holds pages
// of its binary that start-up touched and heap the collector already freed
// (bench/RESULTS.md, Agent idle RSS).
func run(args []string) int {
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		agent.KeepMemoryTrimmed(ctx, agent.DefaultTrimFirst, agent.DefaultTrimEvery)
	}()
	code := cmd.Main(args)
	stop()
	wg.Wait()
	return code
}
