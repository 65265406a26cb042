// Package nodejobctl is the manager's controller for node jobs
// (NodeUpgradeJob, ImagePrePullJob). It is the only writer of a job's
// status (seed 000's data flow: hubs may be many, the manager is one):
//
//   - Init: it resolves the target nodes, runs the first admission over
//     them (internal/nodejob.Step), writes their tasks (InProgress for the
//     admitted nodes, Pending or Failure for the others) into
//     NodeTaskSlices owned by the job, and sets the phase to Init; the
//     hubs dispatch the admitted nodes as soon as the slices appear;
//   - then, on every change of the job or its slices, it runs
//     internal/nodejob.Step (timeouts → Unknown, abort, admission within
//     concurrency), writes the changed entries back with a compare-and-set
//     merge, recounts, and sets the phase with internal/nodejob.Phase.
//
// Completed and Failure are final. Hubs dispatch the admitted nodes they
// serve and write the agents' reports into the slices.
package nodejobctl

//go:generate go run github.com/drover-fleet/drover/cmd/ctrlkit gen -o zz_generated.ctrlkit.go nodejob.ctrlkit
