package store

import (
	"context"
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
		id, blob(data), nanos(s.now()))
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

// MarkAttempt counts one more send of id. An unknown id (acked meanwhile) is
// a no-op.
func (s *Store) MarkAttempt(ctx context.Context, id string) error {
	if _, err := s.w.ExecContext(ctx, `UPDATE outbox SET attempts = attempts + 1 WHERE id = ?`, id); err != nil {
		return fmt.Errorf("mark attempt of message %s: %w", id, err)
	}
	return nil
}

// Ack removes id from the outbox. An unknown id is a no-op: acks may repeat.
func (s *Store) Ack(ctx context.Context, id string) error {
	if _, err := s.w.ExecContext(ctx, `DELETE FROM outbox WHERE id = ?`, id); err != nil {
		return fmt.Errorf("ack message %s: %w", id, err)
	}
	return nil
}
