package service

import (
	"bytes"
	"context"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// goldenUnit is the unit of a typical install: the golden file is what an
// operator reviews when the unit changes.
func goldenUnit(t *testing.T, bin string) string {
	t.Helper()
	u, err := Unit(UnitConfig{
		ExecStart:       []string{bin, "--config=/etc/drover-agent/agent.yaml"},
		EnvironmentFile: "/etc/drover-agent/agent.env",
		ReadWritePaths:  []string{"/usr/local/bin"},
	})
	if err != nil {
		t.Fatalf("Unit() = %v", err)
	}
	return u
}

func TestUnitMatchesGolden(t *testing.T) {
	got := goldenUnit(t, "/usr/local/bin/drover-agent")
	path := filepath.Join("testdata", "drover-agent.service.golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden (go test -update writes it): %v", err)
	}
	if got != string(want) {
		t.Errorf("unit differs from %s (go test ./internal/agent/service -update, then review the diff):\n%s", path, got)
	}
	for _, line := range []string{"Restart=on-failure", "KillMode=process", "Delegate=yes", "RestartPreventExitStatus=2 3"} {
		if !strings.Contains(got, "\n"+line+"\n") {
			t.Errorf("unit lacks %q", line)
		}
	}
}

// TestUnitSystemdAnalyze runs systemd's own checker on the unit. It is
// skipped, saying so, where systemd-analyze is not installed: the golden
// test above still holds the unit text.
func TestUnitSystemdAnalyze(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed: the unit is checked against testdata/drover-agent.service.golden only")
	}
	dir := t.TempDir()
	// verify checks that ExecStart's binary exists and is executable.
	bin := filepath.Join(dir, "drover-agent")
	if err := os.WriteFile(bin, []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	unit := filepath.Join(dir, UnitName)
	if err := os.WriteFile(unit, []byte(goldenUnit(t, bin)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// --man=no: no man pages here to look Documentation= up in.
	cmd := exec.CommandContext(ctx, sa, "verify", "--man=no", unit)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	t.Logf("systemd-analyze verify %s:\n%s", UnitName, out.String())
	if err != nil {
		t.Fatalf("systemd-analyze verify = %v:\n%s", err, out.String())
	}
	// verify exits 0 for some warnings; the unit's own lines must not warn.
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.Contains(l, UnitName) {
			t.Errorf("systemd-analyze warns about the unit: %s", l)
		}
	}
}

func TestQuoteArg(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"--node=a", "--node=a"},
		{"--labels=room=2 b", `"--labels=room=2 b"`},
		{`a"b`, `"a\"b"`},
		{`a\b`, `"a\\b"`},
		{"100%", "100%%"},
		{"$HOME", "$$HOME"},
		{";", `";"`},
		{"", `""`},
	} {
		if got, err := quoteArg(tc.in); err != nil || got != tc.want {
			t.Errorf("quoteArg(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	if _, err := quoteArg("a\nExecStartPre=/bin/evil"); err == nil {
		t.Errorf("quoteArg(a line break) = nil error, want a refusal: it would add a unit line")
	}
}
