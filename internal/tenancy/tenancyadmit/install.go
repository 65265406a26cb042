package tenancyadmit

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"slices"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	batchv1 "github.com/drover-fleet/drover/api/batch/v1alpha1"
	"github.com/drover-fleet/drover/internal/pki"
)

const (
	// SecretName holds the webhook's CA and serving certificate in Drover's
	// namespace, shared by the manager's replicas.
	SecretName = "drover-webhook-tls"
	// ConfigurationName is the ValidatingWebhookConfiguration.
	ConfigurationName = "drover-tenancy"
	// WebhookName names the webhook in the API server's refusals.
	WebhookName = "tenancy.drover.io"
	// Path is where the webhook is served.
	Path = "/validate-tenancy"

	caKey = "ca.crt"
	// caKeyKey holds the CA's key, so that a replica serving other host
	// names can issue itself a certificate the caBundle still trusts.
	caKeyKey = "ca.key"

	caValidity      = 10 * 365 * 24 * time.Hour
	servingValidity = 5 * 365 * 24 * time.Hour
	// renewBefore: a serving certificate this close to its end is replaced
	// when a manager starts.
	renewBefore = 365 * 24 * time.Hour
	// timeoutSeconds bounds one call from the API server.
	timeoutSeconds = 10
)

// ensureCert returns the serving certificate for hosts and the CA that
// signed it, from the Secret, which it creates if absent (so that every
// replica serves under one CA) and renews if it does not cover hosts or
// ends within renewBefore. It reads with api (no cache: the manager may
// read no other Secret) and writes with w.
func ensureCert(ctx context.Context, api client.Reader, w client.Writer, ns string, hosts []string, now time.Time) (tls.Certificate, []byte, error) {
	var cert tls.Certificate
	var caPEM []byte
	key := client.ObjectKey{Namespace: ns, Name: SecretName}
	err := retry.OnError(retry.DefaultRetry, func(err error) bool {
		return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)
	}, func() error {
		var s corev1.Secret
		err := api.Get(ctx, key, &s)
		if apierrors.IsNotFound(err) {
			ca, err := pki.NewCA("drover-webhook-ca", now, caValidity)
			if err != nil {
				return err
			}
			crt, k, err := ca.IssueServing("drover-webhook", hosts, now, servingValidity)
			if err != nil {
				return err
			}
			s = corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: SecretName},
				Type:       corev1.SecretTypeTLS,
				Data:       map[string][]byte{caKey: ca.CertPEM, caKeyKey: ca.KeyPEM, corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: k},
			}
			if err := w.Create(ctx, &s); err != nil {
				return err // AlreadyExists: another replica made it; read it
			}
		} else if err != nil {
			return err
		}
		ca, err := pki.ParseCA(s.Data[caKey], s.Data[caKeyKey])
		if err != nil {
			return fmt.Errorf("the CA in Secret %s/%s: %w (delete the Secret to make a new one)", ns, SecretName, err)
		}
		if leaf, err := pki.ParseCert(s.Data[corev1.TLSCertKey]); err != nil || !covers(leaf, hosts) || leaf.NotAfter.Before(now.Add(renewBefore)) ||
			leaf.CheckSignatureFrom(ca.Cert) != nil {
			// Keep the names other replicas serve under.
			want := slices.Clone(hosts)
			if err == nil {
				want = append(want, leaf.DNSNames...)
				for _, ip := range leaf.IPAddresses {
					want = append(want, ip.String())
				}
			}
			slices.Sort(want)
			crt, k, err := ca.IssueServing("drover-webhook", slices.Compact(want), now, servingValidity)
			if err != nil {
				return err
			}
			s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey] = crt, k
			if err := w.Update(ctx, &s); err != nil {
				return err // Conflict: another replica renewed it; read it again
			}
		}
		if cert, err = tls.X509KeyPair(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]); err != nil {
			return fmt.Errorf("the serving certificate in Secret %s/%s: %w", ns, SecretName, err)
		}
		caPEM = ca.CertPEM
		return nil
	})
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("webhook serving certificate (Secret %s/%s): %w", ns, SecretName, err)
	}
	return cert, caPEM, nil
}

// covers says whether c is valid for every host.
func covers(c *x509.Certificate, hosts []string) bool {
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			if !slices.ContainsFunc(c.IPAddresses, ip.Equal) {
				return false
			}
		} else if !slices.Contains(c.DNSNames, h) {
			return false
		}
	}
	return true
}

// configuration is the ValidatingWebhookConfiguration for clientConfig.
func configuration(cc admissionregv1.WebhookClientConfig) *admissionregv1.ValidatingWebhookConfiguration {
	return &admissionregv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: ConfigurationName, Labels: map[string]string{"app.kubernetes.io/part-of": "drover"}},
		Webhooks: []admissionregv1.ValidatingWebhook{{
			Name:         WebhookName,
			ClientConfig: cc,
			Rules: []admissionregv1.RuleWithOperations{{
				Operations: []admissionregv1.OperationType{admissionregv1.Create, admissionregv1.Update},
				Rule: admissionregv1.Rule{
					APIGroups:   []string{batchv1.GroupVersion.Group},
					APIVersions: []string{"*"},
					// Not their status subresources: the manager's and
					// hubs' status writes never wait for the webhook.
					Resources: []string{"tasks", "taskgroups", "fleetjobs"},
					Scope:     ptr.To(admissionregv1.NamespacedScope),
				},
			}},
			// Fail closed: no manager, no new work.
			FailurePolicy: ptr.To(admissionregv1.Fail),
			MatchPolicy:   ptr.To(admissionregv1.Equivalent),
			SideEffects:   ptr.To(admissionregv1.SideEffectClassNone),
			// An update that leaves spec alone (finalizers, labels,
			// deletion) never calls the webhook, so that a down manager
			// blocks neither deletes nor the finalizers of hubs.
			MatchConditions: []admissionregv1.MatchCondition{{
				Name:       "spec-created-or-changed",
				Expression: "request.operation == 'CREATE' || object.spec != oldObject.spec",
			}},
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](timeoutSeconds),
		}},
	}
}

// ensureConfiguration creates or updates the ValidatingWebhookConfiguration
// to want. It reads with api (no cache: the manager watches no webhook
// configurations) and writes with w.
func ensureConfiguration(ctx context.Context, api client.Reader, w client.Writer, want *admissionregv1.ValidatingWebhookConfiguration) error {
	err := retry.OnError(retry.DefaultRetry, func(err error) bool {
		return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)
	}, func() error {
		var cur admissionregv1.ValidatingWebhookConfiguration
		err := api.Get(ctx, client.ObjectKeyFromObject(want), &cur)
		if apierrors.IsNotFound(err) {
			return w.Create(ctx, want.DeepCopy())
		}
		if err != nil {
			return err
		}
		cur.Labels = want.Labels
		cur.Webhooks = want.Webhooks
		return w.Update(ctx, &cur)
	})
	if err != nil {
		return fmt.Errorf("install ValidatingWebhookConfiguration %s: %w", want.Name, err)
	}
	return nil
}
