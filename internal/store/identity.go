package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// Identity is what the node proves itself with, kept from registration.
type Identity struct {
	// Node is the node's name, the subject of its certificate.
	Node string
	// KeyPEM is the node's private key, CertPEM its client certificate
	// signed by Drover's CA, CAPEM the CA certificate that signs hubs.
	KeyPEM, CertPEM, CAPEM []byte
	// Hub is the last hub address the agent used.
	Hub string
}

// Identity returns the saved identity, or false when none was saved yet.
func (s *Store) Identity(ctx context.Context) (Identity, bool, error) {
	var id Identity
	err := s.r.QueryRowContext(ctx, `SELECT node, key_pem, cert_pem, ca_pem, hub FROM identity WHERE id = 1`).
		Scan(&id.Node, &id.KeyPEM, &id.CertPEM, &id.CAPEM, &id.Hub)
	if errors.Is(err, sql.ErrNoRows) {
		return Identity{}, false, nil
	}
	if err != nil {
		return Identity{}, false, fmt.Errorf("read identity: %w", err)
	}
	return id, true, nil
}

// SaveIdentity replaces the saved identity.
func (s *Store) SaveIdentity(ctx context.Context, id Identity) error {
	if id.Node == "" {
		return errors.New("save identity: node is empty")
	}
	_, err := s.w.ExecContext(ctx, `INSERT INTO identity (id, node, key_pem, cert_pem, ca_pem, hub, updated_at)
		VALUES (1, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET node = excluded.node, key_pem = excluded.key_pem,
			cert_pem = excluded.cert_pem, ca_pem = excluded.ca_pem, hub = excluded.hub,
			updated_at = excluded.updated_at`,
		id.Node, blob(id.KeyPEM), blob(id.CertPEM), blob(id.CAPEM), id.Hub, nanos(s.clock.Now()))
	if err != nil {
		return fmt.Errorf("save identity of node %s: %w", id.Node, err)
	}
	return nil
}
