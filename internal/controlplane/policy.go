package controlplane

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
)

// InstallPolicies creates or updates the ValidatingAdmissionPolicies and
// their bindings in manifests (YAML or JSON, several documents each). A
// policy is in force once the apiserver has loaded it, about a second
// later; InstallPolicies does not wait for that. A document of any other
// kind is an error.
func InstallPolicies(ctx context.Context, cfg *rest.Config, manifests [][]byte) error {
	policies, bindings, err := decodePolicies(manifests)
	if err != nil {
		return err
	}
	if len(policies)+len(bindings) == 0 {
		return nil
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("install admission policies: %w", err)
	}
	pc := cs.AdmissionregistrationV1().ValidatingAdmissionPolicies()
	for _, p := range policies {
		if err := apply(ctx, "ValidatingAdmissionPolicy", p, pc.Get, pc.Create, pc.Update); err != nil {
			return err
		}
	}
	bc := cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
	for _, b := range bindings {
		if err := apply(ctx, "ValidatingAdmissionPolicyBinding", b, bc.Get, bc.Create, bc.Update); err != nil {
			return err
		}
	}
	return nil
}

// object is what apply needs of a typed cluster-scoped object.
type object[T any] interface {
	*T
	metav1.Object
	DeepCopy() *T
}

// apply creates want, or updates the object of its name to want.
func apply[T any, P object[T]](ctx context.Context, kind string, want P,
	get func(context.Context, string, metav1.GetOptions) (P, error),
	create func(context.Context, P, metav1.CreateOptions) (P, error),
	update func(context.Context, P, metav1.UpdateOptions) (P, error),
) error {
	name := want.GetName()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		existing, err := get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = create(ctx, P(want.DeepCopy()), metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(admissionv1.Resource(kind), name, err)
			}
			if err != nil {
				return fmt.Errorf("create %s %s: %w", kind, name, err)
			}
			return nil
		case err != nil:
			return fmt.Errorf("get %s %s: %w", kind, name, err)
		}
		updated := P(want.DeepCopy())
		updated.SetResourceVersion(existing.GetResourceVersion())
		if _, err := update(ctx, updated, metav1.UpdateOptions{}); err != nil {
			if apierrors.IsConflict(err) {
				return err
			}
			return fmt.Errorf("update %s %s: %w", kind, name, err)
		}
		return nil
	})
}

func decodePolicies(manifests [][]byte) ([]*admissionv1.ValidatingAdmissionPolicy, []*admissionv1.ValidatingAdmissionPolicyBinding, error) {
	var (
		policies []*admissionv1.ValidatingAdmissionPolicy
		bindings []*admissionv1.ValidatingAdmissionPolicyBinding
	)
	for i, m := range manifests {
		docs := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(m)))
		for doc := 1; ; doc++ {
			raw, err := docs.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, nil, fmt.Errorf("manifest %d, document %d: %w", i, doc, err)
			}
			var meta metav1.TypeMeta
			if err := utilyaml.Unmarshal(raw, &meta); err != nil {
				return nil, nil, fmt.Errorf("manifest %d, document %d: %w", i, doc, err)
			}
			if meta.Kind == "" && meta.APIVersion == "" {
				continue // empty document
			}
			if meta.APIVersion != admissionv1.SchemeGroupVersion.String() {
				return nil, nil, fmt.Errorf("manifest %d, document %d: %s %s is not admissionregistration.k8s.io/v1", i, doc, meta.APIVersion, meta.Kind)
			}
			var into metav1.Object
			switch meta.Kind {
			case "ValidatingAdmissionPolicy":
				p := &admissionv1.ValidatingAdmissionPolicy{}
				policies, into = append(policies, p), p
			case "ValidatingAdmissionPolicyBinding":
				b := &admissionv1.ValidatingAdmissionPolicyBinding{}
				bindings, into = append(bindings, b), b
			default:
				return nil, nil, fmt.Errorf("manifest %d, document %d: %s is not a ValidatingAdmissionPolicy or ValidatingAdmissionPolicyBinding", i, doc, meta.Kind)
			}
			if err := utilyaml.UnmarshalStrict(raw, into); err != nil {
				return nil, nil, fmt.Errorf("manifest %d, document %d (%s): %w", i, doc, meta.Kind, err)
			}
			if into.GetName() == "" {
				return nil, nil, fmt.Errorf("manifest %d, document %d: %s without metadata.name", i, doc, meta.Kind)
			}
		}
	}
	return policies, bindings, nil
}
