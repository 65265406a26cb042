package taskexec

import (
	"testing"

	"github.com/drover-fleet/drover/internal/testkit"
)

// TestMain fails the package's tests if they leave goroutines running.
func TestMain(m *testing.M) { testkit.VerifyNoLeaks(m) }
