package testenv

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

// runID names the current `go test` invocation: the PID and start time of
// the parent go command, which runs every test binary of one `go test ./...`
// as its child. It is "" when the parent is not the go command (a test
// binary run by hand, or by a debugger), so that Binary then always asks
// `go build`.
func runID() string {
	ppid := os.Getppid()
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", ppid))
	if err != nil || strings.TrimSpace(string(comm)) != "go" {
		return ""
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", ppid))
	if err != nil {
		return ""
	}
	// Fields after the command name, which is in parentheses and may hold
	// spaces; the start time is field 22 of the whole line.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return ""
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 20 {
		return ""
	}
	return fmt.Sprintf("go-test pid=%d start=%s", ppid, fields[19])
}

// childAttrs puts the control plane in its own process group and has the
// kernel send it SIGTERM if the test process dies (a test timeout panics and
// exits without running cleanups), so no apiserver outlives its test run.
func childAttrs() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
