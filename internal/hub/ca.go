package hub

import (
	"context"
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

// EnsureCA loads Drover's CA from its Secret, creating it if it does not
// exist. Hubs and the manager may race to create it; the loser reads the
// winner's.
func EnsureCA(ctx context.Context, c client.Client, ns string, now time.Time) (*pki.CA, error) {
	var s corev1.Secret
	key := client.ObjectKey{Namespace: ns, Name: CASecretName}
	err := c.Get(ctx, key, &s)
	if apierrors.IsNotFound(err) {
		ca, genErr := pki.NewCA("drover-ca", now, 10*365*24*time.Hour)
		if genErr != nil {
			return nil, genErr
		}
		s = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: CASecretName, Namespace: ns},
			Type:       corev1.SecretTypeTLS,
			Data:       map[string][]byte{corev1.TLSCertKey: ca.CertPEM, corev1.TLSPrivateKeyKey: ca.KeyPEM},
		}
		err = c.Create(ctx, &s)
		if err == nil {
			return ca, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create CA secret %s/%s: %w", ns, CASecretName, err)
		}
		err = c.Get(ctx, key, &s)
	}
	if err != nil {
		return nil, fmt.Errorf("read CA secret %s/%s: %w", ns, CASecretName, err)
	}
	ca, err := pki.ParseCA(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return nil, fmt.Errorf("CA secret %s/%s: %w", ns, CASecretName, err)
	}
	return ca, nil
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
