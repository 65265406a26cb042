package agent

import (
	"maps"
	"strings"
	"testing"
)

func TestParseCapacity(t *testing.T) {
	tests := []struct {
		in      string
		want    map[string]string
		wantErr string // substring; "" for success
	}{
		{in: "", want: nil},
		{in: "  ", want: nil},
		{in: "gpu=1", want: map[string]string{"gpu": "1"}},
		{in: " gpu = 2 , example.com/fpga=1,memory=8Gi", want: map[string]string{"gpu": "2", "example.com/fpga": "1", "memory": "8Gi"}},
		{in: "cpu=500m,ephemeral-storage=1.5T,a.io/x=.5,a.io/y=2.,a.io/z=1e3,a.io/w=12E-2,a.io/v=0", want: map[string]string{"cpu": "500m", "ephemeral-storage": "1.5T", "a.io/x": ".5", "a.io/y": "2.", "a.io/z": "1e3", "a.io/w": "12E-2", "a.io/v": "0"}},
		{in: "nvidia.com/gpu=4,example.com/a_b.c-d=1Ki", want: map[string]string{"nvidia.com/gpu": "4", "example.com/a_b.c-d": "1Ki"}},
		{in: "disk=1", wantErr: "unprefixed name is one of cpu, memory, ephemeral-storage, gpu"},
		{in: "kubernetes.io/fpga=1", wantErr: "Kubernetes' own"},
		{in: "gpu", wantErr: "want name=quantity"},
		{in: "=1", wantErr: "want name=quantity"},
		{in: "gpu=1,", wantErr: "want name=quantity"},
		{in: "gpu=", wantErr: "quantity \"\""},
		{in: "gpu=-1", wantErr: "non-negative"},
		{in: "gpu=one", wantErr: "non-negative"},
		{in: "memory=8GB", wantErr: "non-negative"},
		{in: "memory=8gi", wantErr: "non-negative"},
		{in: "gpu=1 2", wantErr: "non-negative"},
		{in: "gpu=1e", wantErr: "non-negative"},
		{in: "-gpu=1", wantErr: "name"},
		{in: "my gpu=1", wantErr: "name"},
		{in: "Example.com/gpu=1", wantErr: "DNS subdomain"},
		{in: "/gpu=1", wantErr: "DNS subdomain"},
		{in: "a/b/c=1", wantErr: "name"},
		{in: "a.io/" + strings.Repeat("g", 64) + "=1", wantErr: "at most 63"},
		{in: "gpu=1,gpu=2", wantErr: "twice"},
	}
	for _, tc := range tests {
		got, err := ParseCapacity(tc.in)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("ParseCapacity(%q): %v", tc.in, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("ParseCapacity(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.wantErr)
		case tc.wantErr == "" && !maps.Equal(got, tc.want):
			t.Errorf("ParseCapacity(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
