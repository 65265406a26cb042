package cmd

import (
	"io"
	"os"
	"path/filepath"
	"strings"
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

// install takes the agent's own flags, checks them as the agent would, and
// writes them into the unit; the token goes to the 0600 environment file.
func TestInstallCommand(t *testing.T) {
	root := t.TempDir()
	var out, errb strings.Builder
	code := runInstall([]string{"--root", root, "--hub", "h1:7443,h2:7443", "--token", "abcdef.0123456789abcdef",
		"--labels", "site=berlin,room=2 b", "--state-dir", "/srv/drover"}, &out, &errb)
	if code != 0 {
		t.Fatalf("install = %d, stderr:\n%s", code, errb.String())
	}
	unit, err := os.ReadFile(filepath.Join(root, "etc/systemd/system/drover-agent.service"))
	if err != nil {
		t.Fatal(err)
	}
	want := `ExecStart=/usr/local/bin/drover-agent --hub=h1:7443,h2:7443 "--labels=site=berlin,room=2 b" --state-dir=/srv/drover` + "\n"
	if !strings.Contains(string(unit), want) {
		t.Errorf("unit lacks %q:\n%s", want, unit)
	}
	if strings.Contains(string(unit), "abcdef") {
		t.Errorf("unit holds the token:\n%s", unit)
	}
	if _, err := os.Stat(filepath.Join(root, "srv/drover")); err != nil {
		t.Errorf("state dir from --state-dir not created: %v", err)
	}
	for _, bad := range [][]string{
		{"--cgroups", "maybe"},
		{"--version"},
		{"extra-arg"},
		{"--no-such-flag"},
	} {
		if code := runInstall(append([]string{"--root", t.TempDir()}, bad...), io.Discard, io.Discard); code != 2 {
			t.Errorf("install %q = %d, want 2", bad, code)
		}
	}
	if code := runUninstall([]string{"--root", root, "--state-dir", "/srv/drover"}, &out, &errb); code != 0 {
		t.Errorf("uninstall = %d: %s", code, errb.String())
	}
	if _, err := os.Stat(filepath.Join(root, "srv/drover")); err != nil {
		t.Errorf("uninstall without --purge removed the state dir: %v", err)
	}
}
