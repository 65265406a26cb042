package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Action states. A flow's runner owns their meaning; the store only keeps them.
const (
	ActionRunning   = "Running"
	ActionSucceeded = "Succeeded"
	ActionFailed    = "Failed"
)

// Action is one action of a work item's flow, as its runner last recorded it.
type Action struct {
	UID    string
	Action string
	State  string
	Reason string
	// Data is the action's own JSON (nil when empty).
	Data []byte
	// Reported is true once the action's end was handed to the outbox.
	Reported bool
	// UpdatedAt is set by the store on each SetAction and MarkActionReported.
	UpdatedAt time.Time
}

const actionColumns = `uid, action, state, reason, data, reported, updated_at`

// upsertAction inserts an action row, or replaces the row of the same uid
// and action in place.
const upsertAction = `INSERT INTO work_actions (uid, action, state, reason, data, reported, updated_at)
	VALUES (?, ?, ?, ?, ?, ?, ?)
	ON CONFLICT (uid, action) DO UPDATE SET state = excluded.state, reason = excluded.reason,
		data = excluded.data, reported = excluded.reported, updated_at = excluded.updated_at`

// SetAction records a (insert, or replace the row of the same uid and
// action). The row keeps its place in Actions' order.
func (s *Store) SetAction(ctx context.Context, a Action) error {
	if a.UID == "" || a.Action == "" || a.State == "" {
		return fmt.Errorf("set action %q of work %q: uid, action and state are required", a.Action, a.UID)
	}
	_, err := s.w.ExecContext(ctx, upsertAction, a.UID, a.Action, a.State, a.Reason, blob(a.Data), a.Reported, nanos(s.clock.Now()))
	if err != nil {
		return fmt.Errorf("set action %s of work %s to %s: %w", a.Action, a.UID, a.State, err)
	}
	return nil
}

// MarkActionReported records that the end of uid's action was reported. An
// unknown action is an error wrapping ErrNotFound.
func (s *Store) MarkActionReported(ctx context.Context, uid, action string) error {
	res, err := s.w.ExecContext(ctx, `UPDATE work_actions SET reported = 1, updated_at = ? WHERE uid = ? AND action = ?`,
		nanos(s.clock.Now()), uid, action)
	if err == nil {
		var n int64
		if n, err = res.RowsAffected(); err == nil && n == 0 {
			err = ErrNotFound
		}
	}
	if err != nil {
		return fmt.Errorf("mark action %s of work %s reported: %w", action, uid, err)
	}
	return nil
}

// Actions returns uid's actions in the order they first ran.
func (s *Store) Actions(ctx context.Context, uid string) ([]Action, error) {
	return s.queryActions(ctx, `SELECT `+actionColumns+` FROM work_actions WHERE uid = ? ORDER BY rowid`, uid)
}

// ActionsInState returns every work item's actions in state, in the order
// they first ran; e.g. the Running ones after a restart.
func (s *Store) ActionsInState(ctx context.Context, state string) ([]Action, error) {
	return s.queryActions(ctx, `SELECT `+actionColumns+` FROM work_actions WHERE state = ? ORDER BY rowid`, state)
}

// DeleteActions forgets uid's actions. Deleting none is a no-op. DeleteWork
// does not call it: a runner may still need them (a pending upgrade must be
// confirmed or rolled back even if the hub dropped its job).
func (s *Store) DeleteActions(ctx context.Context, uid string) error {
	if _, err := s.w.ExecContext(ctx, `DELETE FROM work_actions WHERE uid = ?`, uid); err != nil {
		return fmt.Errorf("delete actions of work %s: %w", uid, err)
	}
	return nil
}

func (s *Store) queryActions(ctx context.Context, q string, arg string) ([]Action, error) {
	rows, err := s.r.QueryContext(ctx, q, arg)
	if err != nil {
		return nil, fmt.Errorf("list actions: %w", err)
	}
	defer rows.Close()
	var list []Action
	for rows.Next() {
		var (
			a  Action
			at int64
		)
		if err := rows.Scan(&a.UID, &a.Action, &a.State, &a.Reason, &a.Data, &a.Reported, &at); err != nil {
			return nil, fmt.Errorf("list actions: %w", err)
		}
		if len(a.Data) == 0 {
			a.Data = nil
		}
		a.UpdatedAt = fromNanos(at)
		list = append(list, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list actions: %w", err)
	}
	return list, nil
}

// SetWorkSpec replaces the spec of uid, which must not have ended (its phase
// is "", Pending or Running): a hub re-dispatching the same uid with a
// changed spec (a node job's confirmation) updates what its runner reads on
// the next run. It reports whether the spec changed; an unknown uid is an
// error wrapping ErrNotFound.
func (s *Store) SetWorkSpec(ctx context.Context, uid string, spec []byte) (changed bool, err error) {
	err = s.tx(ctx, func(tx *sql.Tx) error {
		var (
			old   []byte
			phase string
		)
		if err := tx.QueryRowContext(ctx, `SELECT spec, phase FROM work WHERE uid = ?`, uid).Scan(&old, &phase); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return ErrNotFound
			}
			return err
		}
		if phase != "" && phase != "Pending" && phase != "Running" {
			return fmt.Errorf("work has ended (%s)", phase)
		}
		if string(old) == string(spec) {
			return nil
		}
		changed = true
		_, err := tx.ExecContext(ctx, `UPDATE work SET spec = ?, updated_at = ? WHERE uid = ?`, blob(spec), nanos(s.clock.Now()), uid)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("set spec of work %s: %w", uid, err)
	}
	return changed, nil
}
