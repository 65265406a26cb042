// Package statemetrics exports gauges of Drover's objects as the manager's
// informer cache holds them, the way kube-state-metrics does for built-in
// kinds: FleetNodes by hub and phase, node jobs and FleetJobs by phase,
// Tasks by state, the failed jobs that still exist, and whether each hub's
// Lease is current.
//
// The figures are computed at scrape time from the cache (no API calls, no
// goroutine), and only by the elected manager, so that summing over
// manager replicas does not count an object twice. Every label value the
// API defines is exported at zero from the start, so that dashboards and
// alerts find their series before the first object exists.
//
// It does not count per-node work detail (NodeTaskSlices) nor anything
// hubs keep in memory: hubs export their own series.
package statemetrics
