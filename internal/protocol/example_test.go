package protocol_test

import (
	"errors"
	"fmt"

	"github.com/drover-fleet/drover/internal/protocol"
	"github.com/drover-fleet/drover/internal/protocol/agentv1"
)

// The agent restarts with revision 5 saved in its DB and receives hub
// messages 6, 6 again, 9 (7 and 8 were lost) and then the full-sync Snapshot
// at 9 that its FullSyncRequest asked for.
func ExampleTracker() {
	t := protocol.NewTracker(5)
	for _, rev := range []uint64{6, 6, 4, 9} {
		fmt.Printf("step %d: %v (last %d)\n", rev, t.Step(rev), t.Last())
	}
	fmt.Printf("reset 9: %v (last %d)\n", t.Reset(9), t.Last())
	// Output:
	// step 6: Apply (last 6)
	// step 6: Duplicate (last 6)
	// step 4: Stale (last 6)
	// step 9: Gap (last 6)
	// reset 9: Apply (last 9)
}

func ExampleDecode() {
	e := protocol.NewDispatch("edge-1", 7, &agentv1.WorkItem{Uid: "job-42", Type: "task", Spec: []byte(`{}`)})
	b, err := protocol.Encode(e)
	if err != nil {
		panic(err)
	}
	got, err := protocol.Decode(b)
	fmt.Println(got.GetKind(), got.GetRevision(), got.GetDispatch().GetItem().GetUid(), err)

	e.Id = "abc"
	e.Kind = agentv1.Kind_KIND_HEARTBEAT
	_, err = protocol.Encode(e)
	fmt.Println(errors.Is(err, protocol.ErrMalformed))
	fmt.Println(err)
	// Output:
	// KIND_DISPATCH 7 job-42 <nil>
	// true
	// encode envelope: envelope "abc": kind KIND_HEARTBEAT but payload is dispatch: malformed envelope
}
