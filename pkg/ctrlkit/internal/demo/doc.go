// Package demo is a small controller written with ctrlkit and its
// generator, kept as a working example and as the test that generated code
// runs: demo.ctrlkit declares the states and actions, zz_generated.ctrlkit.go
// is generated from it by go generate, and actions.go implements them.
//
// The controller watches ConfigMaps labelled demo=true (the selection is the
// test's business), makes sure each has a Secret named <name>-creds that it
// controls, and records how many of its pods exist.
package demo

//go:generate go run github.com/drover-fleet/drover/cmd/ctrlkit gen -o zz_generated.ctrlkit.go demo.ctrlkit
