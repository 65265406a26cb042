// Package fleetnodectl reconciles FleetNodes on the manager side. Hubs report
// what they see (Online, Offline after silence); this controller records the
// decisions around that: the Approved condition, the Revoked phase, and
// Offline for nodes whose hub died without another hub taking them over
// (the hub's Lease lapsed for longer than the offline timeout).
package fleetnodectl

//go:generate go run github.com/drover-fleet/drover/cmd/ctrlkit gen -o zz_generated.ctrlkit.go fleetnode.ctrlkit
