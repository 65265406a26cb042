// Package benchproc runs a benchmark's processes and reads their resource
// use and Prometheus metrics, for the commands under bench/.
package benchproc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is a child process whose output lines are logged to a file and
// offered to a watcher.
type Proc struct {
	name string
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
	err  error

	mu    sync.Mutex
	lines []string // lines not yet consumed by waitLine
	stat  map[string]string
	wake  chan struct{}
}

// Start starts bin with args; stdout and stderr go to <dir>/<name>.log.
func Start(dir, name, bin string, args ...string) (*Proc, error) {
	f, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	// Die with the runner, whatever happens to it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	p := &Proc{name: name, cmd: cmd, log: f, done: make(chan struct{}), wake: make(chan struct{}, 1)}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.scan(stdout) }()
	go func() { defer wg.Done(); p.scan(stderr) }()
	go func() {
		wg.Wait()
		p.err = cmd.Wait()
		close(p.done)
		p.poke()
	}()
	return p, nil
}

func (p *Proc) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *Proc) scan(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		p.mu.Lock()
		fmt.Fprintln(p.log, line)
		if rest, ok := strings.CutPrefix(line, "stat "); ok {
			m := map[string]string{}
			for kv := range strings.FieldsSeq(rest) {
				if k, v, ok := strings.Cut(kv, "="); ok {
					m[k] = v
				}
			}
			p.stat = m
		} else if len(p.lines) < 1000 {
			p.lines = append(p.lines, line)
		}
		p.mu.Unlock()
		p.poke()
	}
}

// WaitLine returns the rest of the first output line starting with prefix.
func (p *Proc) WaitLine(ctx context.Context, prefix string, timeout time.Duration) (string, error) {
	deadline := time.After(timeout)
	for {
		p.mu.Lock()
		for _, l := range p.lines {
			if rest, ok := strings.CutPrefix(l, prefix); ok {
				p.mu.Unlock()
				return strings.TrimSpace(rest), nil
			}
		}
		p.mu.Unlock()
		select {
		case <-p.done:
			return "", fmt.Errorf("%s exited (%v) before printing %q; see %s", p.name, p.err, prefix, p.log.Name())
		case <-deadline:
			return "", fmt.Errorf("%s did not print %q within %v; see %s", p.name, prefix, timeout, p.log.Name())
		case <-ctx.Done():
			return "", ctx.Err()
		case <-p.wake:
		}
	}
}

// StatInt is field k of the last stat line (0 if none).
func (p *Proc) StatInt(k string) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	v, _ := strconv.ParseFloat(p.stat[k], 64)
	return int64(v)
}

func (p *Proc) StatFloat(k string) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	v, _ := strconv.ParseFloat(p.stat[k], 64)
	return v
}

func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Stop sends SIGTERM, then SIGKILL after grace.
func (p *Proc) Stop(grace time.Duration) {
	if p == nil {
		return
	}
	if !p.Exited() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	p.mu.Lock()
	_ = p.log.Close()
	p.mu.Unlock()
}

// Usage is one reading of a process's memory and CPU time.
type Usage struct {
	RSSKiB, HWMKiB   int64
	AnonKiB, FileKiB int64         // RssAnon (heap, stacks) and RssFile (mapped binary pages)
	CPU              time.Duration // utime + stime
	At               time.Time
}

// clockTick is USER_HZ, 100 on Linux for every architecture Go supports.
const clockTick = 100

func ReadUsage(pid int) (Usage, error) {
	u := Usage{At: time.Now()}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, err
	}
	for line := range strings.SplitSeq(string(st), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		switch k {
		case "VmRSS":
			u.RSSKiB = n
		case "VmHWM":
			u.HWMKiB = n
		case "RssAnon":
			u.AnonKiB = n
		case "RssFile":
			u.FileKiB = n
		}
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return u, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return u, errors.New("malformed /proc/pid/stat")
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return u, errors.New("short /proc/pid/stat")
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	stt, _ := strconv.ParseInt(f[12], 10, 64)
	u.CPU = time.Duration(ut+stt) * time.Second / clockTick
	return u, nil
}

// CPUPercent is the CPU used between a and b, in percent of one core.
func CPUPercent(a, b Usage) float64 {
	wall := b.At.Sub(a.At)
	if wall <= 0 {
		return 0
	}
	return 100 * float64(b.CPU-a.CPU) / float64(wall)
}

// LogPath is the file holding the process's output.
func (p *Proc) LogPath() string { return p.log.Name() }

// Name is the name the process was started with.
func (p *Proc) Name() string { return p.name }

// ExitErr describes how an exited process ended ("" while it runs).
func (p *Proc) ExitErr() string {
	if !p.Exited() {
		return ""
	}
	return fmt.Sprint(p.err)
}
