package taskexec

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// stat is what the driver reads from /proc/<pid>/stat.
type stat struct {
	state      byte   // field 3: R, S, D, Z, X, ...
	pgid       int    // field 5
	startTicks uint64 // field 22: start time in clock ticks after boot
}

// readStat reads /proc/<pid>/stat. The command name (field 2) may hold
// spaces and parentheses, so fields are counted after its last ')'.
func readStat(pid int) (stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return stat{}, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return stat{}, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := bytes.Fields(b[i+1:]) // f[0] is field 3
	if len(f) < 20 {
		return stat{}, fmt.Errorf("/proc/%d/stat: %d fields, want at least 22", pid, len(f)+2)
	}
	pgid, err1 := strconv.Atoi(string(f[2]))
	ticks, err2 := strconv.ParseUint(string(f[19]), 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return stat{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return stat{state: f[0][0], pgid: pgid, startTicks: ticks}, nil
}

// isChild reports whether pid is a child of this process (waitid answers
// ECHILD for any other). It neither waits nor reaps.
func isChild(pid int) bool {
	var si unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, pid, &si, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		return err == nil
	}
}
