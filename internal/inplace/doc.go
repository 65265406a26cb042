// Package inplace holds the rules of in-place updates (update.drover.io,
// seed 003), as pure functions: which changes a pool's template makes on a
// node (ChangeSet), which updater owns each change (Claim), what a plan, a
// pool and a node do next (StepPlan, StepPool, StepNode). They do no I/O
// and never read the clock: the controllers in inplacectl load the
// objects, call them with the time, and write what they decide.
//
// The levels are the seed's: a plan runs pool sequences in order
// (InPlaceUpdatePlan controller), a pool picks nodes after a preflight
// check (KubeadmControlPlane / MachineDeployment controllers), a node runs
// its updaters' tasks one after another (Machine controller).
package inplace
