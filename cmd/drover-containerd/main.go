// Command drover-containerd is drover-agent's companion for the containerd
// task driver (see internal/ctrd): drover-agent runs it, people need not.
package main

import (
	"os"

	"github.com/drover-fleet/drover/internal/ctrd"
)

func main() { os.Exit(ctrd.Main(os.Args[1:])) }
