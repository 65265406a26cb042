package cgroup

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// RunShim is the v1 start shim: args (after ShimArg) are the number n of
// cgroup dirs, the n dirs, the program's path and its argv. It writes its
// own pid into each dir's cgroup.procs, then execs the program with the
// environment it was given: the program starts inside the cgroups, so
// nothing it forks starts outside them. It returns only on failure, with
// the exit code (127, as a shell gives for a program it cannot run).
func RunShim(args []string) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "drover-agent cgroup shim: "+format+"\n", a...)
		return 127
	}
	if len(args) < 1 {
		return fail("no arguments")
	}
	n, err := strconv.Atoi(args[0])
	if err != nil || n < 1 || len(args) < 1+n+2 {
		return fail("want <n> <n cgroup dirs> <path> <argv...>, got %q", args)
	}
	dirs, path, argv := args[1:1+n], args[1+n], args[2+n:]
	pid := strconv.Itoa(os.Getpid())
	for _, d := range dirs {
		// cgroup.procs moves every thread of the shim (the Go runtime's too).
		if err := writeFile(filepath.Join(d, "cgroup.procs"), pid); err != nil {
			return fail("enter cgroup: %v", err)
		}
	}
	err = syscall.Exec(path, argv, os.Environ())
	return fail("exec %s: %v", path, err)
}
