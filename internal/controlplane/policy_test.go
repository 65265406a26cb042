package controlplane

import (
	"strings"
	"testing"

	"github.com/drover-fleet/drover/config/admission"
)

func TestDecodePolicies(t *testing.T) {
	shipped, err := admission.Manifests()
	if err != nil {
		t.Fatal(err)
	}
	p, b, err := decodePolicies(shipped)
	if err != nil || len(p) == 0 || len(b) != len(p) {
		t.Fatalf("config/admission: %d policies, %d bindings, %v; want one binding per policy", len(p), len(b), err)
	}
	for i := range p {
		if b[i].Spec.PolicyName != p[i].Name {
			t.Errorf("binding %s names policy %q, want %q", b[i].Name, b[i].Spec.PolicyName, p[i].Name)
		}
	}
	tests := []struct {
		name, doc, wantErr string
	}{
		{"empty documents", "---\n---\n", ""},
		{"another kind", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "not admissionregistration.k8s.io/v1"},
		{"a webhook", "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata: {name: x}\n", "is not a ValidatingAdmissionPolicy"},
		{"no name", "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\nspec: {}\n", "without metadata.name"},
		{"unknown field", "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\nmetadata: {name: x}\nspec: {validation: []}\n", "unknown field"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := decodePolicies([][]byte{[]byte(tt.doc)})
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("decodePolicies() = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}
