// Package manager assembles Drover's controllers into a controller-runtime
// manager: the scheme, the options, and one Setup call per controller. The
// manager is the only writer of decisions (approval conditions, Offline when
// a hub is lost); hubs write what they observe.
package manager
