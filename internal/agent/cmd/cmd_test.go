package cmd

import (
	"os"
	"testing"
)

func TestBadTaskFlags(t *testing.T) {
	bad := [][]string{
		{"--task-retention", "-1h"},
		{"--task-retention", "soon"},
		{"--max-artifact-bytes", "0"},
		{"--max-artifact-bytes", "-5"},
		{"--max-artifact-bytes", "1GiB"},
		{"--task-user", "no-such-user-here"},
		{"--task-user", "1000:staff"},
		{"--task-user", ""},
	}
	if os.Geteuid() == 0 {
		// Root as the default user of every task is a usage error unless meant.
		bad = append(bad, []string{"--task-user", "root"}, []string{"--task-user", "1000:0"})
	}
	for _, args := range bad {
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
