//go:build droverpprof

package main

import (
	"net/http"
	_ "net/http/pprof" // registers /debug/pprof on the default mux
	"os"
)

// A build with -tags droverpprof serves net/http/pprof on the address in
// DROVER_AGENT_PPROF (loopback only, no authentication): how the agent's
// idle memory was measured (bench/RESULTS.md, Agent idle RSS). Release
// builds do not have it.
func init() {
	addr := os.Getenv("DROVER_AGENT_PPROF")
	if addr == "" {
		return
	}
	// The server lives as long as the process: a debug build only.
	go func() { _ = http.ListenAndServe(addr, nil) }() //nolint:gosec // loopback debug server
}
