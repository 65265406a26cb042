package inplacectl

import (
	"testing"

	"github.com/drover-fleet/drover/pkg/ctrlkit/gen"
)

// The generated files must be what the generator writes from the .ctrlkit
// files today.
func TestGeneratedCodeIsUpToDate(t *testing.T) {
	for _, name := range []string{"plan", "pool", "node", "nhc", "topology", "request"} {
		cmd := gen.Command{Getenv: func(string) string { return "inplacectl" }}
		if err := cmd.Run([]string{"check", "-o", "zz_generated." + name + ".ctrlkit.go", name + ".ctrlkit"}); err != nil {
			t.Errorf("%s.ctrlkit: %v", name, err)
		}
	}
}
