package cgroup

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// RunShim is the v1 start shim: args (after ShimArg) are the number n of
// cgroup dirs, the n dirs, the user ("uid:gid", or "-" to stay who it is),
// the program's path and its argv. It writes its own pid into each dir's
// cgroup.procs, drops to the user (no supplementary groups), then execs
// the program with the environment it was given: the program starts
// inside the cgroups, so nothing it forks starts outside them. It returns
// only on failure, with the exit code (127, as a shell gives for a program
// it cannot run).
func RunShim(args []string) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "drover-agent cgroup shim: "+format+"\n", a...)
		return 127
	}
	if len(args) < 1 {
		return fail("no arguments")
	}
	n, err := strconv.Atoi(args[0])
	if err != nil || n < 1 || len(args) < 1+n+3 {
		return fail("want <n> <n cgroup dirs> <uid:gid or -> <path> <argv...>, got %q", args)
	}
	dirs, user, path, argv := args[1:1+n], args[1+n], args[2+n], args[3+n:]
	uid, gid, switchUser, err := parseUser(user)
	if err != nil {
		return fail("%v", err)
	}
	pid := strconv.Itoa(os.Getpid())
	for _, d := range dirs {
		// cgroup.procs moves every thread of the shim (the Go runtime's too).
		if err := writeFile(filepath.Join(d, "cgroup.procs"), pid); err != nil {
			return fail("enter cgroup: %v", err)
		}
	}
	if switchUser {
		// Go applies these to every thread of the process (Linux, Go 1.16+);
		// the group first: once the uid is dropped it could not change.
		if err := syscall.Setgroups(nil); err != nil {
			return fail("clear supplementary groups: %v", err)
		}
		if err := syscall.Setgid(gid); err != nil {
			return fail("set gid %d: %v", gid, err)
		}
		if err := syscall.Setuid(uid); err != nil {
			return fail("set uid %d: %v", uid, err)
		}
	}
	err = syscall.Exec(path, argv, os.Environ())
	return fail("exec %s: %v", path, err)
}

// parseUser reads the shim's "uid:gid" argument; "-" is no switch.
func parseUser(s string) (uid, gid int, ok bool, err error) {
	if s == "-" {
		return 0, 0, false, nil
	}
	u, g, found := strings.Cut(s, ":")
	uid64, err1 := strconv.ParseUint(u, 10, 32)
	gid64, err2 := strconv.ParseUint(g, 10, 32)
	if !found || err1 != nil || err2 != nil {
		return 0, 0, false, fmt.Errorf("user %q: want uid:gid or -", s)
	}
	return int(uid64), int(gid64), true, nil
}
