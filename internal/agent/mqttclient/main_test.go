package mqttclient

import (
	"testing"

	"github.com/drover-fleet/drover/internal/testkit"
)

func TestMain(m *testing.M) { testkit.VerifyNoLeaks(m, testkit.IgnorePahoBackoff()...) }
