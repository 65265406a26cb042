// Package testenv is the harness for tests that need a real Kubernetes API
// server: integration tests of controllers and the hub, and end-to-end tests
// with real drover and drover-agent processes.
//
// It builds the drover binary from this repository once per `go test` run
// (Binary) and runs `drover controlplane` (etcd + kube-apiserver + Drover's
// CRDs) as a subprocess (Start, or StartMain from TestMain). Test binaries
// therefore do not link the ~200 MB apiserver, and one cold build serves
// every test package.
//
// This package must never import internal/controlplane or anything that
// links kube-apiserver: every test binary that uses it would grow by the
// whole apiserver and take minutes to link.
//
// Under `go test -short` Start skips the test and StartMain starts nothing.
//
// Costs on a 2-core machine: the first build of cmd/drover with a cold Go
// build cache takes minutes (warm it with `go build ./cmd/drover` before a
// long test run, or raise `go test -timeout`); when nothing changed a later
// run costs a few seconds. A control plane is ready in a few seconds and uses
// a few hundred MB of RSS: prefer one per test package (StartMain) and
// separate namespaces per test over one per test.
package testenv
