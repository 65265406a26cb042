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

// A bad --capacity is a usage error before anything runs.
func TestBadCapacityFlag(t *testing.T) {
	for _, c := range []string{"gpu", "gpu=-1", "gpu=lots", "memory=8GB", "bad name=1"} {
		if code := Main([]string{"--capacity", c, "--state-dir", t.TempDir()}); code != 2 {
			t.Errorf("Main(--capacity %q) = %d, want 2", c, code)
		}
	}
}

// A bad --cgroups or --cgroup-parent is a usage error before anything runs.
func TestBadCgroupFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--cgroups", "maybe"},
		{"--cgroups", "required", "--cgroup-parent", "../../escape"},
	} {
		if code := Main(append(args, "--state-dir", t.TempDir())); code != 2 {
			t.Errorf("Main(%q) = %d, want 2", args, code)
		}
	}
}
