package service

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func fakeBinary(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "drover-agent")
	if err := os.WriteFile(p, []byte("agent binary v1\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	return p
}

func wantMode(t *testing.T, path string, want fs.FileMode) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Errorf("stat %s: %v", path, err)
		return
	}
	if got := st.Mode().Perm(); got != want {
		t.Errorf("%s mode = %o, want %o", path, got, want)
	}
}

func TestInstallWritesTheLayoutAndUninstallKeepsState(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	var out bytes.Buffer
	o := Options{
		Binary: fakeBinary(t), Root: root, Out: &out,
		Args:  []string{"--hub=hub.example.com:7443", "--node=robot-7"},
		Token: "abcdef.0123456789abcdef",
	}
	if err := Install(ctx, o); err != nil {
		t.Fatalf("Install() = %v\n%s", err, out.String())
	}
	at := func(p string) string { return filepath.Join(root, p) }
	if b, err := os.ReadFile(at("/usr/local/bin/drover-agent")); err != nil || string(b) != "agent binary v1\n" {
		t.Errorf("installed binary = %q, %v; want the source's bytes", b, err)
	}
	wantMode(t, at("/usr/local/bin/drover-agent"), 0o755)
	wantMode(t, at("/var/lib/drover-agent"), 0o700)
	wantMode(t, at("/etc/drover-agent/agent.env"), 0o600)
	wantMode(t, at("/etc/systemd/system/drover-agent.service"), 0o644)
	env, _ := os.ReadFile(at("/etc/drover-agent/agent.env"))
	if string(env) != "DROVER_TOKEN=abcdef.0123456789abcdef\n" {
		t.Errorf("agent.env = %q, want the token as DROVER_TOKEN", env)
	}
	unit, _ := os.ReadFile(at("/etc/systemd/system/drover-agent.service"))
	if !strings.Contains(string(unit), "\nExecStart=/usr/local/bin/drover-agent --hub=hub.example.com:7443 --node=robot-7\n") {
		t.Errorf("unit ExecStart is not the installed binary with the flags:\n%s", unit)
	}
	if strings.Contains(string(unit), "abcdef") {
		t.Errorf("the world-readable unit holds the bootstrap token:\n%s", unit)
	}
	if !strings.Contains(out.String(), "systemctl daemon-reload; systemctl enable --now drover-agent.service") {
		t.Errorf("install under a root without systemctl should print the systemctl commands to run; printed:\n%s", out.String())
	}
	// The agent's identity lives in the state dir: uninstall keeps it.
	if err := os.WriteFile(at("/var/lib/drover-agent/agent.db"), []byte("db"), 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := Uninstall(ctx, Options{Root: root, Out: &out}); err != nil {
		t.Fatalf("Uninstall() = %v", err)
	}
	for _, gone := range []string{"/usr/local/bin/drover-agent", "/etc/systemd/system/drover-agent.service"} {
		if _, err := os.Stat(at(gone)); !os.IsNotExist(err) {
			t.Errorf("after uninstall, stat %s = %v; want it gone", gone, err)
		}
	}
	for _, kept := range []string{"/var/lib/drover-agent/agent.db", "/etc/drover-agent/agent.env"} {
		if _, err := os.Stat(at(kept)); err != nil {
			t.Errorf("uninstall without --purge removed %s: %v", kept, err)
		}
	}
	if err := Uninstall(ctx, Options{Root: root, Purge: true}); err != nil {
		t.Fatalf("Uninstall(Purge) = %v", err)
	}
	for _, gone := range []string{"/var/lib/drover-agent", "/etc/drover-agent"} {
		if _, err := os.Stat(at(gone)); !os.IsNotExist(err) {
			t.Errorf("after uninstall --purge, stat %s = %v; want it gone", gone, err)
		}
	}
}

func TestInstallDryRunWritesNothing(t *testing.T) {
	root := t.TempDir()
	var out bytes.Buffer
	o := Options{Binary: fakeBinary(t), Root: root, Out: &out, DryRun: true, Token: "t", Args: []string{"--node=n1"}}
	if err := Install(context.Background(), o); err != nil {
		t.Fatalf("Install(DryRun) = %v", err)
	}
	entries, err := os.ReadDir(root)
	if err != nil || len(entries) != 0 {
		t.Errorf("dry run wrote %v (err %v), want nothing", entries, err)
	}
	for _, want := range []string{"would install", "would write the unit /etc/systemd/system/drover-agent.service", "ExecStart=/usr/local/bin/drover-agent --node=n1", "would write the bootstrap token"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("dry run output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := Uninstall(context.Background(), Options{Root: root, Out: &out, DryRun: true, Purge: true}); err != nil {
		t.Fatalf("Uninstall(DryRun) = %v", err)
	}
	if !strings.Contains(out.String(), "would remove /var/lib/drover-agent and everything in it") {
		t.Errorf("uninstall dry run output:\n%s", out.String())
	}
}

func TestInstallRefusesBadInput(t *testing.T) {
	for name, o := range map[string]Options{
		"relative state dir":        {StateDir: "var/lib/x"},
		"a line break in the token": {Token: "a\nExecStart=/bin/sh"},
		"a line break in a flag":    {Args: []string{"--node=a\nUser=nobody"}},
		"a relative bin dir":        {BinDir: "bin"},
	} {
		o.Binary, o.Root = fakeBinary(t), t.TempDir()
		if err := Install(context.Background(), o); err == nil {
			t.Errorf("Install(%s) = nil, want an error", name)
		}
	}
}
