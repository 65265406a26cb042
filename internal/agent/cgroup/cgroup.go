package cgroup

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// ShimArg is the hidden first argument with which drover-agent runs as the
// v1 start shim (see the package doc). A binary that starts attempts on v1
// calls RunShim when its first argument is ShimArg.
const ShimArg = "__drover-cgroup-exec"

// Modes of a Manager.
const (
	ModeV2     = "v2"
	ModeV1     = "v1"
	ModeHybrid = "hybrid"
)

// ErrUnavailable is wrapped by New when the node cannot contain attempts in
// cgroups (no cgroup fs mounted, a controller missing, no permission).
var ErrUnavailable = errors.New("cgroups unavailable")

// Limits of one attempt; zero means none.
type Limits struct {
	// MemoryBytes is the memory limit; the kernel OOM-kills over it.
	MemoryBytes int64
	// CPUMillis is the CPU quota in thousandths of a CPU (1000 = one CPU).
	CPUMillis int64
	// Pids bounds the number of processes and threads.
	Pids int64
}

// Stats is what an attempt's cgroup has used.
type Stats struct {
	CPU         time.Duration // CPU time used, all processes
	MemoryBytes int64         // memory in use now
	MemoryPeak  int64         // most memory used (0 when the kernel does not tell)
}

// cpuPeriod is the CFS period of a CPU quota, in microseconds (the
// kernel's default).
const cpuPeriod = 100000

// quota is the CFS quota for millis of CPU in a cpuPeriod (at least the
// kernel's minimum of 1ms).
func quota(millis int64) int64 {
	return max(millis*cpuPeriod/1000, 1000)
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._-]{0,200}$`)

// interfacePrefixes are what the names of cgroup files start with: a
// child named like one would clash with (or be) a file.
var interfacePrefixes = []string{"cgroup", "memory", "cpu", "cpuacct", "cpuset", "io", "pids", "freezer", "hugetlb",
	"rdma", "misc", "blkio", "devices", "net_cls", "net_prio", "perf_event", "notify_on_release", "release_agent", "tasks"}

// ValidName reports why name cannot name an attempt's cgroup (nil if it can).
func ValidName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("cgroup name %q: want 1-201 letters, digits, '.', '_' or '-', not starting with '.'", name)
	}
	first, _, _ := strings.Cut(name, ".")
	for _, p := range interfacePrefixes {
		if first == p {
			return fmt.Errorf("cgroup name %q: it would clash with the cgroup files named %s.*", name, p)
		}
	}
	return nil
}
