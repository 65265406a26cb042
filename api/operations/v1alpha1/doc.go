// Package v1alpha1 contains the operations.drover.io API: node jobs that run
// one operation on many machines, with the status model of KubeEdge's node
// jobs v1alpha2 (seed 000).
//
//   - NodeUpgradeJob replaces drover-agent with another version on the
//     selected nodes.
//   - ImagePrePullJob pulls OCI images onto the selected nodes.
//   - NodeTaskSlice holds the per-node detail of one job for a bounded set of
//     nodes (the EndpointSlice idea), so that a job over 10,000 nodes never
//     makes one object larger than 1 MiB. The job itself keeps only counts by
//     phase and the first failures.
//
// Job phase: Init → InProgress → Completed | Failure. Node task phase:
// Pending → InProgress → Successful | Failure | Unknown. The manager is the
// only writer of a job's status; hubs write the slices of the nodes they
// serve.
//
// Every field that ends up on a machine (version, URL, image reference,
// digest) is validated here by the schema and again on the agent; none is
// ever passed to a shell.
//
// +kubebuilder:object:generate=true
// +groupName=operations.drover.io
package v1alpha1
