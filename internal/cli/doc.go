// Package cli is the drover command: one file per subcommand, each an
// Options struct with Validate and Run(ctx). No flag is bound to a
// package-level variable.
package cli
