package store

import (
	"context"
	"database/sql"
	"fmt"
)

// Names of the rows in the revision table.
const (
	hubRev   = "hub"
	agentRev = "agent"
)

// HubRevision returns the last hub->agent revision the agent applied (0 for
// a new node).
func (s *Store) HubRevision(ctx context.Context) (uint64, error) {
	return s.revision(ctx, hubRev)
}

// SetHubRevision records rev as the last applied hub->agent revision. It does
// not compare: ordering is the protocol Tracker's job, and a hub may move the
// node back (e.g. a Snapshot after the hub lost its state).
func (s *Store) SetHubRevision(ctx context.Context, rev uint64) error {
	if err := setRevision(ctx, s.w, hubRev, rev); err != nil {
		return fmt.Errorf("set hub revision %d: %w", rev, err)
	}
	return nil
}

// AgentRevision returns the revision of the agent's last state report.
func (s *Store) AgentRevision(ctx context.Context) (uint64, error) {
	return s.revision(ctx, agentRev)
}

// NextAgentRevision increments the agent revision durably and returns the new
// value; a report built with it may be sent once this returns.
func (s *Store) NextAgentRevision(ctx context.Context) (uint64, error) {
	var v int64
	err := s.w.QueryRowContext(ctx, `UPDATE revision SET value = value + 1 WHERE name = ? RETURNING value`, agentRev).Scan(&v)
	if err != nil {
		return 0, fmt.Errorf("next agent revision: %w", err)
	}
	return uint64(v), nil
}

func (s *Store) revision(ctx context.Context, name string) (uint64, error) {
	var v int64
	if err := s.r.QueryRowContext(ctx, `SELECT value FROM revision WHERE name = ?`, name).Scan(&v); err != nil {
		return 0, fmt.Errorf("read %s revision: %w", name, err)
	}
	return uint64(v), nil
}

// execer is what both *sql.DB and *sql.Tx offer.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// setRevision stores rev. SQLite integers are signed, so a uint64 is kept as
// its int64 bit pattern and converted back on read.
func setRevision(ctx context.Context, db execer, name string, rev uint64) error {
	_, err := db.ExecContext(ctx, `UPDATE revision SET value = ? WHERE name = ?`, int64(rev), name)
	return err
}
