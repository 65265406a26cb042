package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// OutMsg is one agent->hub message waiting for the hub's ack.
type OutMsg struct {
	// ID is the message's envelope id, the key the hub acks.
	ID string
	// Data is the encoded envelope.
	Data []byte
	// CreatedAt is when it was enqueued.
	CreatedAt time.Time
	// Attempts counts MarkAttempt calls, i.e. sends so far.
	Attempts int
}

// Enqueue stores a message to send. Enqueuing an id that is already queued is
// a no-op (the first data is kept), so a crash between building and
// recording a message cannot queue it twice.
func (s *Store) Enqueue(ctx context.Context, id string, data []byte) error {
	if id == "" {
		return errors.New("enqueue: id is empty")
	}
	_, err := s.w.ExecContext(ctx, `INSERT INTO outbox (id, data, created_at) VALUES (?, ?, ?) ON CONFLICT (id) DO NOTHING`,
		id, blob(data), nanos(s.clock.Now()))
	if err != nil {
		return fmt.Errorf("enqueue message %s: %w", id, err)
	}
	return nil
}

// Pending returns up to limit queued messages, oldest (first enqueued) first.
// limit <= 0 returns them all.
func (s *Store) Pending(ctx context.Context, limit int) ([]OutMsg, error) {
	if limit <= 0 {
		limit = -1 // SQLite: no limit
	}
	rows, err := s.r.QueryContext(ctx, `SELECT id, data, created_at, attempts FROM outbox ORDER BY seq LIMIT ?`, limit)
	if err != nil {
		return nil, fmt.Errorf("list pending messages: %w", err)
	}
	defer rows.Close()
	var list []OutMsg
	for rows.Next() {
		var (
			m  OutMsg
			at int64
		)
		if err := rows.Scan(&m.ID, &m.Data, &at, &m.Attempts); err != nil {
			return nil, fmt.Errorf("list pending messages: %w", err)
		}
		m.CreatedAt = fromNanos(at)
		list = append(list, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list pending messages: %w", err)
	}
	return list, nil
}

// MarkAttempt counts one more send of each of ids, in one transaction.
// Unknown ids (acked meanwhile) are skipped.
func (s *Store) MarkAttempt(ctx context.Context, ids ...string) error {
	return s.eachID(ctx, "mark attempt of", `UPDATE outbox SET attempts = attempts + 1 WHERE id = ?`, ids)
}

// Ack removes ids from the outbox, in one transaction. Unknown ids are
// skipped: acks may repeat.
func (s *Store) Ack(ctx context.Context, ids ...string) error {
	return s.eachID(ctx, "ack", `DELETE FROM outbox WHERE id = ?`, ids)
}

func (s *Store) eachID(ctx context.Context, what, stmt string, ids []string) error {
	switch len(ids) {
	case 0:
		return nil
	case 1:
		if _, err := s.w.ExecContext(ctx, stmt, ids[0]); err != nil {
			return fmt.Errorf("%s message %s: %w", what, ids[0], err)
		}
		return nil
	}
	err := s.tx(ctx, func(tx *sql.Tx) error {
		st, err := tx.PrepareContext(ctx, stmt)
		if err != nil {
			return err
		}
		defer st.Close()
		for _, id := range ids {
			if _, err := st.ExecContext(ctx, id); err != nil {
				return fmt.Errorf("message %s: %w", id, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s %d messages: %w", what, len(ids), err)
	}
	return nil
}

// Report records one agent->hub state report in one transaction: when
// phase is not empty, uid's phase and reason change (an unknown uid is an
// error wrapping ErrNotFound); the agent revision moves on; and the message
// build makes with the new revision is queued. One commit, one disk sync,
// where separate calls cost three: it is what each item's start and end
// cost the agent.
func (s *Store) Report(ctx context.Context, uid, phase, reason string, build func(rev uint64) (id string, data []byte, err error)) (uint64, error) {
	return s.report(ctx, uid, phase, reason, nil, build)
}

// ReportAction is Report of a running item (its phase unchanged) that also
// records act (as SetAction) in the same transaction: a runner's record of
// what it did and its report of it cost one disk sync.
func (s *Store) ReportAction(ctx context.Context, act Action, build func(rev uint64) (id string, data []byte, err error)) (uint64, error) {
	if act.UID == "" || act.Action == "" || act.State == "" {
		return 0, fmt.Errorf("report action %q of work %q: uid, action and state are required", act.Action, act.UID)
	}
	return s.report(ctx, act.UID, "", "", &act, build)
}

func (s *Store) report(ctx context.Context, uid, phase, reason string, act *Action, build func(rev uint64) (id string, data []byte, err error)) (uint64, error) {
	var rev uint64
	err := s.tx(ctx, func(tx *sql.Tx) error {
		now := nanos(s.clock.Now())
		if act != nil {
			if _, err := tx.ExecContext(ctx, upsertAction, act.UID, act.Action, act.State, act.Reason, blob(act.Data), act.Reported, now); err != nil {
				return err
			}
		}
		if phase != "" {
			res, err := tx.ExecContext(ctx, `UPDATE work SET phase = ?, reason = ?, updated_at = ? WHERE uid = ?`, phase, reason, now, uid)
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil {
				return err
			} else if n == 0 {
				return ErrNotFound
			}
		}
		var v int64
		if err := tx.QueryRowContext(ctx, `UPDATE revision SET value = value + 1 WHERE name = ? RETURNING value`, agentRev).Scan(&v); err != nil {
			return err
		}
		rev = uint64(v)
		id, data, err := build(rev)
		if err != nil {
			return err
		}
		if id == "" {
			return errors.New("message id is empty")
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO outbox (id, data, created_at) VALUES (?, ?, ?) ON CONFLICT (id) DO NOTHING`, id, blob(data), now)
		return err
	})
	if err != nil {
		if uid != "" {
			return 0, fmt.Errorf("report work %s (phase %q): %w", uid, phase, err)
		}
		return 0, fmt.Errorf("report node state: %w", err)
	}
	return rev, nil
}
