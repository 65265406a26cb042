package controlplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
)

// CRDEstablishTimeout bounds InstallCRDs' wait for every CRD to be
// Established, unless ctx ends sooner.
const CRDEstablishTimeout = time.Minute

// InstallCRDs creates or updates the CustomResourceDefinitions in manifests
// (YAML or JSON; a manifest may hold several documents separated by "---")
// and waits until each is Established and its names are accepted. It works
// against any cluster. A document that is not a CRD is an error.
func InstallCRDs(ctx context.Context, cfg *rest.Config, manifests [][]byte) error {
	crds, err := decodeCRDs(manifests)
	if err != nil {
		return err
	}
	if len(crds) == 0 {
		return nil
	}
	cs, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("install CRDs: %w", err)
	}
	client := cs.ApiextensionsV1().CustomResourceDefinitions()
	for _, crd := range crds {
		if err := createOrUpdateCRD(ctx, client, crd); err != nil {
			return err
		}
	}

	ctx, cancel := context.WithTimeout(ctx, CRDEstablishTimeout)
	defer cancel()
	for _, crd := range crds {
		var last string
		err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			got, err := client.Get(ctx, crd.Name, metav1.GetOptions{})
			if err != nil {
				last = err.Error()
				return false, nil
			}
			ok, why := crdReady(got)
			last = why
			return ok, nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s not established within %s: %s", crd.Name, CRDEstablishTimeout, last)
		}
	}
	return nil
}

type crdClient interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*apiextensionsv1.CustomResourceDefinition, error)
	Create(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition, opts metav1.CreateOptions) (*apiextensionsv1.CustomResourceDefinition, error)
	Update(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition, opts metav1.UpdateOptions) (*apiextensionsv1.CustomResourceDefinition, error)
}

func createOrUpdateCRD(ctx context.Context, client crdClient, crd *apiextensionsv1.CustomResourceDefinition) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		existing, err := client.Get(ctx, crd.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = client.Create(ctx, crd.DeepCopy(), metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				// Created concurrently: retry as an update.
				return apierrors.NewConflict(apiextensionsv1.Resource("customresourcedefinitions"), crd.Name, err)
			}
			if err != nil {
				return fmt.Errorf("create CRD %s: %w", crd.Name, err)
			}
			return nil
		case err != nil:
			return fmt.Errorf("get CRD %s: %w", crd.Name, err)
		}
		updated := crd.DeepCopy()
		updated.ResourceVersion = existing.ResourceVersion
		if _, err := client.Update(ctx, updated, metav1.UpdateOptions{}); err != nil {
			if apierrors.IsConflict(err) {
				return err
			}
			return fmt.Errorf("update CRD %s: %w", crd.Name, err)
		}
		return nil
	})
}

// crdReady reports whether crd is Established with accepted names, and if
// not, why.
func crdReady(crd *apiextensionsv1.CustomResourceDefinition) (bool, string) {
	var established, named bool
	why := "no Established condition yet"
	for _, c := range crd.Status.Conditions {
		switch c.Type {
		case apiextensionsv1.Established:
			established = c.Status == apiextensionsv1.ConditionTrue
			if !established {
				why = fmt.Sprintf("Established=%s: %s %s", c.Status, c.Reason, c.Message)
			}
		case apiextensionsv1.NamesAccepted:
			named = c.Status == apiextensionsv1.ConditionTrue
			if !named {
				return false, fmt.Sprintf("NamesAccepted=%s: %s %s", c.Status, c.Reason, c.Message)
			}
		}
	}
	return established && named, why
}

// decodeCRDs splits and decodes manifests. Empty documents are skipped.
func decodeCRDs(manifests [][]byte) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	var out []*apiextensionsv1.CustomResourceDefinition
	for i, m := range manifests {
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(m), 4096)
		for doc := 1; ; doc++ {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			err := dec.Decode(crd)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("manifest %d, document %d: %w", i, doc, err)
			}
			if crd.Kind == "" && crd.Name == "" {
				continue // empty document
			}
			if crd.Kind != "CustomResourceDefinition" || crd.APIVersion != apiextensionsv1.SchemeGroupVersion.String() {
				return nil, fmt.Errorf("manifest %d, document %d: %s, Kind=%s %q is not an apiextensions.k8s.io/v1 CustomResourceDefinition", i, doc, crd.APIVersion, crd.Kind, crd.Name)
			}
			if crd.Name == "" {
				return nil, fmt.Errorf("manifest %d, document %d: CRD without metadata.name", i, doc)
			}
			out = append(out, crd)
		}
	}
	return out, nil
}
