package protocol

import (
	"errors"
	"strconv"
)

// ErrRevisionGap is for callers that turn a Gap verdict into an error, e.g.
// fmt.Errorf("node %s: step rev %d after %d: %w", node, rev, last, ErrRevisionGap).
var ErrRevisionGap = errors.New("revision gap")

// Verdict is what a receiver does with a revisioned message.
type Verdict int

const (
	// Apply: rev == last+1. Apply the message and advance.
	Apply Verdict = iota
	// Duplicate: rev == last. Already applied; ack again, no effect.
	Duplicate
	// Stale: rev < last. Older than the applied state; discard.
	Stale
	// Gap: rev > last+1. A message was missed; request a full sync and do
	// not advance.
	Gap
)

// String returns the verdict's name, e.g. "Apply".
func (v Verdict) String() string {
	switch v {
	case Apply:
		return "Apply"
	case Duplicate:
		return "Duplicate"
	case Stale:
		return "Stale"
	case Gap:
		return "Gap"
	default:
		return "Verdict(" + strconv.Itoa(int(v)) + ")"
	}
}

// Tracker tracks one node's revision stream, following seed 002: a gap
// triggers a full sync, an older revision is discarded, the same revision is
// a duplicate.
//
// A Tracker is a plain value with no locking; the goroutine that owns the
// node's session owns its Tracker. The zero value is a tracker at revision 0.
type Tracker struct {
	last uint64
}

// NewTracker returns a tracker whose last applied revision is last, e.g. the
// revision the agent saved in its DB, or 0 for a brand-new node.
func NewTracker(last uint64) *Tracker {
	return &Tracker{last: last}
}

// Last returns the last applied revision.
func (t *Tracker) Last() uint64 { return t.last }

// Step classifies rev against the last applied revision. It advances Last()
// only when the verdict is Apply.
func (t *Tracker) Step(rev uint64) Verdict {
	v := classify(t.last, rev)
	if v == Apply {
		t.last = rev
	}
	return v
}

// Reset is for a full-sync message (a Snapshot or a NodeState) that carries
// the sender's whole state at rev. It is accepted when rev > Last(): Last()
// becomes rev and Reset returns Apply. Otherwise nothing changes and Reset
// returns Duplicate (rev == Last()) or Stale (rev < Last()). Reset never
// returns Gap: skipping revisions is what a full sync is for.
func (t *Tracker) Reset(rev uint64) Verdict {
	switch {
	case rev == t.last:
		return Duplicate
	case rev < t.last:
		return Stale
	default:
		t.last = rev
		return Apply
	}
}

// classify is the verdict of rev after last. It is written so that it cannot
// overflow: at last == MaxUint64 nothing can be applied any more.
func classify(last, rev uint64) Verdict {
	switch {
	case rev == last:
		return Duplicate
	case rev < last:
		return Stale
	case rev-last == 1:
		return Apply
	default:
		return Gap
	}
}
