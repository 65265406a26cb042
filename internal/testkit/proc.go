package testkit

import (
	"bytes"
	"context"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Proc is a child process of a test whose output (stdout and stderr) is
// kept, to wait for its lines and to show its last ones when the test
// fails.
type Proc struct {
	Name string
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
}

// StartProc runs bin with args. When t ends it is stopped, SIGTERM then
// SIGKILL after 30 s, and if t failed its last 40 lines are logged.
func StartProc(t testing.TB, name, bin string, args ...string) *Proc {
	t.Helper()
	p := &Proc{Name: name, cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("--- %s %s, last lines:\n%s", name, strings.Join(args, " "), LastLines(p.Output(), 40))
		}
	})
	return p
}

// Write implements io.Writer for the process's output.
func (p *Proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

// Output is everything the process printed so far.
func (p *Proc) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// WaitLine waits up to within for a line matching re and returns its
// submatches; it fails t at once if the process exits first.
func (p *Proc) WaitLine(t testing.TB, re *regexp.Regexp, within time.Duration) []string {
	t.Helper()
	var m []string
	exited := false
	Wait(context.Background(), within, func() string {
		for line := range strings.SplitSeq(p.Output(), "\n") {
			if m = re.FindStringSubmatch(line); m != nil {
				return ""
			}
		}
		select {
		case <-p.done:
			exited = true
			return ""
		default:
		}
		return "not printed"
	})
	switch {
	case m != nil:
		return m
	case exited:
		t.Fatalf("%s exited before printing %q:\n%s", p.Name, re, LastLines(p.Output(), 40))
	default:
		t.Fatalf("%s did not print %q within %s:\n%s", p.Name, re, within, LastLines(p.Output(), 40))
	}
	return nil
}

// LastLines is the last n lines of s.
func LastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// GrepLines is the lines of s that match re.
func GrepLines(s string, re *regexp.Regexp) string {
	var out []string
	for line := range strings.SplitSeq(s, "\n") {
		if re.MatchString(line) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
