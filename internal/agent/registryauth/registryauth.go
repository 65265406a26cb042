// Package registryauth picks a node job's registry credentials for an image
// and turns a registry's refusals into reasons an operator can act on. The
// image pre-pull and the OCI upgrade artifact share it.
package registryauth

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/drover-fleet/drover/internal/nodejob/nodejobwire"
)

// For returns the authenticator for ref from creds (keyed by registry host,
// as the hub sends them), and the user name it logs in as ("" when
// anonymous).
func For(creds map[string]nodejobwire.Credential, ref name.Reference) (authn.Authenticator, string) {
	c, ok := creds[ref.Context().RegistryStr()]
	if !ok {
		return authn.Anonymous, ""
	}
	return authn.FromConfig(authn.AuthConfig{Username: c.Username, Password: c.Password}), c.Username
}

// AuthError is a registry's refusal of the credentials (or their absence).
type AuthError struct{ msg string }

func (e *AuthError) Error() string { return e.msg }

// NotFoundError is a registry saying the image does not exist.
type NotFoundError struct{ err error }

func (e *NotFoundError) Error() string { return "not found: " + e.err.Error() }
func (e *NotFoundError) Unwrap() error { return e.err }

// Explain rewrites a registry's 401/403 (naming the registry and the user,
// or saying the job gave no credentials for it) and marks a 404; other
// errors pass through.
func Explain(err error, registry, user string) error {
	var te *transport.Error
	if !errors.As(err, &te) {
		return err
	}
	switch te.StatusCode {
	case http.StatusUnauthorized, http.StatusForbidden:
		status := fmt.Sprintf("%d %s", te.StatusCode, http.StatusText(te.StatusCode))
		if user == "" {
			return &AuthError{fmt.Sprintf("registry %s requires credentials (%s); the job gives none for it", registry, status)}
		}
		return &AuthError{fmt.Sprintf("registry %s refused the credentials of user %q (%s)", registry, user, status)}
	case http.StatusNotFound:
		return &NotFoundError{err}
	}
	return err
}

// Permanent reports whether a retry cannot fix err (bad or missing
// credentials, no such image).
func Permanent(err error) bool {
	var (
		ae *AuthError
		nf *NotFoundError
	)
	return errors.As(err, &ae) || errors.As(err, &nf)
}
