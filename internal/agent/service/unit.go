package service

import (
	"fmt"
	"strings"
)

// UnitName is the systemd unit the agent is installed as.
const UnitName = "drover-agent.service"

// UnitConfig is what the unit file says.
type UnitConfig struct {
	// ExecStart is the agent's argv: the installed binary, then its flags.
	ExecStart []string
	// EnvironmentFile holds DROVER_TOKEN (only needed to register). It is
	// optional in the unit ("-" prefix): an agent with an identity has none.
	EnvironmentFile string
	// ReadWritePaths are writable although ProtectSystem makes /usr and /etc
	// read-only: the binary's directory, so that a self-upgrade can swap it.
	ReadWritePaths []string
}

// Unit renders the unit file. The hardening keeps what the agent needs: it
// runs as root to start tasks as other users (setuid/setgid) and creates
// cgroups for them (Delegate=yes, no ProtectControlGroups), and task
// processes outlive an agent restart (KillMode=process), so upgrades and
// crashes do not stop the fleet's work.
func Unit(c UnitConfig) (string, error) {
	if len(c.ExecStart) == 0 {
		return "", fmt.Errorf("unit: ExecStart is empty")
	}
	argv := make([]string, len(c.ExecStart))
	for i, a := range c.ExecStart {
		q, err := quoteArg(a)
		if err != nil {
			return "", fmt.Errorf("unit: ExecStart argument %d: %w", i, err)
		}
		argv[i] = q
	}
	var b strings.Builder
	w := func(s ...string) {
		for _, l := range s {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	w("# Written by `drover-agent install`; `drover-agent uninstall` removes it.",
		"# Settings are in the --config file (/etc/drover-agent/agent.yaml); edit it",
		"# and `systemctl restart drover-agent`, or install again.",
		"[Unit]",
		"Description=Drover agent",
		"Documentation=https://github.com/drover-fleet/drover/blob/main/docs/operate.md",
		"Wants=network-online.target",
		"After=network-online.target",
		"# A crash loop keeps being retried (every 5 s): the hub may come back.",
		"StartLimitIntervalSec=0",
		"",
		"[Service]",
		"Type=simple",
		"ExecStart="+strings.Join(argv, " "))
	if c.EnvironmentFile != "" {
		q, err := quotePath(c.EnvironmentFile)
		if err != nil {
			return "", fmt.Errorf("unit: EnvironmentFile: %w", err)
		}
		w("EnvironmentFile=-" + q)
	}
	w("# Restart after a crash or a failed self-upgrade, not after a clean stop",
		"# nor after exit 2 (bad flags) or 3 (refused: bad token, revoked node),",
		"# which starting again cannot fix.",
		"Restart=on-failure",
		"RestartSec=5s",
		"RestartPreventExitStatus=2 3",
		"# Stop the agent only: its tasks run on and a new agent takes them over.",
		"KillMode=process",
		"TimeoutStopSec=30s",
		"# The agent creates a cgroup per task attempt under its own.",
		"Delegate=yes",
		"LimitNOFILE=65536",
		"# Hardening that still lets it start tasks as other users (root with",
		"# CAP_SETUID/CAP_SETGID) and write cgroups (no ProtectControlGroups).",
		"ProtectSystem=full",
	)
	for _, p := range c.ReadWritePaths {
		q, err := quotePath(p)
		if err != nil {
			return "", fmt.Errorf("unit: ReadWritePaths: %w", err)
		}
		w("ReadWritePaths=" + q)
	}
	// Not set, on purpose: PrivateTmp, ProtectClock (its device allow-list
	// would hide /dev from tasks: serial ports, GPUs), RestrictRealtime
	// (robot control loops), NoNewPrivileges and ProtectHome (tasks that
	// use setuid tools or home dirs) and UMask (tasks inherit it).
	w("ProtectKernelModules=yes",
		"ProtectKernelLogs=yes",
		"RestrictSUIDSGID=yes",
		"LockPersonality=yes",
		"SystemCallArchitectures=native",
		"",
		"[Install]",
		"WantedBy=multi-user.target")
	return b.String(), nil
}

// quoteArg quotes one ExecStart argument so that systemd passes it through
// unchanged: no shell is involved, but systemd splits on whitespace,
// unquotes, and expands % specifiers and $ variables.
func quoteArg(a string) (string, error) {
	if err := checkChars(a); err != nil {
		return "", err
	}
	a = strings.ReplaceAll(a, "%", "%%")
	a = strings.ReplaceAll(a, "$", "$$")
	if a != "" && !strings.ContainsAny(a, " \t\"'\\;") {
		return a, nil
	}
	a = strings.ReplaceAll(a, `\`, `\\`)
	a = strings.ReplaceAll(a, `"`, `\"`)
	return `"` + a + `"`, nil
}

// quotePath is for settings that take one absolute path.
func quotePath(p string) (string, error) {
	if err := checkChars(p); err != nil {
		return "", err
	}
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("%q: want an absolute path", p)
	}
	if strings.ContainsAny(p, " \t\"'\\%$") {
		return "", fmt.Errorf("%q: want a path without spaces, quotes, backslashes, %% or $", p)
	}
	return p, nil
}

func checkChars(s string) error {
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%q holds a control character, which a unit file cannot carry", s)
		}
	}
	return nil
}
