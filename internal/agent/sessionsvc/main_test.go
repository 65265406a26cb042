package sessionsvc

import (
	"os"
	"testing"

	"github.com/drover-fleet/drover/internal/agent/cgroup"
	"github.com/drover-fleet/drover/internal/agent/taskexec"
	"github.com/drover-fleet/drover/internal/testkit"
)

// TestMain: the test binary also stands in for drover-agent as the v1
// cgroup start shim and the log shim (TestEchoSession runs instances).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == cgroup.ShimArg {
		os.Exit(cgroup.RunShim(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == taskexec.LogShimArg {
		os.Exit(taskexec.RunLogShim(os.Args[2:]))
	}
	testkit.VerifyNoLeaks(m)
}
