package bootstrap

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// SecretType marks Drover bootstrap token Secrets.
const SecretType corev1.SecretType = "drover.io/bootstrap-token"

// Keys of a token Secret's data.
const (
	KeyID          = "token-id"
	KeySecret      = "token-secret"
	KeyExpiration  = "expiration" // RFC 3339; absent = never
	KeyAutoApprove = "auto-approve"
	KeyDescription = "description"
)

var tokenRE = regexp.MustCompile(`^([a-z0-9]{6})\.([a-z0-9]{16})$`)

// Errors a registration can fail with. ErrMalformed is safe to show to the
// agent; the others are reasons for the operator's log, and an agent is
// shown ErrNotValid for each of them (see Verifier.Verify).
var (
	ErrMalformed = errors.New("bootstrap token is malformed: want <6 chars>.<16 chars> of [a-z0-9]")
	ErrUnknown   = errors.New("bootstrap token is unknown")
	ErrInvalid   = errors.New("bootstrap token secret does not match")
	ErrExpired   = errors.New("bootstrap token has expired")
)

// Token is a parsed bootstrap token.
type Token struct {
	ID          string
	Secret      string
	Expires     *time.Time
	AutoApprove bool
	Description string
}

// String is the token as an agent is given it.
func (t Token) String() string { return t.ID + "." + t.Secret }

// SecretName is the name of the Secret holding a token id.
func SecretName(id string) string { return "bootstrap-token-" + id }

// Generate makes a new random token.
func Generate() (Token, error) {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	// Bytes ≥ 252 are redrawn: 252 is the largest multiple of 36 below 256,
	// so every character stays equally likely.
	out := make([]byte, 0, 22)
	buf := make([]byte, 32)
	for len(out) < cap(out) {
		if _, err := rand.Read(buf); err != nil {
			return Token{}, fmt.Errorf("generate bootstrap token: %w", err)
		}
		for _, c := range buf {
			if c < 252 && len(out) < cap(out) {
				out = append(out, alphabet[int(c)%len(alphabet)])
			}
		}
	}
	return Token{ID: string(out[:6]), Secret: string(out[6:])}, nil
}

// Parse splits "id.secret".
func Parse(s string) (id, secret string, err error) {
	m := tokenRE.FindStringSubmatch(s)
	if m == nil {
		return "", "", ErrMalformed
	}
	return m[1], m[2], nil
}

// Create stores tok as a Secret in namespace ns. A zero ttl means it never expires.
func Create(ctx context.Context, c client.Client, ns string, tok Token) error {
	data := map[string][]byte{
		KeyID:     []byte(tok.ID),
		KeySecret: []byte(tok.Secret),
	}
	if tok.Expires != nil {
		data[KeyExpiration] = []byte(tok.Expires.UTC().Format(time.RFC3339))
	}
	if tok.AutoApprove {
		data[KeyAutoApprove] = []byte("true")
	}
	if tok.Description != "" {
		data[KeyDescription] = []byte(tok.Description)
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: SecretName(tok.ID), Namespace: ns},
		Type:       SecretType,
		Data:       data,
	}
	if err := c.Create(ctx, s); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create bootstrap token %s: a token with that id exists", tok.ID)
		}
		return fmt.Errorf("create bootstrap token %s in namespace %s: %w", tok.ID, ns, err)
	}
	return nil
}

// List returns the tokens in namespace ns, oldest first, without their secrets.
func List(ctx context.Context, r client.Reader, ns string) ([]Token, error) {
	var l corev1.SecretList
	if err := r.List(ctx, &l, client.InNamespace(ns)); err != nil {
		return nil, fmt.Errorf("list bootstrap tokens in namespace %s: %w", ns, err)
	}
	sort.Slice(l.Items, func(i, j int) bool {
		return l.Items[i].CreationTimestamp.Before(&l.Items[j].CreationTimestamp)
	})
	var out []Token
	for _, s := range l.Items {
		id := string(s.Data[KeyID])
		if s.Type != SecretType || s.Name != SecretName(id) {
			continue
		}
		tok := Token{ID: id, AutoApprove: string(s.Data[KeyAutoApprove]) == "true", Description: string(s.Data[KeyDescription])}
		if exp, err := time.Parse(time.RFC3339, string(s.Data[KeyExpiration])); err == nil {
			tok.Expires = &exp
		}
		out = append(out, tok)
	}
	return out, nil
}

// Delete removes the token with id from namespace ns: agents that have not
// registered yet can no longer use it; registered ones keep their certificates.
func Delete(ctx context.Context, c client.Client, ns, id string) error {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: SecretName(id)}}
	if err := c.Delete(ctx, s); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("delete bootstrap token %s: %w", id, ErrUnknown)
		}
		return fmt.Errorf("delete bootstrap token %s: %w", id, err)
	}
	return nil
}
