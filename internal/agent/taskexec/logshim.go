package taskexec

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
)

// LogShimArg is the hidden first argument with which drover-agent runs as
// an attempt's log shim (see the package doc, "Logs"). A binary that runs
// a Driver calls RunLogShim when its first argument is LogShimArg: the
// driver starts the shim by re-executing itself (/proc/self/exe).
const LogShimArg = "__drover-log-shim"

// The shim's descriptors: the read ends of the task's stdout and stderr.
const (
	shimStdoutFD = 3
	shimStderrFD = 4
)

// RunLogShim is the log shim: args (after LogShimArg) are the bound in
// bytes and the log dir. It copies descriptor 3 to <dir>/stdout.log and 4
// to <dir>/stderr.log, rotating a file to <name>.1 before a write would
// take it past the bound, and returns 0 once both reached EOF: every
// process that held the task's ends has ended or closed them.
func RunLogShim(args []string) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "drover-agent log shim: "+format+"\n", a...)
		return 2
	}
	if len(args) != 2 {
		return fail("want <max bytes> <log dir>, got %q", args)
	}
	limit, err := strconv.ParseInt(args[0], 10, 64)
	if err != nil || limit <= 0 {
		return fail("max bytes %q: want a positive number", args[0])
	}
	dir := args[1]
	// Its stderr is the agent's, which may be a pipe whose reader is gone
	// (the agent restarted): a report of a write error must not kill it.
	// It has no terminal (its own session), so SIGHUP only comes from kill.
	signal.Ignore(syscall.SIGPIPE, syscall.SIGHUP)
	var wg sync.WaitGroup
	for fd, name := range map[int]string{shimStdoutFD: StdoutFile, shimStderrFD: StderrFile} {
		r := os.NewFile(uintptr(fd), name)
		wg.Go(func() {
			defer r.Close()
			copyLog(r, &logWriter{name: filepath.Join(dir, name), max: limit})
		})
	}
	wg.Wait()
	return 0
}

// copyLog copies r to w until r's EOF. A write that fails (a full disk)
// loses its data but not the copy: the task must not block on a pipe no
// one reads, nor die of SIGPIPE, because its log cannot be written.
func copyLog(r io.Reader, w *logWriter) {
	defer w.close()
	buf := make([]byte, 64<<10)
	var lastErr string
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if werr := w.write(buf[:n]); werr != nil && werr.Error() != lastErr {
				lastErr = werr.Error()
				fmt.Fprintf(os.Stderr, "drover-agent log shim: %v (output lost until it can write again)\n", werr)
			} else if werr == nil {
				lastErr = ""
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				fmt.Fprintf(os.Stderr, "drover-agent log shim: read %s: %v\n", w.name, err)
			}
			return
		}
	}
}

// logWriter appends to a log file that never holds more than max bytes.
type logWriter struct {
	name string
	max  int64
	f    *os.File
	size int64
}

// write appends b. The file is filled up to max bytes; before a write
// to a full file, it is renamed to name.1 (replacing the older one) and a
// new one is started. So neither file ever holds more than max bytes, and
// a reader that holds the old file reads it to its end, then goes on with
// the new one (tasklogs).
func (w *logWriter) write(b []byte) error {
	for len(b) > 0 {
		if w.f == nil {
			f, err := os.OpenFile(w.name, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
			if err != nil {
				return fmt.Errorf("open log: %w", err)
			}
			fi, err := f.Stat()
			if err != nil {
				f.Close()
				return fmt.Errorf("open log: %w", err)
			}
			w.f, w.size = f, fi.Size()
		}
		if w.size >= w.max {
			w.close()
			if err := os.Rename(w.name, w.name+".1"); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("rotate log: %w", err)
			}
			continue
		}
		n := min(int64(len(b)), w.max-w.size)
		k, err := w.f.Write(b[:n])
		w.size += int64(k)
		b = b[k:]
		if err != nil {
			return fmt.Errorf("write log: %w", err)
		}
	}
	return nil
}

func (w *logWriter) close() {
	if w.f != nil {
		w.f.Close()
		w.f = nil
	}
}

// startLogShim starts the log shim of an attempt whose logs are in dir,
// and returns it with the write ends of the two pipes it reads, for the
// task (the caller closes them once the task has started). The shim runs
// as the agent's user, in its own session and outside the attempt's
// group and cgroup: the task can neither signal nor trace it, and killing
// the attempt's processes does not kill it before it has written what
// they wrote.
func (d *Driver) startLogShim(dir string) (cmd *exec.Cmd, stdout, stderr *os.File, err error) {
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("log pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, nil, nil, fmt.Errorf("log pipe: %w", err)
	}
	defer outR.Close()
	defer errR.Close()
	cmd = &exec.Cmd{
		// The agent's own binary, even if an upgrade replaced the file.
		Path:        "/proc/self/exe",
		Args:        []string{"drover-agent", LogShimArg, strconv.FormatInt(d.opts.MaxLogBytes, 10), dir},
		Env:         []string{"GOMAXPROCS=1"},
		Dir:         "/",
		ExtraFiles:  []*os.File{outR, errR}, // 3, 4
		Stderr:      os.Stderr,
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if err := cmd.Start(); err != nil {
		outW.Close()
		errW.Close()
		return nil, nil, nil, fmt.Errorf("start the log shim: %w", err)
	}
	return cmd, outW, errW, nil
}
