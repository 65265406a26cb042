package service

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/drover-fleet/drover/internal/testenv"
)

// This machine's init is not systemd, so the restart behaviour the unit
// asks for is checked with a supervisor that reads the unit's Restart=,
// RestartSec=, RestartPreventExitStatus=, EnvironmentFile= and ExecStart=
// and applies systemd's rules for Restart=on-failure to a real agent.

const (
	// processTimeout bounds a wait on the agent process (start, exit,
	// restart after RestartSec): generous for a loaded machine.
	processTimeout = 60 * time.Second
)

// supervisor runs one unit's ExecStart the way systemd would.
type supervisor struct {
	argv       []string
	env        []string
	restart    string
	restartSec time.Duration
	prevent    map[int]bool
	stateDir   string // the agent's --state-dir

	mu     sync.Mutex
	starts []int // pids, in start order
}

func parseUnit(text string) (*supervisor, error) {
	s := &supervisor{prevent: map[int]bool{}, restart: "no", restartSec: 100 * time.Millisecond}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok || strings.HasPrefix(k, "#") {
			continue
		}
		switch k {
		case "ExecStart":
			argv, err := splitExec(v)
			if err != nil {
				return nil, err
			}
			s.argv = argv
		case "Restart":
			s.restart = v
		case "RestartSec":
			d, err := time.ParseDuration(v)
			if err != nil {
				return nil, fmt.Errorf("RestartSec=%s: %w", v, err)
			}
			s.restartSec = d
		case "RestartPreventExitStatus":
			for f := range strings.FieldsSeq(v) {
				n, err := strconv.Atoi(f)
				if err != nil {
					return nil, fmt.Errorf("RestartPreventExitStatus=%s: %w", v, err)
				}
				s.prevent[n] = true
			}
		case "EnvironmentFile":
			b, err := os.ReadFile(strings.TrimPrefix(v, "-"))
			if err != nil && !(strings.HasPrefix(v, "-") && errors.Is(err, os.ErrNotExist)) {
				return nil, err
			}
			for l := range strings.SplitSeq(string(b), "\n") {
				if strings.Contains(l, "=") {
					s.env = append(s.env, l)
				}
			}
		}
	}
	if len(s.argv) == 0 {
		return nil, errors.New("unit has no ExecStart")
	}
	return s, nil
}

// splitExec undoes quoteArg: whitespace-separated words, double quotes
// with \\ and \" escapes, %% and $$.
func splitExec(line string) ([]string, error) {
	var argv []string
	var cur strings.Builder
	in, word := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case in && c == '\\' && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
		case c == '"':
			in, word = !in, true
		case !in && (c == ' ' || c == '\t'):
			if word {
				argv = append(argv, cur.String())
				cur.Reset()
				word = false
			}
		case (c == '%' || c == '$') && i+1 < len(line) && line[i+1] == c:
			i++
			cur.WriteByte(c)
			word = true
		default:
			cur.WriteByte(c)
			word = true
		}
	}
	if in {
		return nil, fmt.Errorf("ExecStart=%s: unterminated quote", line)
	}
	if word {
		argv = append(argv, cur.String())
	}
	return argv, nil
}

// outcome is how the last run of the process ended.
type outcome struct {
	code   int            // exit code, or -1 when killed by a signal
	signal syscall.Signal // when killed by a signal
}

// failed is systemd's "unclean" exit for Restart=on-failure: a non-zero
// code not listed in RestartPreventExitStatus, or a signal other than
// SIGHUP, SIGINT, SIGTERM and SIGPIPE.
func (s *supervisor) failed(o outcome) bool {
	if o.code >= 0 {
		return o.code != 0 && !s.prevent[o.code]
	}
	switch o.signal {
	case syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM, syscall.SIGPIPE:
		return false
	}
	return true
}

// run starts the process and restarts it as the unit says until it ends
// without a restart or ctx ends (then it stops it, as `systemctl stop`).
func (s *supervisor) run(ctx context.Context, logf func(string, ...any)) (outcome, error) {
	for {
		cmd := exec.Command(s.argv[0], s.argv[1:]...)
		cmd.Env = append(os.Environ(), s.env...)
		if err := cmd.Start(); err != nil {
			return outcome{}, err
		}
		s.mu.Lock()
		s.starts = append(s.starts, cmd.Process.Pid)
		s.mu.Unlock()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		var err error
		select {
		case err = <-done:
		case <-ctx.Done():
			_ = cmd.Process.Signal(syscall.SIGTERM)
			<-done
			return outcome{}, ctx.Err()
		}
		o := outcome{code: 0}
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			ws := ee.Sys().(syscall.WaitStatus)
			if ws.Signaled() {
				o = outcome{code: -1, signal: ws.Signal()}
			} else {
				o.code = ws.ExitStatus()
			}
		} else if err != nil {
			return o, err
		}
		if s.restart != "on-failure" || !s.failed(o) {
			logf("supervisor: pid %d ended (%+v); not restarting", cmd.Process.Pid, o)
			return o, nil
		}
		logf("supervisor: pid %d failed (%+v); restarting in %s", cmd.Process.Pid, o, s.restartSec)
		select {
		case <-time.After(s.restartSec):
		case <-ctx.Done():
			return o, ctx.Err()
		}
	}
}

func (s *supervisor) pids() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int(nil), s.starts...)
}

// caFile writes a self-signed CA certificate: the agent needs one to try to
// register, which it then does for ever against a hub that is not there.
func caFile(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// installed installs the real agent under a temp root with the given flags
// and returns its unit, ready for the supervisor.
func installed(t *testing.T, token string, args ...string) *supervisor {
	t.Helper()
	root := t.TempDir()
	// The settings go into the config file, as `drover-agent install` writes them.
	var cfg strings.Builder
	for _, a := range append([]string{"--state-dir=" + filepath.Join(root, "state")}, args...) {
		k, v, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		fmt.Fprintf(&cfg, "%s: %q\n", k, v)
	}
	o := Options{Binary: testenv.Binary(t, "./cmd/drover-agent"), Token: token,
		BinDir: filepath.Join(root, "bin"), UnitDir: filepath.Join(root, "units"), ConfigDir: filepath.Join(root, "etc"),
		StateDir: filepath.Join(root, "state"), Config: []byte(cfg.String())}
	if err := Install(context.Background(), o); err != nil {
		t.Fatalf("Install() = %v", err)
	}
	// Every dir is under root already, so Root stays "/" and the unit's
	// paths are real; without Systemctl nothing asks systemd.
	unit, err := os.ReadFile(filepath.Join(o.UnitDir, UnitName))
	if err != nil {
		t.Fatal(err)
	}
	s, err := parseUnit(string(unit))
	if err != nil {
		t.Fatalf("parse unit: %v\n%s", err, unit)
	}
	s.restartSec = min(s.restartSec, 5*time.Second) // the unit's own, kept unless it grows
	s.stateDir = o.StateDir
	return s
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(processTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", processTimeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// A crash (SIGKILL: what a failed self-upgrade or an OOM kill looks like)
// brings the agent back; a clean stop (SIGTERM) does not.
func TestUnitRestartsACrashedAgentNotAStoppedOne(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds and runs the real agent")
	}
	s := installed(t, "abcdef.0123456789abcdef", "--node=svc-test", "--hub="+closedAddr(t), "--ca-file="+caFile(t), "--cgroups=off")
	ctx, cancel := context.WithTimeout(context.Background(), 4*processTimeout)
	defer cancel()
	type result struct {
		o   outcome
		err error
	}
	ended := make(chan result, 1)
	go func() {
		o, err := s.run(ctx, t.Logf)
		ended <- result{o, err}
	}()
	var first int
	waitUntil(t, "the agent to start", func() bool { p := s.pids(); return len(p) == 1 && alive(p[0]) })
	first = s.pids()[0]
	// Its database open means it runs, trying to register.
	waitUntil(t, "the agent to open its database", func() bool {
		_, err := os.Stat(filepath.Join(s.stateDir, "agent.db"))
		return err == nil
	})
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "a restart after SIGKILL", func() bool { p := s.pids(); return len(p) == 2 && alive(p[1]) })
	second := s.pids()[1]
	// A SIGTERM before the agent's handler is installed kills it by the
	// signal, which systemd also counts as clean: no wait needed here.
	if err := syscall.Kill(second, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-ended:
	case <-time.After(processTimeout):
		t.Fatalf("the supervisor still runs %s after SIGTERM to the agent; pids %v", processTimeout, s.pids())
	}
	if r.err != nil {
		t.Fatalf("supervisor: %v", r.err)
	}
	if s.failed(r.o) {
		t.Errorf("agent stopped by SIGTERM ended %+v: an unclean exit, which systemd would restart", r.o)
	}
	if n := len(s.pids()); n != 2 {
		t.Errorf("agent started %d times, want 2 (start, restart after the crash)", n)
	}
}

// Exit codes that starting again cannot fix end the service.
func TestUnitDoesNotRestartUsageOrFatalErrors(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds and runs the real agent")
	}
	for _, tc := range []struct {
		name  string
		token string
		args  []string
		code  int
	}{
		{"bad flag value", "t", []string{"--cgroups=maybe"}, 2},
		{"no identity and no token", "", []string{"--node=svc-test", "--hub=" + closedAddr(t), "--cgroups=off"}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := installed(t, tc.token, tc.args...)
			ctx, cancel := context.WithTimeout(context.Background(), 2*processTimeout)
			defer cancel()
			o, err := s.run(ctx, t.Logf)
			if err != nil {
				t.Fatalf("supervisor: %v", err)
			}
			if o.code != tc.code {
				t.Errorf("agent exited %+v, want code %d", o, tc.code)
			}
			if n := len(s.pids()); n != 1 {
				t.Errorf("agent started %d times, want 1: exit %d must not be restarted", n, tc.code)
			}
		})
	}
}

func TestSplitExecUndoesQuoteArg(t *testing.T) {
	args := []string{"/bin/x", "--labels=room=2 b", `a"b`, `c\d`, "100%", "$HOME", ";", ""}
	var q []string
	for _, a := range args {
		s, err := quoteArg(a)
		if err != nil {
			t.Fatal(err)
		}
		q = append(q, s)
	}
	got, err := splitExec(strings.Join(q, " "))
	if err != nil || strings.Join(got, "|") != strings.Join(args, "|") {
		t.Errorf("splitExec(quoted) = %q, %v; want %q", got, err, args)
	}
}

// A self-upgrade whose new binary crashes at start: the unit keeps starting
// it (the agent cannot roll back from a process that never runs), and once
// the old binary is back in place (the upgrade flow's backup, renamed back
// as its rollback does) the next restart runs the agent again.
func TestUnitBringsBackACrashingUpgrade(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds and runs the real agent")
	}
	crasher, err := exec.LookPath("false")
	if err != nil {
		t.Skip("no `false` binary to stand in for a crashing agent")
	}
	s := installed(t, "abcdef.0123456789abcdef", "--node=svc-test", "--hub="+closedAddr(t), "--ca-file="+caFile(t), "--cgroups=off")
	s.restartSec = 500 * time.Millisecond // the unit's 5s, shortened: the rules are what is tested
	bin := s.argv[0]
	ctx, cancel := context.WithTimeout(context.Background(), 4*processTimeout)
	type result struct {
		o   outcome
		err error
	}
	ended, stopped := make(chan result, 1), make(chan struct{})
	defer func() {
		cancel()
		<-stopped // no t.Logf from the supervisor after the test
	}()
	go func() {
		defer close(stopped)
		o, err := s.run(ctx, t.Logf)
		ended <- result{o, err}
	}()
	waitUntil(t, "the agent to open its database", func() bool {
		_, err := os.Stat(filepath.Join(s.stateDir, "agent.db"))
		return err == nil && len(s.pids()) == 1
	})
	// The swap, as the upgrade does it: the old binary kept as a backup,
	// the new one renamed over the installed path.
	backup := filepath.Join(t.TempDir(), "drover-agent.backup")
	if err := os.Link(bin, backup); err != nil {
		t.Fatal(err)
	}
	crash, err := os.ReadFile(crasher)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeFile(bin, crash, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(s.pids()[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the crashing binary to be started again", func() bool { return len(s.pids()) >= 3 })
	if err := os.Rename(backup, bin); err != nil { // the rollback
		t.Fatal(err)
	}
	agentBin, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	var back int
	waitUntil(t, "the restored agent to run again", func() bool {
		p := s.pids()
		back = p[len(p)-1]
		exe, err := os.Stat(fmt.Sprintf("/proc/%d/exe", back))
		return err == nil && os.SameFile(exe, agentBin)
	})
	if err := syscall.Kill(back, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-ended:
	case <-time.After(processTimeout):
		t.Fatalf("the supervisor still runs %s after SIGTERM to the agent; pids %v", processTimeout, s.pids())
	}
	if r.err != nil || s.failed(r.o) {
		t.Errorf("the restored agent, stopped by SIGTERM, ended %+v, %v: want a clean stop", r.o, r.err)
	}
}
