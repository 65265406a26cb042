package store

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"regexp"
	"strconv"
	"time"
)

// ErrSchemaTooNew is wrapped by Open when the database was migrated by a
// newer drover-agent than this one. Downgrading the agent over its DB is not
// supported: upgrade the binary again, or move the DB aside to start fresh.
var ErrSchemaTooNew = errors.New("agent db schema is newer than this binary")

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrationName is the shape of a migration file: NNNN_name.sql.
var migrationName = regexp.MustCompile(`^([0-9]{4})_([a-z0-9_]+)\.sql$`)

// migration is one schema step. Version numbers start at 1 and have no holes.
type migration struct {
	version int
	name    string
	sql     string
}

// embedded returns the migrations compiled into this binary.
func embedded() ([]migration, error) {
	return loadMigrations(migrationFiles, "migrations")
}

// loadMigrations reads dir's NNNN_name.sql files in version order and checks
// that the versions run 1, 2, 3, ... without holes or repeats.
func loadMigrations(fsys fs.FS, dir string) ([]migration, error) {
	entries, err := fs.ReadDir(fsys, dir) // sorted by name, hence by version
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var list []migration
	for _, e := range entries {
		m := migrationName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("migration file %s: want NNNN_name.sql", e.Name())
		}
		v, _ := strconv.Atoi(m[1])
		if want := len(list) + 1; v != want {
			return nil, fmt.Errorf("migration file %s: version %d, want %d", e.Name(), v, want)
		}
		b, err := fs.ReadFile(fsys, dir+"/"+e.Name())
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", e.Name(), err)
		}
		list = append(list, migration{version: v, name: m[2], sql: string(b)})
	}
	return list, nil
}

// migrate brings db up to the last of list. Each migration runs in its own
// write transaction together with its schema_migrations row, and the current
// version is re-read inside that transaction, so two processes opening the
// same file cannot apply a step twice.
func migrate(ctx context.Context, db *sql.DB, list []migration, log *slog.Logger, now func() time.Time) error {
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER PRIMARY KEY,
		name       TEXT    NOT NULL,
		applied_at INTEGER NOT NULL
	)`); err != nil {
		return fmt.Errorf("create schema_migrations: %w", err)
	}
	latest := len(list)
	cur, err := schemaVersion(ctx, db)
	if err != nil {
		return err
	}
	if cur > latest {
		return fmt.Errorf("schema version %d, this binary knows up to %d: %w", cur, latest, ErrSchemaTooNew)
	}
	for _, m := range list[cur:] {
		if err := apply(ctx, db, m, latest, now); err != nil {
			return err
		}
		log.Info("applied agent db migration", "version", m.version, "name", m.name)
	}
	return nil
}

func apply(ctx context.Context, db *sql.DB, m migration, latest int, now func() time.Time) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migration %04d_%s: %w", m.version, m.name, err)
	}
	err = func() error {
		var cur int
		if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&cur); err != nil {
			return err
		}
		if cur > latest {
			return fmt.Errorf("schema version %d, this binary knows up to %d: %w", cur, latest, ErrSchemaTooNew)
		}
		if cur >= m.version {
			return nil // another process applied it first
		}
		if _, err := tx.ExecContext(ctx, m.sql); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)`,
			m.version, m.name, nanos(now()))
		return err
	}()
	if err != nil {
		return fmt.Errorf("migration %04d_%s: %w", m.version, m.name, errors.Join(err, rollback(tx)))
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migration %04d_%s: commit: %w", m.version, m.name, err)
	}
	return nil
}

func schemaVersion(ctx context.Context, db *sql.DB) (int, error) {
	var v int
	if err := db.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&v); err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	return v, nil
}

// SchemaVersion returns the database's schema version (its last applied
// migration).
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	return schemaVersion(ctx, s.r)
}
