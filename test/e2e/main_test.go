package e2e

import (
	"os"
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

func TestMain(m *testing.M) {
	// The tests' API clients log nothing; process output is what matters.
	ctrllog.SetLogger(logr.Discard())
	os.Exit(m.Run())
}
