// Package bootstrap manages bootstrap tokens: shared secrets that let a new
// agent register and ask for its own client certificate. The format is
// kubeadm's ("abcdef.0123456789abcdef"), so it reads familiar, but tokens live
// in Drover's namespace as Secrets of type drover.io/bootstrap-token and are
// only ever used against Drover's hubs.
//
// A token may carry an auto-approve policy: nodes that register with it are
// approved at once. Without it, an operator runs `drover approve NODE`.
package bootstrap
