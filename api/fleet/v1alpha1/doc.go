// Package v1alpha1 contains the fleet.drover.io API: FleetNode, one registered
// machine. Agents never write these objects themselves; hubs do, on the
// agents' behalf, and only on transitions (principle 3 in DESIGN.md).
//
// +kubebuilder:object:generate=true
// +groupName=fleet.drover.io
package v1alpha1
