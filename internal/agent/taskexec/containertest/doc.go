// Package containertest tests the exec driver's containerd attempts
// (taskexec, driver containerd) against a real containerd started by
// ctrdtest: its test binary stands in for drover-agent (the log shim) and
// for drover-containerd (the companion).
package containertest
