//go:build !linux

package cgroup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
)

// Options configure a Manager.
type Options struct {
	Parent string
	Logger *slog.Logger
}

// Manager creates attempts' cgroups; only on Linux.
type Manager struct{}

// New fails: cgroups are Linux's.
func New(Options) (*Manager, error) {
	return nil, fmt.Errorf("%w: cgroups exist only on Linux", ErrUnavailable)
}

func (m *Manager) Mode() string                          { return "" }
func (m *Manager) Parents() []string                     { return nil }
func (m *Manager) Create(string, Limits) (*Group, error) { return nil, ErrUnavailable }
func Open([]string, *slog.Logger) (*Group, error)        { return nil, ErrUnavailable }
func RunShim([]string) int                               { return 127 }

// Group is one attempt's cgroup; only on Linux.
type Group struct{}

func (g *Group) Dirs() []string                    { return nil }
func (g *Group) Prepare(*exec.Cmd) (func(), error) { return nil, ErrUnavailable }
func (g *Group) Kill() error                       { return ErrUnavailable }
func (g *Group) Pids() ([]int, error)              { return nil, ErrUnavailable }
func (g *Group) OOMKilled() bool                   { return false }
func (g *Group) Stats() Stats                      { return Stats{} }
func (g *Group) Remove() error                     { return ErrUnavailable }

// ErrNoFreezer: no freezer (cgroups are Linux's).
var ErrNoFreezer = errors.New("no cgroup freezer: cgroups exist only on Linux")

func (g *Group) Freeze(context.Context) error { return ErrNoFreezer }
func (g *Group) Thaw(context.Context) error   { return ErrNoFreezer }
func (g *Group) Frozen() bool                 { return false }
func (g *Group) Exists() bool                 { return false }
