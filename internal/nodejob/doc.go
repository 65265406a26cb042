// Package nodejob holds the rules of node jobs (NodeUpgradeJob,
// ImagePrePullJob) that the manager, the hubs and the agent share, without
// I/O: the job phase computed from counts (KubeEdge's
// CalculatePhaseWithCounts), the action flows, and how a job's per-node
// detail is cut into NodeTaskSlices.
//
// It must not import k8s.io/client-go or controller-runtime: the rules are
// stepped in table tests with plain values.
package nodejob
