// Package inplacectl holds the in-place update controllers, written with
// ctrlkit: InPlaceUpdatePlan (pool sequences), NodePool (preflight and
// picks), the FleetNode update controller (updater tasks) and
// NodeHealthCheck. Each loads its objects, asks the pure rules of
// internal/inplace what to do, and writes it.
package inplacectl

//go:generate go run github.com/drover-fleet/drover/cmd/ctrlkit gen -o zz_generated.plan.ctrlkit.go plan.ctrlkit
//go:generate go run github.com/drover-fleet/drover/cmd/ctrlkit gen -o zz_generated.pool.ctrlkit.go pool.ctrlkit
//go:generate go run github.com/drover-fleet/drover/cmd/ctrlkit gen -o zz_generated.node.ctrlkit.go node.ctrlkit
//go:generate go run github.com/drover-fleet/drover/cmd/ctrlkit gen -o zz_generated.nhc.ctrlkit.go nhc.ctrlkit
//go:generate go run github.com/drover-fleet/drover/cmd/ctrlkit gen -o zz_generated.topology.ctrlkit.go topology.ctrlkit
//go:generate go run github.com/drover-fleet/drover/cmd/ctrlkit gen -o zz_generated.request.ctrlkit.go request.ctrlkit
