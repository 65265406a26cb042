// Package apptoken mints and checks application tokens: the bearer
// credentials an Application's customers present to the session API
// (`drover app token create APP --ttl 24h`).
//
// A token is stored only hashed, as an annotation of its Application
// (tokens.serverless.drover.io/<id>: sha256=<hex>,expires=<RFC 3339>), so:
// whoever may edit the Application may mint and revoke its tokens and no
// one else, the manager needs no read access to Secrets, and deleting the
// annotation (`drover app token revoke APP ID`) revokes the token at once.
// The token itself names its Application and id, so checking it is one
// cache read and one constant-time compare.
//
//	drvapp.<base64url(namespace/application)>.<id>.<secret>
package apptoken

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
)

// AnnotationPrefix prefixes the annotation of each token of an Application.
const AnnotationPrefix = "tokens.serverless.drover.io/"

const tokenPrefix = "drvapp."

// MaxTTL bounds a token's life.
const MaxTTL = 366 * 24 * time.Hour

// Token is a minted token: Value is shown once; Annotation is what to store.
type Token struct {
	ID      string
	Value   string
	Expires time.Time
}

// AnnotationKey is the annotation key of token id.
func AnnotationKey(id string) string { return AnnotationPrefix + id }

// AnnotationValue is what the Application stores of t.
func (t Token) AnnotationValue() string {
	sum := sha256.Sum256([]byte(t.Value))
	return "sha256=" + hex.EncodeToString(sum[:]) + ",expires=" + t.Expires.UTC().Format(time.RFC3339)
}

// New mints a token of namespace/app living ttl from now.
func New(namespace, app string, ttl time.Duration, now time.Time) (Token, error) {
	if ttl <= 0 || ttl > MaxTTL {
		return Token{}, fmt.Errorf("--ttl %s: want more than 0 and at most %s", ttl, MaxTTL)
	}
	if namespace == "" || app == "" || strings.Contains(namespace, "/") {
		return Token{}, fmt.Errorf("token for %q/%q: want a namespace and an application name", namespace, app)
	}
	id := make([]byte, 5)
	secret := make([]byte, 32)
	if _, err := rand.Read(id); err != nil {
		return Token{}, err
	}
	if _, err := rand.Read(secret); err != nil {
		return Token{}, err
	}
	t := Token{ID: hex.EncodeToString(id), Expires: now.Add(ttl).Truncate(time.Second)}
	t.Value = tokenPrefix + base64.RawURLEncoding.EncodeToString([]byte(namespace+"/"+app)) + "." + t.ID + "." +
		base64.RawURLEncoding.EncodeToString(secret)
	return t, nil
}

// ErrInvalid is the error of a token that is malformed, unknown, revoked or
// expired; the caller says no more than that to the presenter.
var ErrInvalid = errors.New("the application token is not valid (malformed, revoked or expired)")

// Parse splits a token into the Application it names and its id.
func Parse(value string) (namespace, app, id string, err error) {
	rest, ok := strings.CutPrefix(value, tokenPrefix)
	if !ok {
		return "", "", "", ErrInvalid
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 || len(parts[1]) != 10 {
		return "", "", "", ErrInvalid
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil {
		return "", "", "", ErrInvalid
	}
	namespace, app, ok = strings.Cut(string(b), "/")
	if !ok || namespace == "" || app == "" {
		return "", "", "", ErrInvalid
	}
	return namespace, app, parts[1], nil
}

// Check verifies value against the annotations of the Application it names
// (from Parse), at now.
func Check(value string, annotations map[string]string, now time.Time) error {
	_, _, id, err := Parse(value)
	if err != nil {
		return err
	}
	stored, ok := annotations[AnnotationKey(id)]
	if !ok {
		return ErrInvalid
	}
	hash, expires, err := parseValue(stored)
	if err != nil {
		return ErrInvalid
	}
	sum := sha256.Sum256([]byte(value))
	if subtle.ConstantTimeCompare([]byte(hex.EncodeToString(sum[:])), []byte(hash)) != 1 {
		return ErrInvalid
	}
	if !now.Before(expires) {
		return ErrInvalid
	}
	return nil
}

func parseValue(v string) (hash string, expires time.Time, err error) {
	for _, kv := range strings.Split(v, ",") {
		k, val, _ := strings.Cut(kv, "=")
		switch k {
		case "sha256":
			hash = val
		case "expires":
			expires, err = time.Parse(time.RFC3339, val)
		}
	}
	if len(hash) != 64 || expires.IsZero() || err != nil {
		return "", time.Time{}, fmt.Errorf("token annotation %q: want sha256=<hex>,expires=<RFC 3339>", v)
	}
	return hash, expires, nil
}

// Info is a stored token, for listing.
type Info struct {
	ID      string
	Expires time.Time
}

// List lists the tokens of an Application's annotations, by id.
func List(annotations map[string]string) []Info {
	var out []Info
	for k, v := range annotations {
		id, ok := strings.CutPrefix(k, AnnotationPrefix)
		if !ok {
			continue
		}
		_, exp, err := parseValue(v)
		if err != nil {
			continue
		}
		out = append(out, Info{ID: id, Expires: exp})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
