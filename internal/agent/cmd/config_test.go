package cmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// effective parses args (and the config they name) and prints the settings.
func effective(t *testing.T, args ...string) (string, error) {
	t.Helper()
	s := newSettings()
	if err := s.fs.Parse(args); err != nil {
		return "", err
	}
	if s.config != "" {
		if err := s.loadConfig(s.config, s.given()); err != nil {
			return "", err
		}
	}
	if _, err := s.options(); err != nil {
		return "", err
	}
	var b strings.Builder
	if err := s.printEffective(&b); err != nil {
		return "", err
	}
	return b.String(), nil
}

func TestConfigFileAndFlags(t *testing.T) {
	cfg := writeConfig(t, `
hub: [hub-1.example.com:7443, hub-2.example.com:7443]
node: robot-7
labels: {site: berlin, room: 2b}
capacity:
  gpu: 1
task-retention: 48h
stop-tasks-on-exit: true
token: abcdef.0123456789abcdef
log-level: warn
`)
	got, err := effective(t, "--config", cfg, "--node", "robot-8")
	if err != nil {
		t.Fatalf("effective settings: %v", err)
	}
	for _, want := range []string{
		`hub: "hub-1.example.com:7443,hub-2.example.com:7443"`,
		"node: robot-8", // the flag wins over the file
		`labels: "site=berlin,room=2b"`,
		`capacity: "gpu=1"`,
		"task-retention: 48h0m0s",
		"stop-tasks-on-exit: true",
		`token: "<redacted>"`,
		"log-level: warn",
	} {
		if !strings.Contains(got, want+"\n") {
			t.Errorf("effective settings lack %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "abcdef") {
		t.Errorf("effective settings print the token:\n%s", got)
	}
	// What --check-config prints is a config file that means the same
	// (but the redacted token, which it does not carry).
	again, err := effective(t, "--config", writeConfig(t, strings.ReplaceAll(got, `token: "<redacted>"`, "")))
	if err != nil {
		t.Fatalf("printed settings do not read back: %v\n%s", err, got)
	}
	strip := func(s string) string {
		_, rest, _ := strings.Cut(s, "\n")
		return strings.ReplaceAll(rest, "token: \"<redacted>\"\n", "token: \"\"\n")
	}
	if strip(again) != strip(got) {
		t.Errorf("settings read back from the printed ones differ:\nprinted:\n%s\nread back:\n%s", got, again)
	}
}

func TestConfigErrorsNameTheKey(t *testing.T) {
	for _, tc := range []struct {
		name, text, want string
	}{
		{"unknown key", "node: a\nhubs: [h:1]\n", `line 2: unknown key "hubs"`},
		{"a command, not a setting", "version: true\n", `unknown key "version"`},
		{"a config naming a config", "config: /x.yaml\n", `unknown key "config"`},
		{"repeated key", "node: a\nnode: b\n", `key "node" repeats line 1`},
		{"bad value", "task-retention: soon\n", "task-retention"},
		{"checked like the flag", "cgroups: maybe\n", `--cgroups "maybe"`},
		{"nested value", "hub: [[a]]\n", "hub: want a plain value"},
		{"comma in a list item", "hub: ['a,b']\n", "cannot hold a comma"},
		{"not a mapping", "- hub\n", "want a mapping of settings"},
		{"not YAML", "hub: [\n", "config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := effective(t, "--config", writeConfig(t, tc.text))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("config %q: error %v, want one containing %q", tc.text, err, tc.want)
			}
		})
	}
}

func TestCheckConfigExitCodes(t *testing.T) {
	good := writeConfig(t, "node: n1\nstate-dir: "+t.TempDir()+"\n")
	if code := Main([]string{"--config", good, "--check-config"}); code != 0 {
		t.Errorf("--check-config with a good file = %d, want 0", code)
	}
	bad := writeConfig(t, "nodes: n1\n")
	if code := Main([]string{"--config", bad, "--check-config"}); code != 2 {
		t.Errorf("--check-config with an unknown key = %d, want 2", code)
	}
	if code := Main([]string{"--config", filepath.Join(t.TempDir(), "missing.yaml"), "--check-config"}); code != 2 {
		t.Errorf("--check-config with a missing file = %d, want 2", code)
	}
	if code := Main([]string{"--config", writeConfig(t, ""), "--check-config"}); code != 0 {
		t.Errorf("--check-config with an empty file = %d, want 0 (defaults)", code)
	}
}

// install merges a --config file with the flags into the installed config.
func TestInstallCopiesTheConfig(t *testing.T) {
	root := t.TempDir()
	cfg := writeConfig(t, "hub: [h1:7443]\nnode: robot-7\ntoken: abcdef.0123456789abcdef\n")
	var out, errb strings.Builder
	if code := runInstall([]string{"--root", root, "--config", cfg, "--node", "robot-8"}, &out, &errb); code != 0 {
		t.Fatalf("install = %d: %s", code, errb.String())
	}
	unit, _ := os.ReadFile(filepath.Join(root, "etc/systemd/system/drover-agent.service"))
	if !strings.Contains(string(unit), "ExecStart=/usr/local/bin/drover-agent --config=/etc/drover-agent/agent.yaml\n") {
		t.Errorf("unit does not run the agent with the installed config:\n%s", unit)
	}
	path := filepath.Join(root, "etc/drover-agent/agent.yaml")
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("installed config: %v, %v; want mode 600", st, err)
	}
	got, _ := os.ReadFile(path)
	for _, line := range []string{"hub: \"h1:7443\"\n", "node: robot-8\n"} {
		if !strings.Contains(string(got), line) {
			t.Errorf("installed config lacks %q:\n%s", line, got)
		}
	}
	if strings.Contains(string(got), "abcdef") {
		t.Errorf("installed config holds the token (it belongs in agent.env):\n%s", got)
	}
	if env, _ := os.ReadFile(filepath.Join(root, "etc/drover-agent/agent.env")); string(env) != "DROVER_TOKEN=abcdef.0123456789abcdef\n" {
		t.Errorf("agent.env = %q, want the config's token", env)
	}
	if code := runInstall([]string{"--root", t.TempDir(), "--config", writeConfig(t, "hubz: x\n")}, &out, &errb); code != 2 {
		t.Errorf("install with a bad config = %d, want 2", code)
	}
}

// TestBrokerOnlySettings: brokers and no hub (by flag or config file) make
// an agent that registers and works over MQTT only, its hubs the brokers;
// the combinations that cannot work are refused naming the flag.
func TestBrokerOnlySettings(t *testing.T) {
	hubsOf := func(args ...string) ([]string, error) {
		s := newSettings()
		if err := s.fs.Parse(args); err != nil {
			return nil, err
		}
		if s.config != "" {
			if err := s.loadConfig(s.config, s.given()); err != nil {
				return nil, err
			}
		}
		o, err := s.options()
		return o.Hubs, err
	}
	for _, args := range [][]string{
		{"--mqtt-broker", "ssl://a.example.com:8883, ssl://b.example.com:8883"},
		{"--config", writeConfig(t, "mqtt-broker: ssl://a.example.com:8883,ssl://b.example.com:8883\n")},
	} {
		hubs, err := hubsOf(args...)
		if err != nil || len(hubs) != 2 || hubs[0] != "ssl://a.example.com:8883" || hubs[1] != "ssl://b.example.com:8883" {
			t.Errorf("%v: hubs %v (%v), want the two brokers", args, hubs, err)
		}
	}
	if hubs, err := hubsOf("--hub", "h:7443", "--transport", "mqtt", "--mqtt-broker", "ssl://a:8883"); err != nil || len(hubs) != 1 || hubs[0] != "h:7443" {
		t.Errorf("with --hub, the hub stays the hub: %v (%v)", hubs, err)
	}
	for wantErr, args := range map[string][]string{
		"--transport grpc": {"--mqtt-broker", "ssl://a:8883", "--transport", "grpc"},
		"takes one broker": {"--hub", "h:7443", "--transport", "mqtt", "--mqtt-broker", "ssl://a:8883,ssl://b:8883"},
		"--mqtt-broker":    {"--mqtt-broker", "tcp://a:1883"},
	} {
		if _, err := hubsOf(args...); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("%v: %v, want an error naming %q", args, err, wantErr)
		}
	}
}
