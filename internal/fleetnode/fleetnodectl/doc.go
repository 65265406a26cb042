// Package fleetnodectl reconciles FleetNodes on the manager side. The
// manager owns what follows a node's spec: the Approved condition
// (AwaitingApproval, AutoApproved when the hub recorded an auto-approving
// token at registration, ApprovedByOperator, Revoked), the phase Pending of
// a node just registered, and the phase Revoked. It never writes Ready or
// the Online and Offline phases: those are the hubs' (see
// internal/fleetnode for who owns what).
package fleetnodectl

//go:generate go run github.com/drover-fleet/drover/cmd/ctrlkit gen -o zz_generated.ctrlkit.go fleetnode.ctrlkit
