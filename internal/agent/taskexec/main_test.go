package taskexec

import (
	"os"
	"testing"

	"github.com/drover-fleet/drover/internal/agent/cgroup"
	"github.com/drover-fleet/drover/internal/testkit"
)

// TestMain fails the package's tests if they leave goroutines running. The
// test binary also stands in for drover-agent as the v1 cgroup start shim,
// and the log shim, and for a memory hog (TestCgroupOOMKilled) and a task
// that attacks its log shim (TestTaskCannotTouchItsLogShim).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == cgroup.ShimArg {
		os.Exit(cgroup.RunShim(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == LogShimArg {
		os.Exit(RunLogShim(os.Args[2:]))
	}
	if os.Getenv(attackEnv) != "" {
		attack()
	}
	if os.Getenv(hogEnv) != "" {
		hog()
	}
	testkit.VerifyNoLeaks(m)
}
