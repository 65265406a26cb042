package ctrlkit

import (
	"slices"
	"testing"
)

func TestSequentialStopsAtTheFirstInterruption(t *testing.T) {
	rows := []struct {
		name     string
		kinds    []kind
		want     string
		wantRuns []int
		block    bool
	}{
		{"an empty sequence asks for nothing", nil, "noRequeue", []int{}, false},
		{"successes run to the end", []kind{kNone, kNone}, "noRequeue", []int{1, 1}, false},
		{"a requeue stops it", []kind{kNone, kNow, kAfter1}, "requeue", []int{1, 1, 0}, false},
		{"a requeue-after stops it, shorter ones later are not seen", []kind{kAfter2, kAfter1}, "after 2s", []int{1, 0}, false},
		{"an error stops it, errors are not aggregated", []kind{kErr1, kErr2}, "error: error1", []int{1, 0}, false},
		{"an exit stops it", []kind{kExit, kErr1}, "exit", []int{1, 0}, false},
		{"a panic stops it and propagates", []kind{kNone, kPanic, kNone}, "panic: boom", []int{1, 1, 0}, false},
		{"a slow step is waited for", []kind{kSlow, kNow}, "requeue", []int{1, 1}, true},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			cs, as := children(t, row.kinds...)
			a := Sequential(as...)
			got, _ := outcomeAsync(t, a, row.block, cs)
			if got != row.want {
				t.Errorf("%s = %q, want %q", a.Description(), got, row.want)
			}
			if got := runs(cs); !slices.Equal(got, row.wantRuns) {
				t.Errorf("%s ran children %v times, want %v", a.Description(), got, row.wantRuns)
			}
		})
	}
}

func TestSequentialPanicIsNotWrapped(t *testing.T) {
	_, as := children(t, kPanic)
	defer func() {
		if v := recover(); v != "boom" {
			t.Errorf("Sequential(panic) panicked with %#v, want the original value", v)
		}
	}()
	_, _ = Sequential(as...).Run(t.Context())
}
