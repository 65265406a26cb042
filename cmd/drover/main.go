// Command drover runs Drover's control plane parts and is its operator CLI.
package main

import (
	"os"

	"github.com/drover-fleet/drover/internal/cli"
)

func main() { os.Exit(cli.Main()) }
