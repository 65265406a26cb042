package protocol

import (
	"bufio"
	"flag"
	"fmt"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"testing/quick"
)

var update = flag.Bool("update", false, "rewrite testdata/tracker/*.txt with the verdicts the Tracker gives now; read the diff before committing it")

func TestTrackerStep(t *testing.T) {
	tests := []struct {
		name     string
		last     uint64
		rev      uint64
		want     Verdict
		wantLast uint64
	}{
		{"the next revision is applied", 5, 6, Apply, 6},
		{"the first revision of a new node is applied", 0, 1, Apply, 1},
		{"the same revision is a duplicate", 5, 5, Duplicate, 5},
		{"revision 0 on a new node is a duplicate", 0, 0, Duplicate, 0},
		{"an older revision is stale", 5, 4, Stale, 5},
		{"revision 0 after some is stale", 5, 0, Stale, 5},
		{"skipping one revision is a gap", 5, 7, Gap, 5},
		{"a far-ahead revision is a gap", 5, math.MaxUint64, Gap, 5},
		{"the last representable revision is applied", math.MaxUint64 - 1, math.MaxUint64, Apply, math.MaxUint64},
		{"nothing follows the last representable revision", math.MaxUint64, 0, Stale, math.MaxUint64},
		{"the largest revision after itself is a duplicate", math.MaxUint64, math.MaxUint64, Duplicate, math.MaxUint64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTracker(tt.last)
			if got := tr.Step(tt.rev); got != tt.want {
				t.Errorf("Step(rev %d) after %d = %v, want %v", tt.rev, tt.last, got, tt.want)
			}
			if got := tr.Last(); got != tt.wantLast {
				t.Errorf("Last() after Step(rev %d) after %d = %d, want %d", tt.rev, tt.last, got, tt.wantLast)
			}
		})
	}
}

func TestTrackerReset(t *testing.T) {
	tests := []struct {
		name     string
		last     uint64
		rev      uint64
		want     Verdict
		wantLast uint64
	}{
		{"a snapshot ahead of a gap is accepted", 5, 9, Apply, 9},
		{"a snapshot at the next revision is accepted", 5, 6, Apply, 6},
		{"a snapshot at the applied revision is a duplicate", 5, 5, Duplicate, 5},
		{"an older snapshot is stale", 5, 3, Stale, 5},
		{"a first snapshot on a new node is accepted", 0, 1, Apply, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTracker(tt.last)
			if got := tr.Reset(tt.rev); got != tt.want {
				t.Errorf("Reset(rev %d) after %d = %v, want %v", tt.rev, tt.last, got, tt.want)
			}
			if got := tr.Last(); got != tt.wantLast {
				t.Errorf("Last() after Reset(rev %d) after %d = %d, want %d", tt.rev, tt.last, got, tt.wantLast)
			}
		})
	}
}

func TestTheZeroTrackerIsAtRevisionZero(t *testing.T) {
	var tr Tracker
	if got := tr.Step(1); got != Apply {
		t.Errorf("Step(rev 1) on a zero Tracker = %v, want Apply", got)
	}
}

func TestVerdictString(t *testing.T) {
	for v, want := range map[Verdict]string{Apply: "Apply", Duplicate: "Duplicate", Stale: "Stale", Gap: "Gap", Verdict(9): "Verdict(9)"} {
		if got := v.String(); got != want {
			t.Errorf("Verdict(%d).String() = %q, want %q", int(v), got, want)
		}
	}
}

// dumbStep is the reference the Tracker is checked against: the seed's three
// rules spelled out over unbounded integers, so there is no overflow to think
// about.
func dumbStep(last *uint64, rev uint64, reset bool) Verdict {
	l, r := new(big.Int).SetUint64(*last), new(big.Int).SetUint64(rev)
	next := new(big.Int).Add(l, big.NewInt(1))
	switch {
	case r.Cmp(l) == 0:
		return Duplicate
	case r.Cmp(l) < 0:
		return Stale
	case reset || r.Cmp(next) == 0:
		*last = rev
		return Apply
	default:
		return Gap
	}
}

// TestTrackerMatchesTheDumbReference drives the Tracker and dumbStep with the
// same random streams (revisions near the current one, so that every verdict
// shows up, and occasional resets) and wants the same verdict at every step.
func TestTrackerMatchesTheDumbReference(t *testing.T) {
	type op struct {
		Delta int8
		Reset bool
	}
	check := func(start uint64, ops []op) bool {
		if start%4 == 0 {
			start = math.MaxUint64 - start%64 // exercise the top of the range too
		}
		tr, dumb := NewTracker(start), start
		for i, o := range ops {
			rev := tr.Last() + uint64(int64(o.Delta)%4) // wraps on purpose near the ends
			var got Verdict
			if o.Reset {
				got = tr.Reset(rev)
			} else {
				got = tr.Step(rev)
			}
			want := dumbStep(&dumb, rev, o.Reset)
			if got != want || tr.Last() != dumb {
				t.Logf("op %d from start %d: %s(rev %d) = %v (last %d), want %v (last %d)",
					i, start, map[bool]string{false: "Step", true: "Reset"}[o.Reset], rev, got, tr.Last(), want, dumb)
				return false
			}
		}
		return true
	}
	if err := quick.Check(check, &quick.Config{MaxCount: 20000}); err != nil {
		t.Error(err)
	}
}

// TestTrackerTraces replays the scripts in testdata/tracker. Each line is a
// command and, after "->", the verdict and Last() it must produce:
//
//	new 5                  start a tracker at revision 5
//	step 6 -> Apply last=6
//	reset 9 -> Apply last=9
//
// With -update the expectations are rewritten from what the Tracker does now.
func TestTrackerTraces(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "tracker", "*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no trace scripts in testdata/tracker: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			out, mismatches := runTrace(t, string(b))
			if *update {
				if err := os.WriteFile(file, []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			for _, m := range mismatches {
				t.Errorf("%s:%s", file, m)
			}
		})
	}
}

// runTrace executes a script and returns it with the actual results, plus a
// message for each line whose expectation differs.
func runTrace(t *testing.T, script string) (string, []string) {
	var (
		out        strings.Builder
		mismatches []string
		tr         = NewTracker(0)
	)
	sc := bufio.NewScanner(strings.NewReader(script))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		cmd, want, _ := strings.Cut(line, "->")
		cmd, want = strings.TrimSpace(cmd), strings.TrimSpace(want)
		if cmd == "" || strings.HasPrefix(cmd, "#") {
			out.WriteString(line + "\n")
			continue
		}
		fields := strings.Fields(cmd)
		if len(fields) != 2 {
			t.Fatalf("line %d: %q: want \"<new|step|reset> <rev>\"", n, cmd)
		}
		rev, err := strconv.ParseUint(fields[1], 10, 64)
		if err != nil {
			t.Fatalf("line %d: %q: %v", n, cmd, err)
		}
		var got string
		switch fields[0] {
		case "new":
			tr = NewTracker(rev)
			out.WriteString(cmd + "\n")
			continue
		case "step":
			got = fmt.Sprintf("%v last=%d", tr.Step(rev), tr.Last())
		case "reset":
			got = fmt.Sprintf("%v last=%d", tr.Reset(rev), tr.Last())
		default:
			t.Fatalf("line %d: unknown command %q", n, fields[0])
		}
		if got != want {
			mismatches = append(mismatches, fmt.Sprintf("%d: %s -> %s, want %s", n, cmd, got, want))
		}
		fmt.Fprintf(&out, "%-12s -> %s\n", cmd, got)
	}
	return out.String(), mismatches
}
