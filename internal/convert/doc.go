// Package convert turns KubeEdge node job manifests (NodeUpgradeJob and
// ImagePrePullJob of operations.kubeedge.io/v1alpha1 and v1alpha2) into
// Drover's (operations.drover.io/v1alpha1), for `drover convert`.
//
// Every KubeEdge field either maps to a Drover field, is dropped with a
// warning when nothing is lost by dropping it (server-set metadata, status),
// or is an error naming the document and the field. A field that changed
// what a job would do must never disappear silently: a user applying the
// output would run a different job than the one they wrote. The README's
// node jobs section has the table; keep it in step with fields.go.
//
// The package does no I/O beyond reading the manifests it is given, and
// needs no cluster: the output is validated by the CRDs when applied (and
// by a test that dry-run creates it against them).
package convert
