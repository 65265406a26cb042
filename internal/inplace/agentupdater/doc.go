// Package agentupdater is Drover's built-in agent-version updater: an
// UpdaterUpdateTask implementation (docs/contracts/updater-update-task.md)
// whose tasks, AgentVersionUpdateTasks, are carried out by a one-node
// NodeUpgradeJob each, so an in-place update plan upgrades drover-agent
// through the node-job upgrade path (sha256 check, swap, restart, health
// check, rollback) rather than a second implementation of it.
package agentupdater

//go:generate go run github.com/drover-fleet/drover/cmd/ctrlkit gen -o zz_generated.ctrlkit.go agentupdater.ctrlkit
