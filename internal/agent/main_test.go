package agent

import (
	"os"
	"testing"

	"github.com/drover-fleet/drover/internal/agent/taskexec"
	"github.com/drover-fleet/drover/internal/testkit"
)

// TestMain fails the package's tests if they leave goroutines running. The
// test binary also stands in for drover-agent as the tasks' log shim.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == taskexec.LogShimArg {
		os.Exit(taskexec.RunLogShim(os.Args[2:]))
	}
	testkit.VerifyNoLeaks(m)
}
