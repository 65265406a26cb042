package controlplane

import (
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
)

const crdA = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.drover.io
spec:
  group: example.drover.io
  names: {kind: Widget, listKind: WidgetList, plural: widgets, singular: widget}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
`

const crdB = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gadgets.example.drover.io
spec:
  group: example.drover.io
  names: {kind: Gadget, listKind: GadgetList, plural: gadgets, singular: gadget}
  scope: Cluster
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object}
`

func TestDecodeCRDs(t *testing.T) {
	tests := []struct {
		name      string
		manifests []string
		want      []string
		wantErr   string
	}{
		{name: "one manifest with one CRD", manifests: []string{crdA}, want: []string{"widgets.example.drover.io"}},
		{name: "multi-document manifest with empty documents", manifests: []string{"---\n" + crdA + "---\n---\n" + crdB + "---\n"}, want: []string{"widgets.example.drover.io", "gadgets.example.drover.io"}},
		{name: "several manifests keep their order", manifests: []string{crdB, crdA}, want: []string{"gadgets.example.drover.io", "widgets.example.drover.io"}},
		{name: "empty manifest", manifests: []string{""}, want: nil},
		{name: "a ConfigMap is refused", manifests: []string{crdA + "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"}, wantErr: "document 2"},
		{name: "a v1beta1 CRD is refused", manifests: []string{strings.Replace(crdA, "apiextensions.k8s.io/v1", "apiextensions.k8s.io/v1beta1", 1)}, wantErr: "not an apiextensions.k8s.io/v1 CustomResourceDefinition"},
		{name: "broken YAML", manifests: []string{"apiVersion: [\n"}, wantErr: "manifest 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ms [][]byte
			for _, m := range tt.manifests {
				ms = append(ms, []byte(m))
			}
			crds, err := decodeCRDs(ms)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("decodeCRDs() error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("decodeCRDs() = %v", err)
			}
			var got []string
			for _, c := range crds {
				got = append(got, c.Name)
			}
			if strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("decodeCRDs() names = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestCRDReady(t *testing.T) {
	cond := func(typ apiextensionsv1.CustomResourceDefinitionConditionType, s apiextensionsv1.ConditionStatus) apiextensionsv1.CustomResourceDefinitionCondition {
		return apiextensionsv1.CustomResourceDefinitionCondition{Type: typ, Status: s, Reason: "R"}
	}
	tests := []struct {
		name  string
		conds []apiextensionsv1.CustomResourceDefinitionCondition
		want  bool
	}{
		{name: "no conditions yet", want: false},
		{name: "established and names accepted", conds: []apiextensionsv1.CustomResourceDefinitionCondition{cond(apiextensionsv1.NamesAccepted, apiextensionsv1.ConditionTrue), cond(apiextensionsv1.Established, apiextensionsv1.ConditionTrue)}, want: true},
		{name: "names not accepted", conds: []apiextensionsv1.CustomResourceDefinitionCondition{cond(apiextensionsv1.NamesAccepted, apiextensionsv1.ConditionFalse), cond(apiextensionsv1.Established, apiextensionsv1.ConditionTrue)}, want: false},
		{name: "not yet established", conds: []apiextensionsv1.CustomResourceDefinitionCondition{cond(apiextensionsv1.NamesAccepted, apiextensionsv1.ConditionTrue), cond(apiextensionsv1.Established, apiextensionsv1.ConditionFalse)}, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			crd.Status.Conditions = tt.conds
			got, why := crdReady(crd)
			if got != tt.want {
				t.Errorf("crdReady() = %v (%s), want %v", got, why, tt.want)
			}
			if !got && why == "" {
				t.Error("crdReady() = false with no reason, want a reason")
			}
		})
	}
}
