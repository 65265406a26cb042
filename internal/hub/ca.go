package hub

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/drover-fleet/drover/internal/pki"
)

// CASecretName is the Secret that holds Drover's CA in the Drover namespace.
const CASecretName = "drover-ca"

// EnsureCA loads Drover's current CA from its Secret, creating it if it
// does not exist. Hubs and the manager may race to create it; the loser
// reads the winner's.
func EnsureCA(ctx context.Context, c client.Client, ns string, now time.Time) (*pki.CA, error) {
	t, err := EnsureTrust(ctx, c, ns, now)
	if err != nil {
		return nil, err
	}
	return t.Current, nil
}

// EnsureTrust is EnsureCA, with the previous CAs a rotation left trusted.
func EnsureTrust(ctx context.Context, c client.Client, ns string, now time.Time) (*Trust, error) {
	var s corev1.Secret
	key := client.ObjectKey{Namespace: ns, Name: CASecretName}
	err := c.Get(ctx, key, &s)
	if apierrors.IsNotFound(err) {
		ca, genErr := pki.NewCA("drover-ca", now, caValidity)
		if genErr != nil {
			return nil, genErr
		}
		t := &Trust{Current: ca}
		s = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: CASecretName, Namespace: ns},
			Type:       corev1.SecretTypeTLS,
			Data:       t.data(),
		}
		err = c.Create(ctx, &s)
		if err == nil {
			return t, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create CA secret %s/%s: %w", ns, CASecretName, err)
		}
		err = c.Get(ctx, key, &s)
	}
	if err != nil {
		return nil, fmt.Errorf("read CA secret %s/%s: %w", ns, CASecretName, err)
	}
	return ParseTrust(&s)
}

// caValidity is how long a CA Drover makes is valid.
const caValidity = 10 * 365 * 24 * time.Hour

// RotateCA makes a new CA current in ns's CA Secret. The CA it replaces,
// and those still trusted before, stay trusted (Trust.Previous): node
// certificates they signed keep working until their agents renew onto the
// new CA, within one certificate lifetime. The replaced CA cross-signs the
// new one, so that agents that trust only the old CA yet accept hubs'
// new certificates. Hubs pick the change up within caRefresh.
func RotateCA(ctx context.Context, c client.Client, ns string, now time.Time) (*Trust, error) {
	var out *Trust
	err := updateTrust(ctx, c, ns, func(t *Trust) error {
		// A name of its own: chains are built by issuer name, and two CAs
		// of one name would make every peer try both.
		ca, err := pki.NewCA("drover-ca-"+now.UTC().Format("20060102-150405"), now, caValidity)
		if err != nil {
			return err
		}
		cross, err := t.Current.CrossSign(ca.Cert, now)
		if err != nil {
			return err
		}
		// Older cross certificates stay: they chain the replaced CA to
		// the ones before it, for agents two rotations behind.
		out = &Trust{Current: ca, Previous: append([]*x509.Certificate{t.Current.Cert}, t.Previous...),
			Cross: append([][]byte{cross}, t.Cross...), Rotated: now}
		*t = *out
		return nil
	})
	return out, err
}

// FinishCARotation stops trusting the CAs that a rotation replaced: the
// node certificates they signed are refused from then on. It refuses
// before one certificate lifetime (validity) has passed since the
// rotation, when those may still be in use, unless force.
func FinishCARotation(ctx context.Context, c client.Client, ns string, now time.Time, validity time.Duration, force bool) (dropped []*x509.Certificate, err error) {
	err = updateTrust(ctx, c, ns, func(t *Trust) error {
		if len(t.Previous) == 0 {
			return errors.New("no rotation to finish: Drover trusts only its current CA")
		}
		if safe := t.Rotated.Add(validity); now.Before(safe) && !force {
			return fmt.Errorf("the CA was rotated at %s: certificates of the previous CA may be valid until %s "+
				"(one certificate lifetime, %v); agents renew onto the new CA before then. Finish after that, "+
				"or pass --force to refuse them now (their agents must register again with a bootstrap token)",
				t.Rotated.UTC().Format(time.RFC3339), safe.UTC().Format(time.RFC3339), validity)
		}
		dropped = t.Previous
		t.Previous, t.Cross = nil, nil
		return nil
	})
	return dropped, err
}

// updateTrust changes ns's CA Secret with change, under its resource
// version: of two operators rotating at once, one is told to try again.
func updateTrust(ctx context.Context, c client.Client, ns string, change func(*Trust) error) error {
	var s corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: CASecretName}, &s); err != nil {
		return fmt.Errorf("read CA secret %s/%s (has a hub run yet?): %w", ns, CASecretName, err)
	}
	t, err := ParseTrust(&s)
	if err != nil {
		return err
	}
	if err := change(t); err != nil {
		return err
	}
	s.Data = t.data()
	if err := c.Update(ctx, &s); err != nil {
		return fmt.Errorf("write CA secret %s/%s: %w", ns, CASecretName, err)
	}
	// Hubs read the bundle, not the Secret: they follow at once rather
	// than when the manager's signer next reads the Secret.
	return WriteBundle(ctx, c, c, ns, t.Bundle())
}

// EnsureNamespace creates ns if it does not exist. c reads uncached: a
// cached Get of a Namespace would watch every namespace.
func EnsureNamespace(ctx context.Context, c client.Client, ns string) error {
	return ensureNamespace(ctx, c, c, ns)
}

// ensureNamespace reads ns first and creates it only when it is missing,
// so that a hub needs no right to create namespaces (config/rbac) where
// Drover's namespace is made at install. A reader that may not get it
// tries to create it; refused that too, it goes on: it cannot tell, and
// a missing namespace fails the next step (the CA Secret) with a clear
// "namespaces ... not found".
func ensureNamespace(ctx context.Context, r client.Reader, w client.Writer, ns string) error {
	err := r.Get(ctx, client.ObjectKey{Name: ns}, &corev1.Namespace{})
	switch {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err), apierrors.IsForbidden(err):
	default:
		return fmt.Errorf("read namespace %s: %w", ns, err)
	}
	readForbidden := apierrors.IsForbidden(err)
	err = w.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	switch {
	case err == nil, apierrors.IsAlreadyExists(err):
		return nil
	case apierrors.IsForbidden(err) && readForbidden:
		return nil
	case apierrors.IsForbidden(err):
		return fmt.Errorf("namespace %s does not exist and this account may not create it; "+
			"create it (config/rbac/00_namespace.yaml): %w", ns, err)
	default:
		return fmt.Errorf("create namespace %s: %w", ns, err)
	}
}
