//go:build !linux

package testenv

import "syscall"

// runID is "" off Linux: Binary then always asks `go build`, which is cheap
// when nothing changed.
func runID() string { return "" }

func childAttrs() *syscall.SysProcAttr { return nil }
