package cmd

import "testing"

func TestBadTaskFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--task-retention", "-1h"},
		{"--task-retention", "soon"},
		{"--max-artifact-bytes", "0"},
		{"--max-artifact-bytes", "-5"},
		{"--max-artifact-bytes", "1GiB"},
	} {
		if code := Main(append(args, "--state-dir", t.TempDir())); code != 2 {
			t.Errorf("Main(%q) = %d, want 2 (a usage error, before running)", args, code)
		}
	}
}
