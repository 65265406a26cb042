package cmd

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/drover-fleet/drover/internal/agent/service"
)

// installFlags are install's and uninstall's own flags, beside the agent's.
type installFlags struct {
	dryRun, noStart, purge bool
	root, binDir, unitDir  string
	configDir              string
}

func (f *installFlags) register(fs *flag.FlagSet, install bool) {
	fs.BoolVar(&f.dryRun, "dry-run", false, "print what would be done (and the unit) and do nothing")
	fs.StringVar(&f.root, "root", "/", "write every file under this directory instead of / (an image root); systemctl is not run then")
	fs.StringVar(&f.binDir, "bin-dir", service.DefaultBinDir, "directory the agent binary is installed in")
	fs.StringVar(&f.unitDir, "unit-dir", service.DefaultUnitDir, "directory of the systemd unit")
	fs.StringVar(&f.configDir, "config-dir", service.DefaultConfigDir, "directory of the agent's environment file (the bootstrap token) and config")
	if install {
		fs.BoolVar(&f.noStart, "no-start", false, "enable the unit but do not start it now")
	} else {
		fs.BoolVar(&f.purge, "purge", false, "also remove the state dir (the node's identity: it must register again), the work dir and the config dir")
	}
}

func (f *installFlags) options(stdout io.Writer) service.Options {
	o := service.Options{
		Root: f.root, BinDir: f.binDir, UnitDir: f.unitDir, ConfigDir: f.configDir,
		NoStart: f.noStart, Purge: f.purge, DryRun: f.dryRun, Out: stdout,
	}
	if f.root == "/" {
		if p, err := exec.LookPath("systemctl"); err == nil {
			o.Systemctl = p
		}
	}
	return o
}

// runInstall is `drover-agent install [install flags] [agent flags]`. The
// agent's settings (the flags given, over those of a --config file) are
// checked as the agent would check them and written to the installed
// config file, which is all ExecStart passes: one place to edit, and no
// setting is spliced into a command line. The bootstrap token (--token, the
// file's token, or $DROVER_TOKEN) goes into a 0600 environment file instead.
func runInstall(args []string, stdout, stderr io.Writer) int {
	s := newSettings()
	s.fs.Init("drover-agent install", flag.ContinueOnError)
	s.fs.SetOutput(stderr)
	var inf installFlags
	inf.register(s.fs, true)
	if err := s.fs.Parse(args); err != nil {
		return exitUsage
	}
	if s.fs.NArg() > 0 {
		fmt.Fprintf(stderr, "drover-agent install: unexpected argument %q (flags only)\n", s.fs.Arg(0))
		return exitUsage
	}
	if s.version || s.checkConfig {
		fmt.Fprintln(stderr, "drover-agent install: --version and --check-config are not agent settings")
		return exitUsage
	}
	if s.config != "" {
		// Checked now, so that a bad file fails the install, not the service.
		if err := s.loadConfig(s.config, s.given()); err != nil {
			fmt.Fprintf(stderr, "drover-agent install: %v\n", err)
			return exitUsage
		}
	}
	if _, err := s.options(); err != nil {
		fmt.Fprintf(stderr, "drover-agent install: %v\n", err)
		return exitUsage
	}
	o := inf.options(stdout)
	cfg, err := s.installConfig(&o)
	if err != nil {
		fmt.Fprintf(stderr, "drover-agent install: %v\n", err)
		return exitUsage
	}
	o.Config = cfg
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := service.Install(ctx, o); err != nil {
		fmt.Fprintf(stderr, "drover-agent install: %v\n", err)
		return exitError
	}
	return exitOK
}

// installConfig is the config file install writes: every setting given
// (on the command line or in the --config file), paths made absolute, the
// token left out (o.Token gets it). It sets o's state and work dirs.
func (s *settings) installConfig(o *service.Options) ([]byte, error) {
	own := map[string]bool{}
	installOnly := flag.NewFlagSet("", flag.ContinueOnError)
	new(installFlags).register(installOnly, true)
	installOnly.VisitAll(func(f *flag.Flag) { own[f.Name] = true })
	var b strings.Builder
	b.WriteString("# drover-agent settings, written by `drover-agent install`. Keys are the\n" +
		"# agent's flag names without --; `drover-agent --check-config --config FILE`\n" +
		"# checks an edited file. The bootstrap token lives in agent.env (0600).\n")
	var bad error
	s.fs.Visit(func(f *flag.Flag) {
		if own[f.Name] || notConfig[f.Name] || bad != nil {
			return
		}
		v := f.Value.String()
		switch f.Name {
		case "token":
			o.Token = v
			return
		case "state-dir", "work-dir", "ca-file":
			abs, err := filepath.Abs(v)
			if err != nil {
				bad = fmt.Errorf("--%s: %w", f.Name, err)
				return
			}
			v = abs
			if f.Name == "state-dir" {
				o.StateDir = abs
			} else if f.Name == "work-dir" {
				o.WorkDir = abs
			}
		}
		fmt.Fprintf(&b, "%s: %s\n", f.Name, yamlScalar(v))
	})
	if o.Token == "" && s.o.BootstrapToken != "" {
		o.Token = s.o.BootstrapToken // from $DROVER_TOKEN
	}
	return []byte(b.String()), bad
}

// runUninstall is `drover-agent uninstall [--purge] [--state-dir DIR] ...`.
func runUninstall(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("drover-agent uninstall", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var inf installFlags
	inf.register(fs, false)
	var stateDir, workDir string
	fs.StringVar(&stateDir, "state-dir", service.DefaultStateDir, "the agent's state dir (removed with --purge)")
	fs.StringVar(&workDir, "work-dir", "", "the agent's work dir (removed with --purge); default: the state dir + \"-work\"")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "drover-agent uninstall: unexpected argument %q (flags only)\n", fs.Arg(0))
		return exitUsage
	}
	o := inf.options(stdout)
	o.StateDir, o.WorkDir = stateDir, workDir
	if !flagGiven(fs, "state-dir") && !flagGiven(fs, "work-dir") {
		// The installed config says where the agent keeps its state.
		installed := filepath.Join(o.Root, o.ConfigFilePath())
		if _, err := os.Stat(installed); err == nil {
			cs := newSettings()
			if err := cs.loadConfig(installed, nil); err != nil {
				fmt.Fprintf(stderr, "drover-agent uninstall: %v (give --state-dir and --work-dir)\n", err)
				return exitUsage
			}
			o.StateDir, o.WorkDir = cs.o.StateDir, cs.o.WorkDir
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := service.Uninstall(ctx, o); err != nil {
		fmt.Fprintf(stderr, "drover-agent uninstall: %v\n", err)
		return exitError
	}
	return exitOK
}

func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}
