package benchproc

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// LastToken finds the token ("id.secret") in `drover token create` output.
func LastToken(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l != "" && !strings.ContainsAny(l, " \t=") && strings.Count(l, ".") == 1 {
			return l
		}
	}
	return ""
}

// Machine describes the host (CPU model, cores, RAM, OS/arch) and returns
// the CPU model on its own too.
func Machine() (desc, model string) {
	model = "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	memGiB := 0.0
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				var kb float64
				fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), &kb)
				memGiB = kb / (1 << 20)
			}
		}
	}
	return fmt.Sprintf("%s, %d cores, %.0f GiB RAM, %s/%s", model, runtime.NumCPU(), memGiB, runtime.GOOS, runtime.GOARCH), model
}
