package features

import (
	"strings"
	"testing"
)

func TestFlag(t *testing.T) {
	tests := []struct {
		in      string
		want    bool
		wantErr string
	}{
		{"disableNodeTaskV1alpha2", true, ""},
		{"disableNodeTaskV1alpha2=true", true, ""},
		{"disableNodeTaskV1alpha2=false", false, ""},
		{" disableNodeTaskV1alpha2 ", true, ""},
		{"noSuchGate", false, "unrecognized feature gate"},
		{"disableNodeTaskV1alpha2=maybe", false, "invalid value"},
	}
	for _, tt := range tests {
		g := New()
		err := Flag{Gate: g}.Set(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Set(%q) = %v, want error containing %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("Set(%q) = %v", tt.in, err)
			continue
		}
		if got := g.Enabled(DisableNodeTaskV1alpha2); got != tt.want {
			t.Errorf("Set(%q): enabled = %v, want %v", tt.in, got, tt.want)
		}
	}
	if New().Enabled(DisableNodeTaskV1alpha2) {
		t.Error("node jobs are off by default")
	}
}
