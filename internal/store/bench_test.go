package store

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkApplyDispatches times the agent's commit of a run of 256
// dispatched items (the hub's largest Dispatch envelope), per item: the
// cost that bounds how fast an agent takes a burst.
func BenchmarkApplyDispatches(b *testing.B) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(b.TempDir(), "a.db"), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	spec := make([]byte, 200)
	rev := uint64(0)
	start := time.Now()
	for b.Loop() {
		ws := make([]Work, 256)
		for j := range ws {
			rev++
			ws[j] = Work{UID: fmt.Sprintf("u-%09d", rev), Type: "noop", Spec: spec, Revision: rev}
		}
		if _, err := s.ApplyDispatches(ctx, ws); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N*256), "ns/item")
}
