package inplace

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	updatev1 "github.com/drover-fleet/drover/api/update/v1alpha1"
)

func window(schedule string, d time.Duration, tz string) updatev1.MaintenanceWindow {
	return updatev1.MaintenanceWindow{Schedule: schedule, Duration: metav1.Duration{Duration: d}, TimeZone: tz}
}

func TestWindows(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	nightly := window("0 2 * * *", 2*time.Hour, "")
	tests := []struct {
		name      string
		ws        []updatev1.MaintenanceWindow
		now       string
		open      bool
		until     string
		next      string
		errSubstr string
	}{
		{"no windows: always open", nil, "2026-11-28T12:00:00Z", true, "", "", ""},
		{"inside the nightly window", []updatev1.MaintenanceWindow{nightly}, "2026-11-28T03:15:00Z", true, "2026-11-28T04:00:00Z", "", ""},
		{"at the exact opening minute", []updatev1.MaintenanceWindow{nightly}, "2026-11-28T02:00:00Z", true, "2026-11-28T04:00:00Z", "", ""},
		{"closed at the end", []updatev1.MaintenanceWindow{nightly}, "2026-11-28T04:00:00Z", false, "", "2026-11-29T02:00:00Z", ""},
		{"before it opens", []updatev1.MaintenanceWindow{nightly}, "2026-11-28T01:59:00Z", false, "", "2026-11-28T02:00:00Z", ""},
		{"a window across midnight", []updatev1.MaintenanceWindow{window("0 23 * * *", 3*time.Hour, "")}, "2026-11-29T01:30:00Z", true, "2026-11-29T02:00:00Z", "", ""},
		// 02:00 in Berlin is 01:00 UTC in November (CET, UTC+1).
		{"a time zone", []updatev1.MaintenanceWindow{window("0 2 * * *", time.Hour, "Europe/Berlin")}, "2026-11-28T01:30:00Z", true, "2026-11-28T02:00:00Z", "", ""},
		{"weekdays only: Saturday waits for Monday", []updatev1.MaintenanceWindow{window("0 2 * * 1-5", time.Hour, "")}, "2026-11-28T02:30:00Z", false, "", "2026-11-30T02:00:00Z", ""},
		{"two windows: the earliest next", []updatev1.MaintenanceWindow{nightly, window("0 12 * * *", time.Hour, "")}, "2026-11-28T08:00:00Z", false, "", "2026-11-28T12:00:00Z", ""},
		{"a bad schedule", []updatev1.MaintenanceWindow{window("0 25 * * *", time.Hour, "")}, "2026-11-28T08:00:00Z", false, "", "", "maintenanceWindows[0]: schedule"},
		{"a bad time zone", []updatev1.MaintenanceWindow{window("0 2 * * *", time.Hour, "Mars/Olympus")}, "2026-11-28T08:00:00Z", false, "", "", "not an IANA time zone"},
		{"a zero duration", []updatev1.MaintenanceWindow{window("0 2 * * *", 0, "")}, "2026-11-28T08:00:00Z", false, "", "", "must be positive"},
		{"a time zone in the schedule", []updatev1.MaintenanceWindow{window("CRON_TZ=UTC 0 2 * * *", time.Hour, "")}, "2026-11-28T08:00:00Z", false, "", "", "in timeZone"},
		{"a window that never opens", []updatev1.MaintenanceWindow{window("0 2 30 2 *", time.Hour, "")}, "2026-11-28T08:00:00Z", false, "", "", "ever opens"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := Windows(tt.ws, at(tt.now))
			if tt.errSubstr != "" {
				if st.Err == nil || !strings.Contains(st.Err.Error(), tt.errSubstr) {
					t.Fatalf("Windows() error = %v, want one containing %q", st.Err, tt.errSubstr)
				}
				if reason, _, _ := st.Blocked(at(tt.now)); reason != updatev1.ReasonInvalidWindow {
					t.Errorf("Blocked() reason = %q, want %s", reason, updatev1.ReasonInvalidWindow)
				}
				return
			}
			if st.Err != nil {
				t.Fatalf("Windows() error = %v", st.Err)
			}
			if st.Open != tt.open {
				t.Fatalf("Open = %v, want %v", st.Open, tt.open)
			}
			if tt.until != "" && !st.Until.Equal(at(tt.until)) {
				t.Errorf("Until = %s, want %s", st.Until.UTC(), tt.until)
			}
			if tt.next != "" && !st.Next.Equal(at(tt.next)) {
				t.Errorf("Next = %s, want %s", st.Next.UTC(), tt.next)
			}
			reason, why, after := st.Blocked(at(tt.now))
			if tt.open != (reason == "") {
				t.Errorf("Blocked() = %q, %q while open = %v", reason, why, tt.open)
			}
			if !tt.open && (reason != updatev1.ReasonOutsideWindow || after != at(tt.next).Sub(at(tt.now)) || !strings.Contains(why, tt.next)) {
				t.Errorf("Blocked() = %q, %q, %s; want %s naming %s", reason, why, after, updatev1.ReasonOutsideWindow, tt.next)
			}
		})
	}
}

func TestRolloutRate(t *testing.T) {
	r := &updatev1.Rollout{BaseRatePerMinute: 2, IncrementFactor: "2", SucceededPerIncrease: 4, MaximumPerMinute: 10}
	for _, tt := range []struct{ succeeded, want int }{{0, 2}, {3, 2}, {4, 4}, {8, 8}, {12, 10}, {100, 10}} {
		if got := RolloutRate(r, tt.succeeded); got != tt.want {
			t.Errorf("RolloutRate(after %d) = %d, want %d", tt.succeeded, got, tt.want)
		}
	}
	// Defaults: factor 2, increase after baseRatePerMinute successes, no cap.
	d := &updatev1.Rollout{BaseRatePerMinute: 3}
	if got := RolloutRate(d, 6); got != 12 {
		t.Errorf("RolloutRate(defaults, after 6) = %d, want 12", got)
	}
	if got := RolloutRate(&updatev1.Rollout{BaseRatePerMinute: 2, IncrementFactor: "1.5", SucceededPerIncrease: 1}, 2); got != 4 {
		t.Errorf("RolloutRate(1.5, after 2) = %d, want 4 (2×1.5² = 4.5, rounded down)", got)
	}
}

func TestRolloutAllowance(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	r := &updatev1.Rollout{BaseRatePerMinute: 2}
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	tests := []struct {
		name    string
		started []time.Time
		allowed int
		after   time.Duration
	}{
		{"nothing started", nil, 2, 0},
		{"one in the last minute", []time.Time{ago(10 * time.Second)}, 1, 0},
		{"two in the last minute: wait for the oldest to leave it", []time.Time{ago(10 * time.Second), ago(45 * time.Second)}, 0, 15 * time.Second},
		{"older starts do not count", []time.Time{ago(2 * time.Minute), ago(61 * time.Second)}, 2, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			allowed, rate, after := RolloutAllowance(r, now, tt.started, 0)
			if allowed != tt.allowed || after != tt.after || rate != 2 {
				t.Errorf("RolloutAllowance() = %d, %d, %s; want %d, 2, %s", allowed, rate, after, tt.allowed, tt.after)
			}
		})
	}
}

func TestOverAbortThreshold(t *testing.T) {
	th := &updatev1.Rollout{BaseRatePerMinute: 1, AbortThresholdPercent: 30, MinEndedForAbort: 5}
	tests := []struct {
		name          string
		r             *updatev1.Rollout
		failed, ended int
		stop          bool
	}{
		{"no failure", th, 0, 10, false},
		{"without a rollout the first failure stops", nil, 1, 10, true},
		{"a rollout without threshold: the first failure stops", &updatev1.Rollout{BaseRatePerMinute: 1}, 1, 10, true},
		{"below the minimum ended", th, 2, 4, false},
		{"under the threshold", th, 2, 10, false},
		{"at the threshold", th, 3, 10, true},
		{"over it", th, 4, 5, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if stop, why := OverAbortThreshold(tt.r, tt.failed, tt.ended); stop != tt.stop || (stop && tt.r != nil && tt.r.AbortThresholdPercent > 0 && !strings.Contains(why, "abort threshold")) {
				t.Errorf("OverAbortThreshold(%d of %d) = %v, %q; want %v", tt.failed, tt.ended, stop, why, tt.stop)
			}
		})
	}
}
