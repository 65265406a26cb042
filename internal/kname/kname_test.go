package kname

import (
	"strings"
	"testing"
)

func TestLabelValue(t *testing.T) {
	long := strings.Repeat("a", 62) + "-.b"
	tests := []struct{ in, want string }{
		{"job-1", "job-1"},
		{strings.Repeat("x", 63), strings.Repeat("x", 63)},
		{long, strings.Repeat("a", 62)},
		{strings.Repeat("y", 70), strings.Repeat("y", 63)},
	}
	for _, tt := range tests {
		if got := LabelValue(tt.in); got != tt.want {
			t.Errorf("LabelValue(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
