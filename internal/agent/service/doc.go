// Package service installs drover-agent as a systemd service: the binary,
// its state directory, an environment file for the bootstrap token and a
// unit that restarts the agent when it fails (a crashed self-upgrade comes
// back) but leaves its task processes alone when it stops.
//
// It only writes files and, when systemctl is present, asks systemd to load
// and start the unit. It does not manage other init systems, and it never
// runs a shell: the unit's ExecStart is the agent's argv, quoted for systemd.
package service
