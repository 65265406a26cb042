package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/drover-fleet/drover/internal/clock"
)

// ErrNotFound is wrapped by operations on a work uid the store does not hold.
var ErrNotFound = errors.New("not found")

// Options configures Open. The zero value is ready to use.
type Options struct {
	// Logger receives migration and maintenance logs. nil discards them.
	Logger *slog.Logger
	// Clock stamps created/updated times. Default clock.Real(); tests
	// inject a clocktest.Fake.
	Clock clock.Clock
}

// busyTimeout is how long a connection waits for another process's lock
// (e.g. a `drover-agent status` reading the file) before SQLITE_BUSY.
const busyTimeout = 10 * time.Second

// readConns bounds the read pool. Reads are short; a few suffice.
const readConns = 4

// Store is drover-agent's SQLite database. It is safe for concurrent use.
type Store struct {
	// w is the write pool: exactly one connection, transactions BEGIN
	// IMMEDIATE. Every write goes through it, so writes are serialized by
	// database/sql and never race for SQLite's write lock in-process.
	w *sql.DB
	// r is the read pool (query_only); WAL lets it read beside the writer.
	r *sql.DB

	// path, log and clock are read-only after Open.
	path  string
	log   *slog.Logger
	clock clock.Clock
}

// Open opens the agent DB at path, creating the file (mode 0600: it holds
// the node's private key) and its directory (0700) if needed, and migrates it
// to the schema this binary embeds. A database migrated by a newer binary is
// refused with an error wrapping ErrSchemaTooNew. Errors read
// "open agent db <path>: ...".
func Open(ctx context.Context, path string, opts Options) (*Store, error) {
	s, err := open(ctx, path, opts, embedded)
	if err != nil {
		return nil, fmt.Errorf("open agent db %s: %w", path, err)
	}
	return s, nil
}

// open is Open with the migrations as a parameter, for tests.
func open(ctx context.Context, path string, opts Options, migs func() ([]migration, error)) (*Store, error) {
	if path == "" {
		return nil, errors.New("path is empty")
	}
	if strings.ContainsAny(path, "?#") || strings.HasPrefix(path, "file:") || path == ":memory:" {
		return nil, errors.New("path must be a plain file path (no '?', '#', file: URI or :memory:)")
	}
	list, err := migs()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}

	s := &Store{path: path, log: opts.Logger, clock: clock.Or(opts.Clock)}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}

	bt := fmt.Sprint(busyTimeout.Milliseconds())
	s.w, err = sql.Open("sqlite", path+"?_txlock=immediate&_busy_timeout="+bt+
		"&_journal_mode=WAL&_synchronous=FULL&_foreign_keys=1")
	if err != nil {
		return nil, err
	}
	s.w.SetMaxOpenConns(1)
	s.w.SetMaxIdleConns(1)
	s.w.SetConnMaxLifetime(0)
	s.w.SetConnMaxIdleTime(0)
	// Connect the writer first: it switches the file to WAL, which the
	// query_only readers could not do.
	if err := s.w.PingContext(ctx); err != nil {
		s.w.Close()
		return nil, err
	}
	s.r, err = sql.Open("sqlite", path+"?_busy_timeout="+bt+"&_foreign_keys=1&_query_only=1")
	if err != nil {
		s.w.Close()
		return nil, err
	}
	s.r.SetMaxOpenConns(readConns)
	s.r.SetMaxIdleConns(readConns)

	if err := migrate(ctx, s.w, list, s.log, s.clock.Now); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Close closes both connection pools. Committed data is durable whether or
// not Close runs: SQLite replays the WAL on the next Open.
func (s *Store) Close() error {
	return errors.Join(s.r.Close(), s.w.Close())
}

// Path returns the database file's path.
func (s *Store) Path() string { return s.path }

// tx runs fn in one write transaction (BEGIN IMMEDIATE), committing if fn
// returns nil and rolling back otherwise. fn must use only tx: the write pool
// has one connection, which tx holds.
func (s *Store) tx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return errors.Join(err, rollback(tx))
	}
	return tx.Commit()
}

func rollback(tx *sql.Tx) error {
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return nil
}

// nanos and fromNanos store times as unix nanoseconds.
func nanos(t time.Time) int64 { return t.UnixNano() }

func fromNanos(n int64) time.Time { return time.Unix(0, n) }

// blob keeps a nil slice from becoming SQL NULL.
func blob(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
