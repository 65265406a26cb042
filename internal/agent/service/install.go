package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Default paths (the layout docs/operate.md describes).
const (
	DefaultBinDir    = "/usr/local/bin"
	DefaultUnitDir   = "/etc/systemd/system"
	DefaultConfigDir = "/etc/drover-agent"
	DefaultStateDir  = "/var/lib/drover-agent"
	// EnvFileName, under the config dir, holds DROVER_TOKEN; mode 0600.
	EnvFileName = "agent.env"
	// ConfigFileName, under the config dir, is the agent's config file.
	ConfigFileName = "agent.yaml"
	binaryName     = "drover-agent"
)

// Options say what to install and where. Paths are as on the target
// machine; Root prefixes each one when files are written.
type Options struct {
	// Binary is the agent binary to copy. Default: the running executable.
	Binary string
	// Args are the agent's flags for ExecStart (after the binary). They
	// must not hold the bootstrap token: use Token.
	Args []string
	// Token, when set, is written to the environment file (0600) as
	// DROVER_TOKEN, not into the world-readable unit.
	Token string
	// Config, when set, is the agent's config file (YAML), written to
	// ConfigFilePath (0600), and ExecStart gets --config with it.
	Config []byte
	// StateDir is created 0700. Default DefaultStateDir.
	StateDir string
	// WorkDir, when set, is created 0711 (uninstall --purge removes it).
	// Default: StateDir + "-work", as the agent's own default.
	WorkDir string
	// BinDir default DefaultBinDir; UnitDir DefaultUnitDir; ConfigDir
	// DefaultConfigDir.
	BinDir, UnitDir, ConfigDir string
	// Root is prepended to every path written (an image root, a test dir).
	// Default "/". systemctl is not run under a Root other than "/".
	Root string
	// Systemctl is the systemctl binary. Empty: systemd is not asked to
	// load the unit; the commands to run are printed instead.
	Systemctl string
	// NoStart only enables the unit; it does not start it now.
	NoStart bool
	// Purge (uninstall) also removes the state, work and config dirs.
	Purge bool
	// DryRun prints what would be done and does nothing.
	DryRun bool
	// Out receives the steps as they are done (or, with DryRun, planned).
	Out io.Writer
}

func (o *Options) defaults() error {
	if o.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find the running binary to install: %w", err)
		}
		o.Binary = exe
	}
	if o.StateDir == "" {
		o.StateDir = DefaultStateDir
	}
	if o.WorkDir == "" {
		o.WorkDir = o.StateDir + "-work"
	}
	if o.BinDir == "" {
		o.BinDir = DefaultBinDir
	}
	if o.UnitDir == "" {
		o.UnitDir = DefaultUnitDir
	}
	if o.ConfigDir == "" {
		o.ConfigDir = DefaultConfigDir
	}
	if o.Root == "" {
		o.Root = "/"
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	for name, p := range map[string]string{"state dir": o.StateDir, "work dir": o.WorkDir, "bin dir": o.BinDir, "unit dir": o.UnitDir, "config dir": o.ConfigDir} {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("%s %q: want an absolute path (as on the machine)", name, p)
		}
	}
	if strings.ContainsAny(o.Token, "\n\r\x00") {
		return errors.New("token: holds a line break")
	}
	return nil
}

// BinaryPath is where the agent binary is installed.
func (o *Options) BinaryPath() string { return filepath.Join(o.BinDir, binaryName) }

// UnitPath is where the unit file is written.
func (o *Options) UnitPath() string { return filepath.Join(o.UnitDir, UnitName) }

// ConfigFilePath is where ConfigFile is installed.
func (o *Options) ConfigFilePath() string { return filepath.Join(o.ConfigDir, ConfigFileName) }

// EnvFilePath is the environment file with the token.
func (o *Options) EnvFilePath() string { return filepath.Join(o.ConfigDir, EnvFileName) }

func (o *Options) real(p string) string { return filepath.Join(o.Root, p) }

// step is one thing install or uninstall does.
type step struct {
	what string
	do   func(ctx context.Context) error
}

// run does the steps in order, or with DryRun only prints them.
func run(ctx context.Context, o *Options, steps []step) error {
	for _, s := range steps {
		if o.DryRun {
			fmt.Fprintf(o.Out, "would %s\n", s.what)
			continue
		}
		if err := s.do(ctx); err != nil {
			return fmt.Errorf("%s: %w", s.what, err)
		}
		fmt.Fprintf(o.Out, "%s: done\n", s.what)
	}
	return nil
}

// Install copies the binary, creates the state dir, writes the token's
// environment file and the unit, and asks systemd to enable and start it.
// Running it again updates everything in place.
func Install(ctx context.Context, o Options) error {
	if err := o.defaults(); err != nil {
		return err
	}
	argv := append([]string{o.BinaryPath()}, o.Args...)
	if o.Config != nil {
		argv = append(argv, "--config="+o.ConfigFilePath())
	}
	unit, err := Unit(UnitConfig{
		ExecStart:       argv,
		EnvironmentFile: o.EnvFilePath(),
		ReadWritePaths:  []string{o.BinDir},
	})
	if err != nil {
		return err
	}
	steps := []step{
		{"install " + o.Binary + " as " + o.BinaryPath() + " (0755)", func(context.Context) error {
			return copyFile(o.Binary, o.real(o.BinaryPath()), 0o755)
		}},
		{"create the state dir " + o.StateDir + " (0700)", func(context.Context) error {
			return mkdir(o.real(o.StateDir), 0o700)
		}},
		{"create the config dir " + o.ConfigDir + " (0755)", func(context.Context) error {
			return mkdir(o.real(o.ConfigDir), 0o755)
		}},
	}
	if o.Config != nil {
		steps = append(steps, step{"write the config " + o.ConfigFilePath() + " (0600)", func(context.Context) error {
			return writeFile(o.real(o.ConfigFilePath()), o.Config, 0o600)
		}})
	}
	if o.Token != "" {
		steps = append(steps, step{"write the bootstrap token to " + o.EnvFilePath() + " (0600)", func(context.Context) error {
			return writeFile(o.real(o.EnvFilePath()), []byte("DROVER_TOKEN="+o.Token+"\n"), 0o600)
		}})
	}
	steps = append(steps, step{"write the unit " + o.UnitPath() + " (0644)", func(context.Context) error {
		return writeFile(o.real(o.UnitPath()), []byte(unit), 0o644)
	}})
	enable := []string{"enable", "--now", UnitName}
	if o.NoStart {
		enable = []string{"enable", UnitName}
	}
	steps = append(steps, o.systemctl([]string{"daemon-reload"}, enable)...)
	if o.DryRun {
		if o.Config != nil {
			fmt.Fprintf(o.Out, "config %s:\n%s", o.ConfigFilePath(), o.Config)
		}
		fmt.Fprintf(o.Out, "unit %s:\n%s", o.UnitPath(), unit)
	}
	return run(ctx, &o, steps)
}

// Uninstall stops and disables the unit and removes it and the binary. The
// state dir (the node's identity and database), the work dir and the config
// dir stay unless Purge.
func Uninstall(ctx context.Context, o Options) error {
	if err := o.defaults(); err != nil {
		return err
	}
	steps := o.systemctl([]string{"disable", "--now", UnitName})
	steps = append(steps,
		step{"remove the unit " + o.UnitPath(), func(context.Context) error { return remove(o.real(o.UnitPath())) }},
	)
	steps = append(steps, o.systemctl([]string{"daemon-reload"})...)
	steps = append(steps,
		step{"remove the binary " + o.BinaryPath(), func(context.Context) error { return remove(o.real(o.BinaryPath())) }},
	)
	if o.Purge {
		for _, d := range []string{o.StateDir, o.WorkDir, o.ConfigDir} {
			steps = append(steps, step{"remove " + d + " and everything in it", func(context.Context) error {
				return os.RemoveAll(o.real(d))
			}})
		}
	} else {
		fmt.Fprintf(o.Out, "keeping %s, %s and %s (the node's identity, work and config); --purge removes them\n", o.StateDir, o.WorkDir, o.ConfigDir)
	}
	return run(ctx, &o, steps)
}

// systemctl returns a step per command, or, without systemctl (or under
// another Root), one step that prints the commands to run.
func (o *Options) systemctl(cmds ...[]string) []step {
	if o.Systemctl == "" || o.Root != "/" {
		var lines []string
		for _, c := range cmds {
			lines = append(lines, "systemctl "+strings.Join(c, " "))
		}
		return []step{{"leave to you (no systemctl here): " + strings.Join(lines, "; "), func(context.Context) error { return nil }}}
	}
	var steps []step
	for _, c := range cmds {
		steps = append(steps, step{"run systemctl " + strings.Join(c, " "), func(ctx context.Context) error {
			out, err := exec.CommandContext(ctx, o.Systemctl, c...).CombinedOutput()
			if err != nil {
				return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out)))
			}
			return nil
		}})
	}
	return steps
}

func mkdir(dir string, mode fs.FileMode) error {
	if err := os.MkdirAll(dir, mode); err != nil {
		return err
	}
	return os.Chmod(dir, mode) // MkdirAll leaves an existing dir's mode and applies the umask
}

// writeFile replaces path atomically: a reader (systemd) never sees half a file.
func writeFile(path string, data []byte, mode fs.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after the rename: nothing left behind
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// copyFile installs src as dst by rename, so a running agent at dst keeps
// its old file open and a reinstall over it works ("text file busy" is
// only for writes in place).
func copyFile(src, dst string, mode fs.FileMode) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	same, err := sameFile(src, dst)
	if err != nil || same {
		return err
	}
	return writeFile(dst, data, mode)
}

func sameFile(a, b string) (bool, error) {
	sa, err := os.Stat(a)
	if err != nil {
		return false, err
	}
	sb, err := os.Stat(b)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return os.SameFile(sa, sb), nil
}

func remove(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
