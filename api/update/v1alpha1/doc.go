// Package v1alpha1 contains the update.drover.io API: in-place updates of
// fleet nodes after Cluster API's in-place update design (seed 003).
//
//   - NodePool groups FleetNodes by selector and says how they are updated
//     (one at a time after a preflight check, or up to maxUnavailable).
//   - InPlaceUpdatePlan runs pools in sequence and, on each node, updaters
//     one after another; each updater's work is an UpdaterUpdateTask, any
//     CRD that keeps the contract in docs/contracts/updater-update-task.md.
//   - NodeHealthCheck marks nodes unhealthy, aware of running updates.
//
// +kubebuilder:object:generate=true
// +groupName=update.drover.io
package v1alpha1
