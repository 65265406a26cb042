package v1alpha1

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestCheckResourceName(t *testing.T) {
	for _, tc := range []struct {
		name    string
		wantErr string // "" accepts
	}{
		{name: "cpu"},
		{name: "memory"},
		{name: "ephemeral-storage"},
		{name: "gpu"},
		{name: "example.com/fpga"},
		{name: "nvidia.com/gpu"},
		{name: "vendor/widget"},
		{name: "memroy", wantErr: "did you mean memory?"},
		{name: "CPU", wantErr: "did you mean cpu?"},
		{name: "gpus", wantErr: "did you mean gpu?"},
		{name: "fpga", wantErr: "domain-prefixed extended resource"},
		{name: "", wantErr: "not a resource name"},
		{name: "kubernetes.io/fpga", wantErr: "not kubernetes.io"},
		{name: "node.kubernetes.io/fpga", wantErr: "not kubernetes.io"},
		{name: "example.com/", wantErr: "not an extended resource name"},
		{name: "Example_Com/fpga", wantErr: "not an extended resource name"},
		{name: "example.com/a/b", wantErr: "not an extended resource name"},
		{name: "example.com/" + strings.Repeat("x", 64), wantErr: "not an extended resource name"},
	} {
		err := CheckResourceName(corev1.ResourceName(tc.name))
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%q: %v, want accepted", tc.name, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%q: %v, want an error containing %q", tc.name, err, tc.wantErr)
		}
	}
}
