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
// writes them into the config file the unit passes; the token goes to the
// 0600 environment file. uninstall finds the state dir in that file.
func TestInstallCommand(t *testing.T) {
	root := t.TempDir()
	var out, errb strings.Builder
	code := runInstall([]string{"--root", root, "--hub", "h1:7443,h2:7443", "--token", "abcdef.0123456789abcdef",
		"--labels", "site=berlin,room=2 b", "--state-dir", "/srv/drover", "--metrics-addr", "127.0.0.1:9464"}, &out, &errb)
	if code != 0 {
		t.Fatalf("install = %d, stderr:\n%s", code, errb.String())
	}
	unit, err := os.ReadFile(filepath.Join(root, "etc/systemd/system/drover-agent.service"))
	if err != nil {
		t.Fatal(err)
	}
	want := "\nExecStart=/usr/local/bin/drover-agent --config=/etc/drover-agent/agent.yaml\n"
	if !strings.Contains(string(unit), want) {
		t.Errorf("unit lacks %q:\n%s", want, unit)
	}
	cfg, err := os.ReadFile(filepath.Join(root, "etc/drover-agent/agent.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{`hub: "h1:7443,h2:7443"`, `labels: "site=berlin,room=2 b"`, "state-dir: /srv/drover", `metrics-addr: "127.0.0.1:9464"`} {
		if !strings.Contains(string(cfg), "\n"+line+"\n") {
			t.Errorf("installed config lacks %q:\n%s", line, cfg)
		}
	}
	for name, text := range map[string][]byte{"unit": unit, "config": cfg} {
		if strings.Contains(string(text), "abcdef") {
			t.Errorf("the %s holds the token:\n%s", name, text)
		}
	}
	// The installed file is one the agent accepts, meaning the same.
	got, err := effective(t, "--config", filepath.Join(root, "etc/drover-agent/agent.yaml"))
	if err != nil || !strings.Contains(got, "labels: \"site=berlin,room=2 b\"\n") {
		t.Errorf("the agent reads the installed config as %v:\n%s", err, got)
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
	if code := runUninstall([]string{"--root", root}, &out, &errb); code != 0 {
		t.Errorf("uninstall = %d: %s", code, errb.String())
	}
	if _, err := os.Stat(filepath.Join(root, "srv/drover")); err != nil {
		t.Errorf("uninstall without --purge removed the state dir: %v", err)
	}
	if code := runUninstall([]string{"--root", root, "--purge"}, &out, &errb); code != 0 {
		t.Errorf("uninstall --purge = %d: %s", code, errb.String())
	}
	for _, gone := range []string{"srv/drover", "srv/drover-work", "etc/drover-agent"} {
		if _, err := os.Stat(filepath.Join(root, gone)); !os.IsNotExist(err) {
			t.Errorf("uninstall --purge left /%s (the state dir named in the installed config): %v", gone, err)
		}
	}
}

// --apps (default on) gives the agent AppOptions; --instance-ports is
// LO-HI within 1-65535, else a usage error.
func TestAppsFlags(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		apps     bool
		lo, hi   int
		wantFail bool
	}{
		{args: nil, apps: true},
		{args: []string{"--apps=false"}, apps: false},
		{args: []string{"--instance-ports", "30000-32767", "--session-socket-dir", "/run/s"}, apps: true, lo: 30000, hi: 32767},
		{args: []string{"--instance-ports", "32767-30000"}, wantFail: true},
		{args: []string{"--instance-ports", "0-10"}, wantFail: true},
		{args: []string{"--instance-ports", "30000"}, wantFail: true},
	} {
		s := newSettings()
		if err := s.fs.Parse(append(tc.args, "--hub", "h:1", "--state-dir", t.TempDir())); err != nil {
			t.Fatal(err)
		}
		o, err := s.options()
		if (err != nil) != tc.wantFail {
			t.Errorf("%q: err %v, want failure %v", tc.args, err, tc.wantFail)
			continue
		}
		if tc.wantFail {
			continue
		}
		if (o.Apps != nil) != tc.apps || (o.Apps != nil && (o.Apps.PortMin != tc.lo || o.Apps.PortMax != tc.hi)) {
			t.Errorf("%q: apps options %+v, want enabled %v ports %d-%d", tc.args, o.Apps, tc.apps, tc.lo, tc.hi)
		}
	}
}
