package store_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/drover-fleet/drover/internal/store"
)

// A Dispatch delivered twice starts its work once, and the hub revision moves
// with it in the same transaction.
func ExampleStore_ApplyDispatch() {
	dir, err := os.MkdirTemp("", "drover-store-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	s, err := store.Open(ctx, filepath.Join(dir, "agent.db"), store.Options{})
	if err != nil {
		panic(err)
	}
	defer s.Close()

	for range 2 {
		created, err := s.ApplyDispatch(ctx, 1, store.Work{UID: "job-42", Type: "task", Spec: []byte(`{}`)})
		fmt.Println("created:", created, err)
	}
	rev, _ := s.HubRevision(ctx)
	fmt.Println("hub revision:", rev)
	// Output:
	// created: true <nil>
	// created: false <nil>
	// hub revision: 1
}
