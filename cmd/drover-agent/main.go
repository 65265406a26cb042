// Command drover-agent runs on every machine of the fleet. It imports nothing
// from k8s.io: it speaks only the agent protocol.
package main

import (
	"os"

	"github.com/drover-fleet/drover/internal/agent/cmd"
)

func main() { os.Exit(cmd.Main(os.Args[1:])) }
