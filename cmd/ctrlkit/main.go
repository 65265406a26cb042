// Command ctrlkit generates state loaders, action interfaces and a
// reconciler skeleton from a CtrlKit DSL document. See docs/ctrlkit.md.
//
//	//go:generate go run github.com/drover-fleet/drover/cmd/ctrlkit gen -o zz_generated.ctrlkit.go foo.ctrlkit
package main

import (
	"fmt"
	"os"

	"github.com/drover-fleet/drover/pkg/ctrlkit/gen"
)

func main() {
	cmd := gen.Command{Stdout: os.Stdout, Stderr: os.Stderr}
	if err := cmd.Run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
